"""The TFMP_ variables the project reads (app/core/variables.py): one list, kept whole by
grepping the files that read them, and a misspelled one named in one warning line, where
it was ignored without a word (a QA pass: TFMP_EPOCS=3 trained the default 5 epochs)."""
from __future__ import annotations

import re

import pytest

from tests.paths import ROOT
from tests.unit.helpers import run_app

# What reads TFMP_ variables: the image's start-up and build, and the package.
READERS = ("entrypoint.sh", "docker", "Dockerfile", "docker-compose.yml", "app")


def _names_used() -> set:
    """``grep -rhoE 'TFMP_[A-Z0-9_]+'`` over READERS."""
    names = set()
    for reader in READERS:
        path = ROOT / reader
        files = [path] if path.is_file() else [f for f in path.rglob("*") if f.is_file()
                                               and "__pycache__" not in f.parts]
        for f in files:
            names |= set(re.findall(r"TFMP_[A-Z0-9_]+", f.read_text(errors="replace")))
    return names


@pytest.mark.host_only(reason="the image ships neither entrypoint.sh nor docker/ beside tests/")
def test_every_tfmp_variable_the_project_reads_is_known():
    from app.core import variables

    used = _names_used()
    assert "TFMP_EPOCHS" in used and "TFMP_QUIET" in used   # the grep finds both kinds
    assert sorted(used - set(variables.KNOWN)) == [], "add them to OTHER_VARIABLES"
    # and the list names nothing gone (the settings' names are made from their flags)
    assert sorted(set(variables.OTHER_VARIABLES) - used) == []


def test_a_misspelled_variable_is_named_with_the_one_meant():
    from app.core.variables import misspellings

    environ = {"TFMP_EPOCS": "3", "TFMP_BATCHSIZE": "64", "TFMP_precision": "float32",
               "TFMP_EPOCHS": "2", "TFMP_QUIET": "1", "HOME": "/root",
               # a user's own variable, like none tfmp reads (the image's tests pass these)
               "TFMP_TEST_USER_VAR": "x", "TFMP_T_DOLLAR": "$HOME"}
    assert misspellings(environ) == [("TFMP_BATCHSIZE", "TFMP_BATCH_SIZE"),
                                     ("TFMP_EPOCS", "TFMP_EPOCHS"),
                                     ("TFMP_precision", "TFMP_PRECISION")]


def _warnings(stderr: str) -> list:
    return [line for line in stderr.splitlines() if line.startswith("warning: TFMP_")]


def test_tfmp_train_warns_of_a_misspelled_variable_and_trains(tmp_path):
    proc = run_app("train", "--dataset", "synthetic", "--max-train-samples", "64",
                   "--max-val-samples", "32", "--batch-size", "32", "--precision", "float32",
                   "--epochs", "1", "--progress", "lines", "--offline", "--no-save-model",
                   "--output", str(tmp_path / "run"), env={"TFMP_EPOCS": "3"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert _warnings(proc.stderr) == [
        "warning: TFMP_EPOCS is not a variable tfmp reads, so it is ignored; did you mean "
        "TFMP_EPOCHS?"]
    assert "done: 1 epoch(s)" in proc.stdout


def test_tfmp_env_warns_before_its_report():
    """``tfmp env`` lists the settings the environment gives: a misspelled one is none."""
    proc = run_app("env", env={"TFMP_PRECISON": "float32"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert _warnings(proc.stderr) == [
        "warning: TFMP_PRECISON is not a variable tfmp reads, so it is ignored; did you mean "
        "TFMP_PRECISION?"]


def test_the_api_warns_once_per_process(monkeypatch, capsys):
    """A notebook calls app.train again and again: the warning once, then not."""
    import app
    from app.core import variables
    from app.core.errors import UsageError

    monkeypatch.setattr(variables, "_warned", set())
    monkeypatch.setenv("TFMP_LEARNING_RAT", "0.1")
    for _ in range(2):
        with pytest.raises(UsageError):
            app.train(model="mlp", data="synthetic", max_train_samples=1.5)
    with pytest.raises(UsageError):
        app.check(model="mlp", no_such_keyword=1)
    assert _warnings(capsys.readouterr().err) == [
        "warning: TFMP_LEARNING_RAT is not a variable tfmp reads, so it is ignored; did you "
        "mean TFMP_LEARNING_RATE?"]
