"""The two-worker Compose job (docker-compose.multiworker.yml) runs to completion from the
image: two services, TF_CONFIG built from the service names, MultiWorkerMirroredStrategy on
the CPU (TF 2.9 / Keras 2: --loop fit with Keras' BackupAndRestore), and only the chief
(worker0) leaves files in the shared workspace."""
from __future__ import annotations

import json
import os
import uuid

import pytest

from image_helpers import HOST_GID, HOST_UID, REPO, memlock_limit, run

pytestmark = pytest.mark.docker


def _compose(files, env, *args, timeout=120, check=True):
    cmd = ["docker", "compose"]
    for f in files:
        cmd += ["-f", str(f)]
    return run(cmd + list(args), timeout=timeout, check=check, env=env)


def test_two_worker_compose_job_runs_to_completion(image, tmp_path):
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    os.chown(workspace, HOST_UID, HOST_GID)
    override = tmp_path / "workspace-bind.yml"
    bind = ("    volumes: !override\n      - type: bind\n"
            f"        source: {workspace}\n        target: /workspace\n")
    override.write_text("services:\n  worker0:\n" + bind + "  worker1:\n" + bind)
    files = [REPO / "docker-compose.multiworker.yml", override]
    env = dict(os.environ, COMPOSE_PROJECT_NAME=f"tfmpmw{uuid.uuid4().hex[:8]}", IMAGE=image,
               NB_UID=str(HOST_UID), NB_GID=str(HOST_GID), MEMLOCK_LIMIT=memlock_limit(),
               MW_RUN="job", TFMP_PRECISION="float32", TFMP_EPOCHS="2", TFMP_BATCH_SIZE="16",
               TFMP_MAX_TRAIN_SAMPLES="512", TFMP_MAX_VAL_SAMPLES="128", TFMP_LOG_EVERY="8",
               TFMP_OFFLINE="1")
    try:
        up = _compose(files, env, "up", "--no-build", "--no-color", timeout=420, check=False)
        states = [json.loads(line) for line in
                  _compose(files, env, "ps", "-a", "--format", "json").stdout.splitlines()
                  if line.strip()]
        codes = {s["Service"]: s["ExitCode"] for s in states}
        assert codes == {"worker0": 0, "worker1": 0}, up.stdout[-4000:] + up.stderr[-2000:]
        logs = up.stdout
        assert "task worker:0 of 2; batch 16 per replica, global batch 32" in logs
        assert "task worker:1 of 2 (not the chief" in logs
        out = workspace / "runs" / "job"
        m = json.loads((out / "metrics.json").read_text())
        assert m["status"] == "completed" and [e["epoch"] for e in m["epochs"]] == [1, 2]
        assert m["distribute"]["workers"] == 2 and m["distribute"]["task"] == "worker:0"
        assert m["epochs"][-1]["val_accuracy"] >= 0.9
        assert m["model_path"] and (out / os.path.relpath(m["model_path"], "/workspace/runs/job")).exists()
        leftovers = [os.path.join(r, n) for r, ds, fs in os.walk(out) for n in ds + fs
                     if "workertemp" in n]
        assert leftovers == []
        # BackupAndRestore's folder, "deleted when the job completes" (docs/distributed.md):
        # a worker could leave it behind, empty.
        assert not (out / "backup").exists(), sorted(os.listdir(out))
        owners = {os.stat(os.path.join(r, n)).st_uid for r, ds, fs in os.walk(out) for n in ds + fs}
        assert owners == {HOST_UID}   # the workers ran as the host user, not root
    finally:
        _compose(files, env, "down", "-v", "--remove-orphans", "-t", "5", timeout=120,
                 check=False)
