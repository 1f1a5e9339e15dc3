"""A run folder shared by a team (one group, ``umask 002``): TensorFlow makes its folders
(checkpoints/, tensorboard/, the saved model's) 0755 whatever the umask, while the files in
them follow it, so a teammate's ``--resume`` could replace metrics.json but not write the
next checkpoint.  The folders of a run now follow the umask as its files do
(``app.core.folders.follow_umask``); tests/image/test_run.py has two members of a group
resume each other's run."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from app.core import folders

from tests.unit.helpers import app_env

TINY = ["--model", "mlp", "--dataset", "synthetic", "--max-train-samples", "256",
        "--max-val-samples", "64", "--precision", "float32", "--batch-size", "32",
        "--offline", "--progress", "lines"]


def _train(shared, out, *extra, umask):
    return subprocess.run([sys.executable, "-m", "app", "train", *TINY, "--output", out,
                           "--workspace", os.path.join(shared, "ws"), *extra],
                          capture_output=True, text=True, timeout=300, env=app_env(),
                          cwd=shared, preexec_fn=lambda: os.umask(umask))   # umask=: 3.9+


def _folder_modes(out):
    return {os.path.relpath(top, out): os.stat(top).st_mode & 0o777
            for top, _, _ in os.walk(out)}


@pytest.mark.parametrize("umask, mode", [(0o002, 0o775), (0o022, 0o755)])
def test_a_runs_folders_follow_the_umask_as_its_files_do(tmp_path, umask, mode):
    shared = str(tmp_path)
    out = os.path.join(shared, "run")
    proc = _train(shared, out, "--epochs", "1", umask=umask)
    assert proc.returncode == 0, proc.stderr[-2000:]
    modes = _folder_modes(out)
    assert {"checkpoints", "tensorboard"} <= set(modes), modes   # and model/ under Keras 2
    assert set(modes.values()) == {mode}, modes
    assert os.stat(os.path.join(out, "metrics.json")).st_mode & 0o777 == mode & 0o666


def test_only_tensorflows_own_folder_mode_changes(tmp_path):
    root, outside = tmp_path / "run", tmp_path / "elsewhere"
    for d, mode in ((root, 0o755), (root / "checkpoints", 0o2755), (root / "private", 0o700),
                    (outside, 0o755)):
        d.mkdir()
        d.chmod(mode)
    (root / "link").symlink_to(outside)
    old = os.umask(0o002)
    try:
        folders.follow_umask(str(root))
    finally:
        os.umask(old)
    assert root.stat().st_mode & 0o7777 == 0o775
    assert (root / "checkpoints").stat().st_mode & 0o7777 == 0o2775   # setgid kept
    assert (root / "private").stat().st_mode & 0o7777 == 0o700       # someone's choice
    assert outside.stat().st_mode & 0o7777 == 0o755                  # a link is not followed


def test_the_umask_is_read_without_changing_it():
    old = os.umask(0o027)
    try:
        assert folders.current_umask() == 0o027
        assert os.umask(0o027) == 0o027
    finally:
        os.umask(old)
