"""Real tunes on the host: trials are child processes that train, the memory watchdog stops
the sizes that pass the budget, and tune.json is what ``train --tuned`` reads.

Kept to a few trials: a model whose memory is almost all activations (tens of MB a sample,
tests/unit/user_models/activation_heavy.py) on 90x90 inputs under a 1.5 GiB budget, so batch
8 fits and 16 does not, under float32 and mixed_bfloat16 alike, each by a quarter of a GiB or
more (TF 2.21, 2-core AMD EPYC without AVX-512: batch 8 peaks at 1.10 GiB; at 64x64 under
1.25 GiB, batch 16 peaked 27 MiB under the limit there and above it on a CPU with AVX-512),
and a --global-batch of 32 that does not fit is planned as micro-batches of 8 accumulated 4
times.  Each trial still starts TensorFlow, so this takes about two minutes on 2 cores.
"""
from __future__ import annotations

import json
import os

import pytest

from app.tuner import report
from app.training import tuned
from tests.unit.helpers import ONCE_IN_THE_IMAGE, run_app

pytestmark = pytest.mark.slow
MODEL = "tests.unit.user_models.activation_heavy:build"


# Its twin, tests/image/test_tune_image.py, asserts the same of a container's tune (both
# precisions where TF 2.9 runs bfloat16, a boundary, a global-batch plan, train --tuned).
TWIN = ("tests/image/test_tune_image.py runs the same tune and train --tuned inside the image, "
        "under a container memory limit")


@pytest.mark.host_only(reason=TWIN)
@pytest.mark.in_containers(
    reason=TWIN, twins=("tests/image/test_tune_image.py::test_tune_under_a_container_memory_limit",))
def test_both_precisions_find_a_boundary_and_a_size_beyond_it_did_not_fit(tmp_path):
    out = tmp_path / "tune"
    proc = run_app("tune", "--model", MODEL, "--dataset", "synthetic", "--input-shape", "90,90,3",
                   "--max-train-samples", "64", "--precision", "float32,mixed_bfloat16",
                   "--memory-budget", "1536MiB", "--steps", "1", "--global-batch", "32",
                   "--output", str(out), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((out / "tune.json").read_text(encoding="utf-8"))
    assert doc["schema"] == report.SCHEMA
    # The default margin (10%) is what absorbs a real run's memory beyond the verification's.
    budget, limit = 1536 * 2**20, 1536 * 2**20 * 0.9
    assert doc["budget_bytes"] == budget and doc["margin"] == 0.1
    assert doc["memory_kind"] == "cpu_rss"
    assert set(doc["precisions"]) == {"float32", "mixed_bfloat16"}
    for policy, entry in doc["precisions"].items():
        trials = [t for t in entry["trials"] if t["phase"] == "search"]
        assert entry["max_batch"] is not None and entry["max_batch"] % 8 == 0, (policy, entry)
        fitted = [t for t in trials if t["batch_size"] == entry["max_batch"]]
        assert fitted and fitted[0]["fits"] and fitted[0]["peak_memory_bytes"] <= limit
        beyond = [t for t in trials if t["batch_size"] > entry["max_batch"]]
        assert beyond and not any(t["fits"] for t in beyond), (policy, trials)
        assert all(t["reason"] for t in beyond)
        assert all(t["batch_size"] % 8 == 0 for t in trials)
        assert entry["best_batch"] in [t["batch_size"] for t in trials if t["fits"]]
    # --global-batch 32, four times the largest size that fits: per precision the micro-batch
    # that divides it, measured with accumulation (whole groups timed, the update included)
    plans = doc["global_batch"]["plans"]
    assert doc["global_batch"]["requested"] == 32 and set(plans) == set(doc["precisions"])
    for policy, p in plans.items():
        assert p["micro_batch"] * p["accumulate"] == 32, (policy, p)
        assert p["micro_batch"] <= doc["precisions"][policy]["max_batch"]
        assert p["trials"] and all(t["phase"] == "plan" and t["accumulate"] * t["batch_size"]
                                   == 32 for t in p["trials"])
    choice, verified = doc["choice"], doc["verified"]
    assert verified["fits"] and verified["batch_size"] == choice["batch_size"]
    assert verified["peak_memory_bytes"] <= limit
    assert choice["global_batch"] == 32 == choice["batch_size"] * choice["accumulate"]
    assert verified["accumulate"] == choice["accumulate"] > 1
    assert (out / "tune.png").read_bytes()[:4] == b"\x89PNG"
    assert os.listdir(out / "trials")
    # what `train --tuned` will read
    t = tuned.read_tuned(str(out / "tune.json"), MODEL, "synthetic")
    assert (t.precision, t.batch_size, t.accumulate) == (choice["precision"],
                                                         choice["batch_size"],
                                                         choice["accumulate"])
    # the progress on stderr, the result (the table and where it went) on stdout
    assert "largest batch" in proc.stdout and "choice:" in proc.stdout, proc.stdout
    assert "tune.json" in proc.stdout.splitlines()[-1] and "choice:" not in proc.stderr

    # ...and `train --tuned` trains the choice, records the tune and stays within the budget.
    run = tmp_path / "run"
    proc = run_app("train", "--tuned", str(out / "tune.json"), "--model", MODEL,
                   "--dataset", "synthetic", "--input-shape", "90,90,3", "--epochs", "1",
                   "--max-train-samples", "64", "--max-val-samples", "16", "--no-save-model",
                   "--output", str(run), "--workspace", str(tmp_path / "ws"), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads((run / "metrics.json").read_text(encoding="utf-8"))
    rec = metrics["tuned"]
    assert rec["path"] == str(out / "tune.json")
    assert rec["taken"] == ["precision", "batch_size", "accumulate"]
    assert rec["choice"]["batch_size"] == choice["batch_size"] and rec["scale_lr"] == "none"
    assert metrics["config"]["batch_size"] == choice["batch_size"]
    assert metrics["precision"]["policy"] == choice["precision"]
    assert metrics["peak_memory"]["bytes"] <= doc["budget_bytes"], metrics["peak_memory"]
    assert metrics["accumulation"] == {"micro_batch": choice["batch_size"],
                                       "accumulate": choice["accumulate"], "global_batch": 32}
    assert f"tuned: precision {choice['precision']}, batch size {choice['batch_size']}, " \
        f"accumulate {choice['accumulate']}" in proc.stdout


@ONCE_IN_THE_IMAGE
def test_nothing_fits_is_one_line_naming_the_smallest_size_exit_2(tmp_path):
    out = tmp_path / "tune"
    proc = run_app("tune", "--model", "mlp", "--dataset", "synthetic", "--precision", "float32",
                   "--memory-budget", "200MiB", "--output", str(out), "--quiet", timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: no batch size fits"), lines
    assert "the smallest tried, 8 under float32, peaked at" in lines[0]
    assert not out.exists()
