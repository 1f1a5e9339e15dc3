"""The lines about --output and --resume in the words of what the user called: under
``app.train`` a QA pass got ``allowed: --resume to continue it, or a new --output`` for a
call that takes ``resume=True`` and ``output=...``.  ``app.core.settings.given_as`` says
which (its answer's ``keyword``); ``settings.spelled`` spells a setting by it.  Each line
in both forms: the command line's, in-process through ``app.cli.main``, and the API's."""
from __future__ import annotations

import json

import pytest

import app
from app.core import settings
from app.core.errors import UsageError

TINY = ["--model", "mlp", "--dataset", "synthetic", "--precision", "float32", "--epochs", "1",
        "--max-train-samples", "64", "--max-val-samples", "32", "--offline"]
API = settings.GivenAs(keyword=True)   # app.train's, nothing given


def _cli_line(capsys, *flags: str) -> str:
    """The one error line ``tfmp train`` prints, exit status 2."""
    from app.cli import main

    capsys.readouterr()
    assert main(["train", *TINY, *flags]) == 2
    [line] = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error:")]
    return line


def _api_line(**keywords) -> str:
    with pytest.raises(UsageError) as caught:
        app.train("mlp", "synthetic", precision="float32", epochs=1, max_train_samples=64,
                  max_val_samples=32, offline=True, **keywords)
    return caught.value.line()


def _finished_run(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.json").write_text(json.dumps({"status": "completed"}))
    return out


def test_spelled_in_both_forms():
    assert [settings.spelled(None, "resume"), settings.spelled(API, "resume")] == [
        "--resume", "resume=True"]
    assert [settings.spelled({}, "output", "DIR"), settings.spelled(API, "output", "DIR")] == [
        "--output DIR", "output=DIR"]
    assert settings.spelled(API, "output") == "output=..."
    assert settings.spelled(API, "save_model") == "save_model=False"   # --no-save-model
    assert settings.given_as({"epochs": 3}, {}, keyword=True).keyword
    assert not settings.given_as({"epochs": 3}, {}).keyword


def test_a_folder_holding_a_run(tmp_path, capsys):
    out = _finished_run(tmp_path)
    head = f"error: output directory {str(out)!r} already holds a run; allowed: "
    assert _cli_line(capsys, "--output", str(out)) == head + (
        "--resume to continue it, or a new --output")
    assert _api_line(output=str(out)) == head + "resume=True to continue it, or a new output=..."


def test_resume_without_output(capsys, monkeypatch):
    monkeypatch.delenv("TFMP_OUTPUT", raising=False)
    assert _cli_line(capsys, "--resume") == (
        "error: --resume needs --output (or TFMP_OUTPUT) naming the run to continue; allowed: "
        "--resume --output <folder of the interrupted run>")
    assert _api_line(resume=True) == (
        "error: resume=True needs output=... (or TFMP_OUTPUT) naming the run to continue; "
        "allowed: resume=True, output=<folder of the interrupted run>")


def test_resume_finding_no_checkpoint(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    where = repr(str(out / "checkpoints"))
    assert _cli_line(capsys, "--resume", "--output", str(out)) == (
        f"error: --resume found no checkpoint in {where}; allowed: --resume with the --output "
        "of a run that saved a checkpoint")
    assert _api_line(resume=True, output=str(out)) == (
        f"error: resume=True found no checkpoint in {where}; allowed: resume=True with the "
        "output=... of a run that saved a checkpoint")


def test_a_setting_given_by_its_variable_is_named_by_it(tmp_path, capsys, monkeypatch):
    """TFMP_RESUME=1 in a Compose file: the line said --resume, which nobody typed."""
    said = settings.given_as({"output": "r"}, {"TFMP_RESUME": "1", "TFMP_OUTPUT": "x"})
    assert settings.spelled(said, "resume") == "TFMP_RESUME"
    assert settings.spelled(said, "output", "DIR") == "--output DIR"   # the flag won
    assert settings.spelled(settings.given_as({}, {"TFMP_OUTPUT": "x"}), "output",
                            "DIR") == "TFMP_OUTPUT=DIR"
    out = tmp_path / "run"
    out.mkdir()
    monkeypatch.setenv("TFMP_RESUME", "1")
    assert _cli_line(capsys, "--output", str(out)) == (
        f"error: TFMP_RESUME found no checkpoint in {str(out / 'checkpoints')!r}; allowed: "
        "TFMP_RESUME with the --output of a run that saved a checkpoint")


def test_the_resume_checks_name_the_keywords(tmp_path):
    """The lines of app/training/resuming.py, app/run_folder/lock.py and checkpoints.py:
    given app.train's ``said``, not one flag; without it, the flags as before."""
    from app.run_folder.checkpoints import no_checkpoint
    from app.run_folder.lock import LockUnavailable, OutputInUse
    from app.training.resuming import (check_holds_no_run, read_previous_metrics,
                                       resumed_precision)
    from app.precision.policy import PrecisionDecision

    out = _finished_run(tmp_path)
    (out / "metrics.json").write_text(json.dumps({"status": "failed"}))
    lines = {}
    for form, said in (("cli", None), ("api", API)):
        with pytest.raises(UsageError) as failed:
            check_holds_no_run(str(out), said)
        with pytest.raises(UsageError) as missing:
            read_previous_metrics(str(tmp_path), said=said)
        with pytest.raises(UsageError) as other:
            resumed_precision(PrecisionDecision("float32", "asked", requested="float32"),
                              {"precision": {"policy": "mixed_float16"}}, "r", None, said)
        lines[form] = [failed.value.line(), missing.value.line(), other.value.line(),
                       OutputInUse("r", {}, said).line(),
                       LockUnavailable("r", "r/.lock", OSError(37, "x"), said).line(),
                       no_checkpoint("r/checkpoints", said).line()]
    text = "\n".join(lines["api"])
    assert "--" not in text, text
    for words in ("allowed: a new output=..., or remove that folder",
                  "error: resume=True: ", "allowed: restore it from a copy, or start a new "
                  "output=...", "precision=float32 would continue it",
                  "allowed: precision=mixed_float16 or auto",
                  "allowed: another output=..., wait", "let resume=True continue it",
                  "allowed: an output=... on a file system"):
        assert words in text, (words, text)
    cli = "\n".join(lines["cli"])
    for words in ("allowed: a new --output, or remove that folder", "error: --resume: ",
                  "start a new --output", "--precision float32 would continue it",
                  "allowed: another --output, wait", "let --resume continue it",
                  "allowed: an --output on a file system"):
        assert words in cli, (words, cli)
