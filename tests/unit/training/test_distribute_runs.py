"""Real distributed runs on the CPU, each in fresh processes (a strategy and logical devices
can only be set up before TensorFlow starts):

* MirroredStrategy over two logical CPU devices (TFMP_LOGICAL_CPUS=2, a testing aid) trains
  to the stated accuracy with a per-replica batch, under float32 and under mixed_float16
  with injected overflow (the replicas skip steps together and the scale falls);
* a two-worker MultiWorkerMirroredStrategy job on localhost ports finishes, and only the
  chief writes metrics.json / the model;
* SIGKILL one worker after a backup exists: TensorFlow's collectives cannot go on without
  it, so the surviving worker fails within seconds (heartbeat timeout, exit 4); restarting
  both with the same command - what a cluster manager does - resumes from the backup and
  ends at the requested epoch count without running the backed-up epochs again.

Keras 3 (host) runs multi-worker jobs in the custom loop (checkpoint backup); Keras 2 (the
image) runs --loop fit with Keras' BackupAndRestore.  docs/distributed.md explains why.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.paths import ROOT
from tests.unit.helpers import ONCE_IN_THE_IMAGE, free_ports, tf_config

pytestmark = pytest.mark.slow

TARGET_ACCURACY = 0.9  # synthetic data: 10 classes, chance 0.1 (as in test_training.py)
LOOP = "custom" if int(__import__("keras").__version__.split(".")[0]) >= 3 else "fit"
COMMON = ["--model", "mlp", "--dataset", "synthetic", "--offline", "--progress", "lines",
          "--batch-size", "16", "--max-val-samples", "128"]


def _env(extra=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TFMP_") and k != "TF_CONFIG"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env.update(extra or {})
    return env


def _app(args, env, log_path):
    log = open(log_path, "w")
    return subprocess.Popen([sys.executable, "-m", "app", "train", *args], stdout=log,
                            stderr=subprocess.STDOUT, env=env, cwd=ROOT)


def _read(path):
    with open(path) as fh:
        return fh.read()


def _metrics(out):
    with open(os.path.join(out, "metrics.json")) as fh:
        return json.load(fh)


def _wait(procs, timeout):
    deadline = time.monotonic() + timeout
    codes = []
    try:
        for p in procs:
            codes.append(p.wait(timeout=max(1, deadline - time.monotonic())))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return codes


@ONCE_IN_THE_IMAGE
@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_mirrored_over_two_logical_cpus_reaches_target_accuracy(tmp_path, loop):
    out = tmp_path / "run"
    # TensorFlow's warnings shown (the app hides them by default), as in a notebook
    # calling app.train: the datasets are sharded by data in both loops, so TensorFlow has
    # no FILE policy to try first and no pipeline graph to log (70 lines a dataset in fit).
    p = _app([*COMMON, "--strategy", "mirrored", "--loop", loop, "--precision", "float32",
              "--epochs", "2", "--max-train-samples", "512", "--log-every", "8",
              "--output", str(out)], _env({"TFMP_LOGICAL_CPUS": "2",
                                           "TF_CPP_MIN_LOG_LEVEL": "0"}), tmp_path / "log")
    assert _wait([p], 240) == [0], _read(tmp_path / "log")[-3000:]
    log = _read(tmp_path / "log")
    assert "2 replica(s); batch 16 per replica, global batch 32" in log
    assert "FILE sharding policy" not in log and "auto_shard_policy" not in log, log[-3000:]
    m = _metrics(out)
    assert m["distribute"]["strategy"] == "mirrored" and m["distribute"]["replicas"] == 2
    assert m["distribute"]["global_batch"] == 32 and m["config"]["batch_size"] == 16
    assert m["epochs"][-1]["val_accuracy"] >= TARGET_ACCURACY
    assert m["epochs"][0]["steps"] == 512 // 32     # one step per *global* batch


@ONCE_IN_THE_IMAGE
def test_a_strategy_of_one_replica_trains_behind_the_sentinel(tmp_path):
    """A strategy with one replica: --strategy mirrored on a machine of one device (one GPU,
    or none), and multi-worker without TF_CONFIG (one worker).  Keras 2's apply_gradients
    synchronises (merge_call) under any strategy, one replica too, which TensorFlow refuses
    inside the tf.cond that gates fit's update and every accumulated one: these runs failed
    with "merge_call called while defining a new graph" until the gate was taken in the
    cross-replica context for one replica as for several."""
    runs = {"mirrored-fit": ["--strategy", "mirrored", "--loop", "fit"],
            "mirrored-custom-accumulated": ["--strategy", "mirrored", "--loop", "custom",
                                            "--accumulate", "2"],
            "multi-worker-accumulated": ["--strategy", "multi-worker", "--loop", LOOP,
                                         "--accumulate", "2"]}
    for name, args in runs.items():
        out, log = tmp_path / name, tmp_path / f"{name}.log"
        p = _app([*COMMON, *args, "--precision", "float32", "--epochs", "1",
                  "--max-train-samples", "64", "--output", str(out)], _env(), log)
        assert _wait([p], 240) == [0], (name, _read(log)[-3000:])
        assert "1 replica(s)" in _read(log), (name, _read(log)[-3000:])
        m = _metrics(out)
        assert m["status"] == "completed" and m["numerics"]["skipped_steps"] == 0, (name, m)
        assert m["distribute"]["strategy"] == args[1] and m["distribute"]["replicas"] == 1
        updates = 64 // 16 // (2 if "--accumulate" in args else 1)
        assert m["epochs"][0]["steps"] == updates, (name, m["epochs"][0])


@ONCE_IN_THE_IMAGE
def test_mirrored_replicas_skip_overflowing_steps_together(tmp_path):
    """mixed_float16 with a first loss scale of 2**22: the first steps overflow; both
    replicas skip them together (the optimizer all-reduces and our counter agrees: the
    scale fell by exactly 2 per counted skip), and training recovers."""
    out = tmp_path / "run"
    p = _app([*COMMON, "--strategy", "mirrored", "--loop", "custom", "--precision",
              "mixed_float16", "--epochs", "3", "--max-train-samples", "256",
              "--max-val-samples", "64", "--learning-rate", "3e-3", "--initial-loss-scale",
              str(2 ** 22), "--log-every", "4", "--output", str(out)],
             _env({"TFMP_LOGICAL_CPUS": "2"}), tmp_path / "log")
    assert _wait([p], 300) == [0], _read(tmp_path / "log")[-3000:]
    m = _metrics(out)
    first = m["epochs"][0]
    assert first["skipped_steps"] >= 1
    # growth needs 2000 good steps, so every counted skip halved the scale exactly once
    assert first["loss_scale"] == 2.0 ** 22 / 2 ** first["skipped_steps"]
    assert m["epochs"][-1]["val_accuracy"] >= TARGET_ACCURACY


@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_mirrored_accumulation_skips_whole_updates_together(tmp_path, loop):
    """--accumulate 2 over two replicas under mixed_float16, a first scale of 2**22: the
    overflowing updates are skipped by both replicas together, the scale halved once per
    skipped update (8 micro-batches, 4 updates an epoch), never once per micro-batch."""
    out = tmp_path / "run"
    p = _app([*COMMON, "--strategy", "mirrored", "--loop", loop, "--precision",
              "mixed_float16", "--epochs", "1", "--max-train-samples", "256",
              "--max-val-samples", "32", "--initial-loss-scale", str(2 ** 22),
              "--accumulate", "2", "--log-every", "1", "--output", str(out)],
             _env({"TFMP_LOGICAL_CPUS": "2"}), tmp_path / "log")
    assert _wait([p], 300) == [0], _read(tmp_path / "log")[-3000:]
    m = _metrics(out)
    assert m["accumulation"] == {"micro_batch": 32, "accumulate": 2, "global_batch": 64}
    assert [r["step"] for r in m["steps"]] == [1, 2, 3, 4]       # updates, not micro-batches
    first = m["epochs"][0]
    assert first["skipped_steps"] >= 1
    assert first["loss_scale"] == 2.0 ** 22 / 2 ** first["skipped_steps"]


def _start_workers(tmp_path, ports, out, epochs, tag, train_samples):
    args = [*COMMON, "--loop", LOOP, "--precision", "float32", "--epochs", str(epochs),
            "--max-train-samples", str(train_samples), "--log-every", "16", "--output", str(out)]
    return [_app(args, _env({"TF_CONFIG": tf_config(ports, i)}), tmp_path / f"{tag}{i}.log")
            for i in range(2)]


def _final_weights(out):
    import tensorflow as tf

    model = tf.keras.models.load_model(_metrics(out)["model_path"], compile=False)
    return [w.numpy() for w in model.weights]


@ONCE_IN_THE_IMAGE
def test_two_workers_finish_only_the_chief_writes_and_accumulating_matches_the_plain_batch(
        tmp_path):
    """Two two-worker jobs side by side: the plain batch of 16 per worker, and --accumulate 2
    of micro-batches of 8.  Each update of the second is the mean over both workers' two
    micro-batches, the 32 samples a plain step trains on, so both end with the same
    weights; and only the chief writes (--early-stop's best weights too: every worker
    saves them, the others into temporary folders)."""
    ports = free_ports(4)
    plain, acc = tmp_path / "plain", tmp_path / "acc"
    common = [*COMMON[:-4], "--max-val-samples", "128", "--loop", LOOP, "--precision",
              "float32", "--epochs", "2", "--max-train-samples", "512", "--log-every", "16",
              "--early-stop", "5"]
    procs = [_app([*common, "--batch-size", "16", "--output", str(plain)],
                  _env({"TF_CONFIG": tf_config(ports[:2], i)}), tmp_path / f"w{i}.log")
             for i in range(2)]
    procs += [_app([*common, "--batch-size", "8", "--accumulate", "2", "--output", str(acc)],
                   _env({"TF_CONFIG": tf_config(ports[2:], i)}), tmp_path / f"a{i}.log")
              for i in range(2)]
    codes = _wait(procs, 400)
    logs = [_read(tmp_path / f"{t}{i}.log") for t in "wa" for i in range(2)]
    assert codes == [0, 0, 0, 0], "\n=====\n".join(log[-2500:] for log in logs)
    assert "task worker:0 of 2;" in logs[0] and "(not the chief" in logs[1]
    m = _metrics(plain)
    assert m["status"] == "completed" and [e["epoch"] for e in m["epochs"]] == [1, 2]
    d = m["distribute"]
    assert (d["strategy"], d["workers"], d["replicas"], d["task"], d["is_chief"]) == \
        ("multi-worker", 2, 2, "worker:0", True)
    assert d["global_batch"] == 32 and m["epochs"][0]["steps"] == 512 // 32
    assert m["epochs"][-1]["val_accuracy"] >= TARGET_ACCURACY
    # the chief's outputs only; the other worker's temporary folders are gone
    leftovers = [os.path.join(r, n) for r, ds, fs in os.walk(tmp_path) for n in ds + fs
                 if "workertemp" in n]
    assert leftovers == []
    assert m["model_path"] and os.path.exists(m["model_path"])
    assert m["early_stop"]["model_epoch"] == m["early_stop"]["best_epoch"] == 2
    assert sorted(os.listdir(plain / "best")) == [
        "checkpoint", "epoch-1.data-00000-of-00001", "epoch-1.index",
        "epoch-2.data-00000-of-00001", "epoch-2.index"]
    a = _metrics(acc)
    assert a["distribute"]["strategy"] == "multi-worker"
    assert a["accumulation"] == {"micro_batch": 16, "accumulate": 2, "global_batch": 32}
    assert [r["step"] for r in a["steps"]] == [r["step"] for r in m["steps"]]   # updates
    for got, want in zip(_final_weights(acc), _final_weights(plain)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@ONCE_IN_THE_IMAGE
def test_killed_worker_restarted_resumes_from_the_backup(tmp_path):
    out = tmp_path / "run"
    ports = free_ports(2)
    epochs = 6
    procs = _start_workers(tmp_path, ports, out, epochs, "a", 1024)
    try:
        # wait for the first backup (the chief writes metrics.json after saving it)
        deadline = time.monotonic() + 240
        backed_up = 0
        while time.monotonic() < deadline and not backed_up:
            assert all(p.poll() is None for p in procs), _read(tmp_path / "a0.log")[-3000:]
            try:
                backed_up = len(_metrics(out)["epochs"])
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.1)
        assert backed_up, "no backup within 240 s"
        procs[1].send_signal(signal.SIGKILL)
        procs[1].wait()
        # TensorFlow cannot continue without the worker: the chief's collectives fail once
        # the peer stops sending heartbeats (or it finishes, if it was already past them).
        chief_code = _wait([procs[0]], 120)[0]
    finally:
        _wait(procs, 1)
    first_log = _read(tmp_path / "a0.log")
    done_before = len(_metrics(out)["epochs"])
    assert done_before < epochs, "the job finished before the kill: make epochs longer"
    assert chief_code == 4, first_log[-3000:]
    assert "error: multi-worker training lost a worker" in first_log
    assert "Traceback" not in first_log

    # restart both with the same command, as a cluster manager would
    codes = _wait(_start_workers(tmp_path, ports, out, epochs, "b", 1024), 300)
    logs = [_read(tmp_path / f"b{i}.log") for i in range(2)]
    assert codes == [0, 0], "\n=====\n".join(log[-2500:] for log in logs)
    for log in logs:
        assert f"at epoch {done_before + 1}" in log, log[-2000:]   # resumed, both workers
        ran = [int(n) for n in re.findall(r"^epoch (\d+)/", log, re.M)]
        assert ran == list(range(done_before + 1, epochs + 1))     # nothing before ran again
    m = _metrics(out)
    assert m["status"] == "completed"
    assert [e["epoch"] for e in m["epochs"]] == list(range(1, epochs + 1))
    steps = [e["steps"] for e in m["epochs"]]
    assert steps == [(i + 1) * (1024 // 32) for i in range(epochs)]  # the step count continued
