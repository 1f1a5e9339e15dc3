"""The guide notebooks in a real container: a fresh workspace gets them at start, and a
notebook the user edited survives a restart (and a newer image) untouched.

Relies on entrypoint.sh running, as the unprivileged user before JupyterLab starts:
    python -m app notebooks --install /workspace/notebooks
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from image_helpers import HOST_GID, HOST_UID, exec_in, health, run, wait_until

pytestmark = pytest.mark.docker

NAMES = ["01_policy_and_fit.ipynb", "02_custom_loop_loss_scaling.ipynb", "03_benchmark.ipynb",
         "04_your_own_model.ipynb", "05_tune_batch_size.ipynb", "06_when_training_goes_nan.ipynb"]


def _workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "workspace"
    ws.mkdir()
    os.chown(ws, HOST_UID, HOST_GID)
    return ws


def _serve(container, ws: Path) -> str:
    name = container("--shm-size=256m", "-e", "JUPYTER_TOKEN=test-token-123",
                     "-e", f"NB_UID={HOST_UID}", "-e", f"NB_GID={HOST_GID}",
                     "-v", f"{ws}:/workspace")
    wait_until(lambda: health(name).startswith("healthy"), 120, what=f"{name} healthy")
    return name


def _shipped(ws: Path) -> list:
    return sorted(p.name for p in (ws / "notebooks").glob("*.ipynb"))


def test_fresh_workspace_gets_the_notebooks_owned_by_the_user(container, tmp_path):
    ws = _workspace(tmp_path)
    _serve(container, ws)
    wait_until(lambda: _shipped(ws) == NAMES, 30, what="the notebooks in /workspace/notebooks")
    for name in NAMES:
        path = ws / "notebooks" / name
        assert (path.stat().st_uid, path.stat().st_gid) == (HOST_UID, HOST_GID)
        nb = json.loads(path.read_text())
        assert all(not c.get("outputs") for c in nb["cells"]), "shipped with outputs cleared"
    manifest = json.loads((ws / "notebooks" / ".tfmp-notebooks.json").read_text())
    assert sorted(manifest["notebooks"]) == NAMES


def test_an_edited_notebook_survives_a_restart_and_a_deleted_one_returns(container, tmp_path):
    ws = _workspace(tmp_path)
    name = _serve(container, ws)
    wait_until(lambda: _shipped(ws) == NAMES, 30, what="the notebooks in /workspace/notebooks")
    edited = ws / "notebooks" / NAMES[0]
    nb = json.loads(edited.read_text())
    nb["cells"].append({"cell_type": "markdown", "id": "mine", "metadata": {},
                        "source": "my own notes"})
    edited.write_text(json.dumps(nb))
    mine = edited.read_bytes()
    (ws / "notebooks" / NAMES[2]).unlink()

    run(["docker", "restart", "-t", "5", name], timeout=60)
    wait_until(lambda: health(name).startswith("healthy"), 120, what=f"{name} healthy again")
    wait_until(lambda: (ws / "notebooks" / NAMES[2]).exists(), 30, what="the deleted notebook back")
    assert edited.read_bytes() == mine

    # A newer image would refresh only unedited copies: simulate it with the shipped files.
    out = exec_in(name, "python3", "-m", "app", "notebooks", "--install", "/workspace/notebooks",
                  user=f"{HOST_UID}:{HOST_GID}", timeout=60).stdout
    assert f"{NAMES[0]}: kept" in out and f"{NAMES[1]}: up to date" in out
    assert edited.read_bytes() == mine


def test_the_image_lists_the_shipped_notebooks(image):
    proc = run(["docker", "run", "--rm", "-e", "TFMP_QUIET=1", image,
                "python", "-m", "app", "notebooks"], timeout=120)
    for name in NAMES:
        assert name in proc.stdout
