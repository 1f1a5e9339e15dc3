"""``tfmp tune`` inside the image (TF 2.9.3 / Keras 2) as a batch job under a container memory
limit (issue 16): ``--memory-budget auto`` is what is free under the container's cgroup
limit (the limit less what the container uses, issue 24), the trials
that pass it are stopped (by the tuner's watchdog or the kernel's OOM killer) and count as
not fitting, and both float32 and mixed_bfloat16 report a boundary: the model is one wide
Dense layer at every pixel, which TF 2.9 runs in bfloat16 on any CPU, with AVX-512 or
without; `tfmp train --tuned` then trains the choice within the limit.

The same container first runs the refusal for real, where the capability is missing: with
``TF_ENABLE_ONEDNN_OPTS=0`` TF 2.9 has no bfloat16 convolutions on any CPU (as on one without
AVX-512), and train, check and tune say so in one line (app/machine/kernels.py)."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from image_helpers import HOST_GID, HOST_UID, docker_run

from tests.paths import USER_MODELS

pytestmark = pytest.mark.docker

HEAVY = USER_MODELS / "activation_heavy.py"
LIMIT_MIB = 1536
# More than fits under the limit.  Of the sizes that fit (float32 up to 24, mixed_bfloat16
# up to 32 on a 2-core AMD EPYC), 8 and 24 divide it: two plans a precision to choose from,
# measured (96 had three each, 8, 16 and 24: a minute of the CI's longest image test).
GLOBAL_BATCH = 120


def test_tune_under_a_container_memory_limit(image, tmp_path):
    os.chown(tmp_path, HOST_UID, HOST_GID)
    shutil.copy(HEAVY, tmp_path / "heavy.py")
    os.chown(tmp_path / "heavy.py", HOST_UID, HOST_GID)
    tune = ["tfmp", "tune", "--model", "./heavy.py:dense", "--dataset", "synthetic",
            "--input-shape", "64,64,3",   # generated data: no training set bounds the batch
            "--precision", "float32,mixed_bfloat16", "--margin", "0", "--steps", "1",
            "--global-batch", str(GLOBAL_BATCH), "--output", "/workspace/tune"]
    # ...then the choice trained in the same container, under the same limit.
    train = ["tfmp", "train", "--tuned", "/workspace/tune/tune.json", "--model", "./heavy.py:dense",
             "--dataset", "synthetic", "--input-shape", "64,64,3", "--epochs", "1",
             "--max-train-samples", "64", "--max-val-samples", "16", "--no-save-model",
             "--progress", "lines", "--output", "/workspace/run"]
    # Where the capability is missing (forced): each its one line and exit status.
    refusals = " ".join(f"TF_ENABLE_ONEDNN_OPTS=0 {cmd} >/workspace/{name}.out 2>&1; "
                        f"echo $? >/workspace/{name}.rc;" for name, cmd in REFUSALS)
    proc = docker_run(image, "--memory", f"{LIMIT_MIB}m", "--memory-swap", f"{LIMIT_MIB}m",
                      "-e", f"NB_UID={HOST_UID}", "-e", f"NB_GID={HOST_GID}",
                      "-v", f"{tmp_path}:/workspace", "-w", "/workspace",
                      command=["bash", "-c", refusals + " " + " ".join(tune) + " && "
                               + " ".join(train)],
                      timeout=1200)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    _assert_refused(tmp_path)
    doc = json.loads((tmp_path / "tune" / "tune.json").read_text())
    # auto is what is free under the limit: the limit less what the container uses when the
    # tune starts (the tune's own process at least), never the bare limit.
    assert (LIMIT_MIB - 512) * 2**20 < doc["budget_bytes"] < LIMIT_MIB * 2**20, \
        doc["budget_source"]
    assert doc["budget_source"].startswith("container memory limit 1.50 GiB less "), \
        doc["budget_source"]
    assert doc["environment"]["tensorflow"].startswith("2.9")
    assert set(doc["precisions"]) == {"float32", "mixed_bfloat16"} and not doc["left_out"]
    # what mixed precision is for: 16-bit activations take less memory a sample, so more fit
    per_sample = {p: e["memory_per_sample_bytes"] for p, e in doc["precisions"].items()}
    assert per_sample["mixed_bfloat16"] < 0.8 * per_sample["float32"], per_sample
    assert doc["precisions"]["mixed_bfloat16"]["max_batch"] > \
        doc["precisions"]["float32"]["max_batch"], doc["precisions"]
    for policy, entry in doc["precisions"].items():
        search = [t for t in entry["trials"] if t["phase"] == "search"]
        assert entry["max_batch"], (policy, search)
        beyond = [t for t in search if t["batch_size"] > entry["max_batch"]]
        assert beyond and not any(t["fits"] for t in beyond), (policy, search)
    assert doc["verified"]["fits"] and doc["choice"]["batch_size"]
    # --global-batch: the plan reaches it with a micro-batch that fits, measured accumulated
    choice = doc["choice"]
    assert choice["batch_size"] * choice["accumulate"] == GLOBAL_BATCH == choice["global_batch"]
    assert choice["batch_size"] <= doc["precisions"][choice["precision"]]["max_batch"]
    assert doc["verified"]["accumulate"] == choice["accumulate"] > 1
    plans = doc["global_batch"]["plans"]
    assert set(plans) == set(doc["precisions"]) and all(
        t["phase"] == "plan" for p in plans.values() for t in p["trials"])
    assert (tmp_path / "tune" / "tune.png").exists()
    assert (tmp_path / "tune" / "tune.json").stat().st_uid == HOST_UID
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["status"] == "completed"
    assert (metrics["precision"]["policy"], metrics["config"]["batch_size"]) == \
        (doc["choice"]["precision"], doc["choice"]["batch_size"])
    assert metrics["accumulation"] == {"micro_batch": choice["batch_size"],
                                       "accumulate": choice["accumulate"],
                                       "global_batch": GLOBAL_BATCH}
    assert metrics["tuned"]["path"] == "/workspace/tune/tune.json"
    assert metrics["peak_memory"]["bytes"] <= doc["budget_bytes"], metrics["peak_memory"]


SMALL = ("--dataset synthetic --epochs 1 --max-train-samples 32 --max-val-samples 8 "
         "--no-save-model --progress lines")
REFUSALS = (
    # a user's model: refused once built, before its first forward pass (never "your code")
    ("user", "tfmp train --model ./heavy.py:build --input-shape 8,8,3 --precision "
             f"mixed_bfloat16 {SMALL} --output /workspace/refused-user"),
    # a built-in: refused before any data loads
    ("builtin", f"tfmp train --model cnn --precision mixed_bfloat16 {SMALL} "
                "--output /workspace/refused-cnn"),
    ("check", "tfmp check --model cnn --precision mixed_bfloat16 --batch-size 8 --steps 1"),
    # the only policy asked for is refused: nothing to tune, its one line
    ("tune", "tfmp tune --model cnn --dataset synthetic --precision mixed_bfloat16 "
             "--output /workspace/refused-tune --quiet"),
    ("env", "tfmp env"),
)
CAUSE = ("TensorFlow 2.9 has bfloat16 CPU kernels for Conv2D only in oneDNN, which it turns on "
         "only on CPUs with AVX-512 (VNNI or BF16) or AMX, and ")
# What works: "without TF_ENABLE_ONEDNN_OPTS=0" on an AVX-512 CPU, "on a CPU with AVX-512 ..."
# on one without it.
ALLOWED = "; allowed: --precision float32, or mixed_bfloat16 "


def _assert_refused(folder: Path) -> None:
    out = {name: (folder / f"{name}.out").read_text() for name, _ in REFUSALS}
    rc = {name: int((folder / f"{name}.rc").read_text()) for name, _ in REFUSALS}
    for name in ("user", "builtin", "tune"):
        errors = [line for line in out[name].splitlines() if line.startswith("error:")]
        assert rc[name] == 2 and len(errors) == 1, (name, out[name][-3000:])
        assert "Traceback" not in out[name] and "your code raised" not in out[name], out[name]
        assert CAUSE in errors[0] and ALLOWED in errors[0], errors[0]
    assert "error: mixed_bfloat16 cannot run layer 'conv2d' (Conv2D) of model "\
        "'./heavy.py:build' here: " in out["user"], out["user"]
    for name in ("builtin", "tune"):
        assert "error: mixed_bfloat16 cannot run the Conv2D layers of model 'cnn' here: " in \
            out[name], out[name]
    assert not (folder / "refused-user").exists() and not (folder / "refused-cnn").exists()
    assert rc["check"] == 1 and "verdict: blocked" in out["check"], out["check"][-3000:]
    assert "BLOCKER  mixed_bfloat16 cannot run layer 'conv2d' (Conv2D) of model 'cnn' here: " \
        + CAUSE in out["check"], out["check"]
    assert rc["env"] == 0, out["env"]
    assert "oneDNN:        off (TF_ENABLE_ONEDNN_OPTS=0 turns it off)" in out["env"], out["env"]
    assert "mixed_bfloat16: runs Dense, Embedding, MaxPooling2D (probed)" in out["env"]
