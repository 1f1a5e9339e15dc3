"""A folder that holds a finished tune is refused with advice that works when followed: it
said "delete the old tune.json", and the same command then met tune.png and trials/ ("not
from a finished tune", exit 2).  The line names every file of the old tune (and the command
that deletes them); the tune itself deletes nothing.  On fake trials."""
from __future__ import annotations

import subprocess

import pytest

from app.core.errors import UsageError
# fake: the trials that do not run, one fixture for every tune test file
from tests.unit.tuner.test_tune_output import fake, run_tune  # noqa: F401


def test_the_advice_for_a_folder_holding_a_tune_works_when_followed(tmp_path, fake):
    out = tmp_path / "tune dir"      # a space: the command must quote the paths
    run_tune(out)
    (out / "notes.txt").write_text("mine")
    with pytest.raises(UsageError) as err:
        run_tune(out)
    line = err.value.line()
    assert "tune.json, tune.png, trials/" in line, line
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == ["notes.txt", "trials", "tune.json",
                                                     "tune.png"]   # nothing deleted
    command = line.split("deleted first: ", 1)[1]
    subprocess.run(command, shell=True, check=True)
    doc = run_tune(out)
    assert doc["choice"]["batch_size"] == 16 and (out / "notes.txt").read_text() == "mine"
