"""--output into a folder of the user's own: a run never replaces what it did not write.
Saving the model replaces `model/` whole, so a project folder holding a Python package
named `model` lost it (found by a QA pass: exit 0, `model/__init__.py` gone)."""
from __future__ import annotations

import os

from tests.unit.helpers import ONCE_IN_THE_IMAGE, error_lines, run_app

ARGS = ["train", "--dataset", "synthetic", "--max-train-samples", "128", "--max-val-samples",
        "64", "--batch-size", "32", "--precision", "float32", "--progress", "lines",
        "--offline", "--epochs", "1"]


def _tree(folder):
    return sorted(os.path.relpath(os.path.join(r, n), folder)
                  for r, ds, fs in os.walk(folder) for n in ds + fs)


@ONCE_IN_THE_IMAGE
def test_a_folder_holding_a_model_package_is_refused_and_kept(tmp_path):
    project = tmp_path / "proj"
    (project / "model").mkdir(parents=True)
    (project / "model" / "__init__.py").write_text("precious = True\n")
    (project / "checkpoints").mkdir()
    (project / "checkpoints" / "notes.txt").write_text("mine\n")
    before = _tree(project)
    proc = run_app(*ARGS, "--output", str(project))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert error_lines(proc.stderr) == [
        f"error: output directory {str(project)!r} already holds model, checkpoints and no run "
        "(no metrics.json): a run writes its model, checkpoints and TensorBoard logs under "
        "those names and would replace them; allowed: a new --output (a run's own folder, "
        "e.g. runs/NAME), or a folder without model, model.keras, model.weights.h5, checkpoints, "
        "tensorboard, "
        "best, backup"], proc.stderr
    assert _tree(project) == before
    assert (project / "model" / "__init__.py").read_text() == "precious = True\n"


@ONCE_IN_THE_IMAGE
def test_a_folder_of_other_files_takes_the_run_beside_them(tmp_path):
    project = tmp_path / "proj"
    project.mkdir()
    (project / "README.md").write_text("my notes\n")
    proc = run_app(*ARGS, "--no-save-model", "--output", str(project))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (project / "README.md").read_text() == "my notes\n"
    assert (project / "metrics.json").exists()
