"""``tfmp tune`` inside the image (TF 2.9.3 / Keras 2) as a batch job under a container memory
limit (issue 16): ``--memory-budget auto`` is what is free under the container's cgroup
limit (the limit less what the container uses, issue 24), the trials
that pass it are stopped (by the tuner's watchdog or the kernel's OOM killer) and count as
not fitting, and both float32 and mixed_bfloat16 report a boundary; `tfmp train --tuned`
then trains the choice within the limit."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from image_helpers import HOST_GID, HOST_UID, docker_run

pytestmark = pytest.mark.docker

HEAVY = Path(__file__).parents[1] / "unit" / "user_models" / "activation_heavy.py"
LIMIT_MIB = 1536


def test_tune_under_a_container_memory_limit(image, tmp_path):
    os.chown(tmp_path, HOST_UID, HOST_GID)
    shutil.copy(HEAVY, tmp_path / "heavy.py")
    os.chown(tmp_path / "heavy.py", HOST_UID, HOST_GID)
    tune = ["tfmp", "tune", "--model", "./heavy.py:build", "--dataset", "synthetic",
            "--input-shape", "64,64,3", "--max-train-samples", "256",
            "--precision", "float32,mixed_bfloat16", "--margin", "0", "--steps", "1",
            "--output", "/workspace/tune"]
    # ...then the choice trained in the same container, under the same limit.
    train = ["tfmp", "train", "--tuned", "/workspace/tune/tune.json", "--model", "./heavy.py:build",
             "--dataset", "synthetic", "--input-shape", "64,64,3", "--epochs", "1",
             "--max-train-samples", "64", "--max-val-samples", "16", "--no-save-model",
             "--progress", "lines", "--output", "/workspace/run"]
    proc = docker_run(image, "--memory", f"{LIMIT_MIB}m", "--memory-swap", f"{LIMIT_MIB}m",
                      "-e", f"NB_UID={HOST_UID}", "-e", f"NB_GID={HOST_GID}",
                      "-v", f"{tmp_path}:/workspace", "-w", "/workspace",
                      command=["bash", "-c", " ".join(tune) + " && " + " ".join(train)],
                      timeout=1200)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    doc = json.loads((tmp_path / "tune" / "tune.json").read_text())
    # auto is what is free under the limit: the limit less what the container uses when the
    # tune starts (the tune's own process at least), never the bare limit.
    assert (LIMIT_MIB - 512) * 2**20 < doc["budget_bytes"] < LIMIT_MIB * 2**20, \
        doc["budget_source"]
    assert doc["budget_source"].startswith("container memory limit 1.50 GiB less "), \
        doc["budget_source"]
    assert doc["environment"]["tensorflow"].startswith("2.9")
    for policy, entry in doc["precisions"].items():
        search = [t for t in entry["trials"] if t["phase"] == "search"]
        assert entry["max_batch"], (policy, search)
        beyond = [t for t in search if t["batch_size"] > entry["max_batch"]]
        assert beyond and not any(t["fits"] for t in beyond), (policy, search)
    assert doc["verified"]["fits"] and doc["choice"]["batch_size"]
    assert (tmp_path / "tune" / "tune.png").exists()
    assert (tmp_path / "tune" / "tune.json").stat().st_uid == HOST_UID
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["status"] == "completed"
    assert (metrics["precision"]["policy"], metrics["config"]["batch_size"]) == \
        (doc["choice"]["precision"], doc["choice"]["batch_size"])
    assert metrics["tuned"]["path"] == "/workspace/tune/tune.json"
    assert metrics["peak_memory"]["bytes"] <= doc["budget_bytes"], metrics["peak_memory"]
