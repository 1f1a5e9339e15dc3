"""``python -m app benchmark`` end to end on the CPU with the real trainer, and bad input.

Tiny settings: synthetic data, the MLP, 256 training samples, 2 epochs (1 warm-up).  The
default policy list on a CPU leaves mixed_float16 out (emulated float16 is tens of times
slower), so it also shows up as skipped with its reason.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from app import cli

from tests.paths import ROOT
from tests.unit.helpers import ONCE_IN_THE_IMAGE

# The image's self-test leaves these to tests/image/test_your_model.py, which benchmarks a
# user's model and data inside the image on TF 2.9; what is left here (diagnoses, the
# pass-through of flags) is the same Python on any TensorFlow.
BENCHMARKED_IN_THE_IMAGE = ("a user's model and data are benchmarked on TF 2.9 by "
                            "tests/image/test_your_model.py")

PER_POLICY = ("seconds_per_epoch", "samples_per_second", "speedup_vs_float32", "peak_memory",
              "val_accuracy", "accuracy_gap_points", "loss_scale", "skipped_steps")


@pytest.mark.parametrize("argv, words", [
    (["--policies", "fp8"], "policies must be a comma-separated list of float32, mixed_float16"),
    (["--policies", ""], "argument --policies: is empty"),
    (["--policies", "float32,,mixed_bfloat16"], "policies must be a comma-separated list"),
    (["--repeats", "0"], "repeats must be at least 1"),
    (["--epochs", "1"], "epochs must exceed warmup_epochs"),
    (["--warmup-epochs", "-1"], "warmup_epochs must be 0 or more"),
    (["--model", "vgg"], "model must be one of mlp, cnn, resnet or MODULE:FUNCTION"),
    (["--model", "./no_such_file.py:build"], "file './no_such_file.py' does not exist"),
    (["--model", "no_such_module_xyz:build"], "no module named 'no_such_module_xyz'"),
    (["--dataset", "mnist:"], "is not MODULE:FUNCTION"),
    (["--model", "cnn", "--dataset", "cifar10"], "expects 28x28x1 images"),
    (["--loop", "custom", "--steps-per-execution", "4"], "applies to --loop fit only"),
    (["--repeats", "two"], "invalid int value: 'two'"),
    (["--timeout", "0"], "timeout must be positive"),
    (["--tuned", "no_such_tune.json"], "--tuned 'no_such_tune.json' does not exist"),
    (["--tuned", "t.json", "--best-batch"], "not allowed with argument"),
])
def test_bad_arguments_one_line_exit_2_nothing_written(tmp_path, capsys, argv, words):
    out = tmp_path / "bench"
    with pytest.raises(SystemExit) as exc_info:
        raise SystemExit(cli.main(["benchmark", "--output", str(out), *argv]))
    assert exc_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and words in err, err
    assert not out.exists()


@pytest.mark.parametrize("name, value", [("TFMP_EPOCHS", "lots"), ("TFMP_PRECISION", "fp16"),
                                         ("TFMP_SCALE_LR", "cubic")])
def test_a_bad_variable_the_benchmark_does_not_read_is_refused_as_train_refuses_it(
        tmp_path, capsys, monkeypatch, name, value):
    """TFMP_EPOCHS and TFMP_PRECISION are the benchmark's own (--epochs, --policies), so it
    does not read them; a bad one was ignored without a word (a full report, rc 0), where
    train and tune refuse it."""
    monkeypatch.setenv(name, value)
    out = tmp_path / "bench"
    rc = cli.main(["benchmark", "--model", "mlp", "--dataset", "synthetic", "--output", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    assert err.startswith("error: ") and f"{name}={value!r}" in err, err   # train's line
    assert not out.exists()


@pytest.mark.parametrize("doc, words", [
    ('{"schema": ', "not a usable tune file"),
    (json.dumps({"schema": "tfmp.tune/1", "task": {"model": "resnet", "dataset": "cifar10"}}),
     "tuned for another job"),
])
def test_a_damaged_or_foreign_tune_is_one_line_exit_2(tmp_path, capsys, doc, words):
    from app.tuner.report import SCHEMA

    tune = tmp_path / "tune.json"
    tune.write_text(doc.replace("tfmp.tune/1", SCHEMA), encoding="utf-8")
    out = tmp_path / "bench"
    assert cli.main(["benchmark", "--model", "mlp", "--dataset", "synthetic",
                     "--tuned", str(tune), "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and words in err, err
    assert not out.exists()


def test_non_empty_output_refused(tmp_path, capsys):
    (tmp_path / "old.txt").write_text("x")
    assert cli.main(["benchmark", "--output", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "already exists" in err and "allowed:" in err and err.count("\n") == 1
    assert os.listdir(tmp_path) == ["old.txt"]


def test_two_benchmarks_without_output_in_the_same_second_get_a_folder_each(tmp_path,
                                                                          monkeypatch):
    """Both took <workspace>/benchmarks/<second>-mlp, found it new or empty, and wrote their
    runs into it (and a rejected setting in one removed the other's).  The default folder
    is now made the benchmark's own once its checks pass: the second takes -2."""
    from app.benchmark import suite
    from app.training import config

    monkeypatch.setattr(config, "utc_stamp", lambda now=None: "20261207T170000Z")
    given = []
    monkeypatch.setattr(suite, "run_benchmark",
                        lambda settings, policies, output, **kw: given.append(
                            (output, kw["output_made"])) or 0)
    for _ in range(2):
        assert cli.main(["benchmark", "--model", "mlp", "--dataset", "synthetic",
                         "--workspace", str(tmp_path)]) == 0
    base = str(tmp_path / "benchmarks" / "20261207T170000Z-mlp")
    assert given == [(base, True), (f"{base}-2", True)]
    assert os.path.isdir(base) and os.path.isdir(f"{base}-2")


def test_an_interrupted_benchmarks_folder_says_how_to_run_it_again(tmp_path, capsys):
    """After Ctrl-C the rerun said only "already exists and is not an empty folder" (a QA
    pass); its partial runs are kept."""
    out = tmp_path / "bench"
    (out / "runs" / "00").mkdir(parents=True)
    (out / "input_pipeline.log").write_text("x")
    assert cli.main(["benchmark", "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: output {str(out)!r} holds an interrupted benchmark (runs/ and no "
                   f"benchmark.json); allowed: a new --output, or that folder removed first "
                   f"(rm -r {out}) to run it again there\n")
    assert sorted(os.listdir(out)) == ["input_pipeline.log", "runs"]


@pytest.fixture(scope="module")
def real_benchmark(tmp_path_factory):
    """One real ``benchmark`` run on the CPU (2 repeats, 2 epochs, 1 warm-up), shared by the
    tests of TestRealBenchmarkOnCpu: what it wrote, printed and measured."""
    tmp_path = tmp_path_factory.mktemp("real-benchmark")
    out = tmp_path / "bench"
    cmd = [sys.executable, "-m", "app", "benchmark", "--model", "mlp", "--dataset", "synthetic",
           "--max-train-samples", "256", "--max-val-samples", "64", "--batch-size", "64",
           "--epochs", "2", "--repeats", "2", "--output", str(out),
           "--workspace", str(tmp_path / "ws")]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((out / "benchmark.json").read_text())
    env = json.loads((out / "env.json").read_text())
    cpu_bf16 = env["hardware"]["cpu_avx512_bf16"] or env["hardware"]["cpu_amx"]
    return SimpleNamespace(out=out, proc=proc, doc=doc, env=env,
                           expected_policies=["float32", "mixed_bfloat16"] if cpu_bf16
                           else ["float32"])


# One group: under pytest-xdist every test here runs on the worker that ran the fixture (one run).
@ONCE_IN_THE_IMAGE
@pytest.mark.slow
@pytest.mark.xdist_group("real_benchmark")
class TestRealBenchmarkOnCpu:
    def test_exits_0_and_writes_every_file(self, real_benchmark):
        out = real_benchmark.out
        assert real_benchmark.proc.returncode == 0, real_benchmark.proc.stderr[-3000:]
        for name in ("benchmark.json", "benchmark.md", "benchmark.png", "env.json", "env.txt"):
            assert (out / name).stat().st_size > 0, name
        assert (out / "benchmark.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    def test_the_environment_is_env_json(self, real_benchmark):
        doc, env = real_benchmark.doc, real_benchmark.env
        assert "tensorflow" in env and doc["environment"]["tensorflow"] == env["tensorflow"]

    def test_policies_run_and_mixed_float16_skipped_for_no_gpu(self, real_benchmark):
        doc = real_benchmark.doc
        assert doc["policies_run"] == real_benchmark.expected_policies
        skipped = {s["policy"]: s["reason"] for s in doc["skipped"]}
        assert "no GPU" in skipped["mixed_float16"]

    def test_each_policy_has_its_results(self, real_benchmark):
        for p in real_benchmark.expected_policies:
            r = real_benchmark.doc["results"][p]
            assert r["runs_ok"] == 2
            for field in PER_POLICY:
                assert field in r, (p, field)
            assert r["samples_per_second"]["median"] > 0
            assert r["peak_memory"]["kind"] == "cpu_rss" and r["peak_memory"]["median"] > 0
            assert r["val_accuracy"]["median"] is not None

    def test_settings_and_warmup(self, real_benchmark):
        doc = real_benchmark.doc
        assert doc["settings"]["jit"] is False and doc["settings"]["steps_per_execution"] == 1
        assert doc["warmup"]["epochs_excluded"] == 1

    def test_runs_in_order_each_in_its_own_process_and_folder(self, real_benchmark):
        runs = sorted(real_benchmark.doc["runs"], key=lambda r: r["order"])
        assert [r["policy"] for r in runs] == real_benchmark.expected_policies * 2
        assert [r["repeat"] for r in runs] == sorted(r["repeat"] for r in runs)
        assert all(r["policy_used"] == r["policy"] for r in runs)
        assert len({r["output_dir"] for r in runs}) == len(runs)  # one fresh process/folder each
        assert all(r["measured"]["epochs_timed"] == 1 for r in runs)

    def test_the_table_is_printed_and_written(self, real_benchmark):
        table = (real_benchmark.out / "benchmark.md").read_text()
        assert table.strip() in real_benchmark.proc.stdout
        assert "| float32 |" in table and "Peak RSS of the CPU process (MiB)" in table


@pytest.mark.slow
@pytest.mark.host_only(reason=BENCHMARKED_IN_THE_IMAGE)
def test_tuned_benchmark_really_trains_each_policy_at_its_tuned_batch(tmp_path):
    """`benchmark --tuned`: after the equal-batch runs, real `tfmp train` runs at the tune's
    best batch, recorded in their own metrics.json and in results_best_batch."""
    from app.tuner import report

    tune = {"schema": report.SCHEMA, "task": {"model": "mlp", "dataset": "synthetic"},
            "budget_bytes": 2**30, "margin": 0.1,
            "precisions": {"float32": {"max_batch": 96, "best_batch": 48,
                                       "best_samples_per_second": 900.0, "trials": []}},
            "choice": {"precision": "float32", "batch_size": 48, "samples_per_second": 900.0},
            "verified": {"fits": True, "precision": "float32", "batch_size": 48}}
    (tmp_path / "tune.json").write_text(json.dumps(tune))
    out = tmp_path / "bench"
    cmd = [sys.executable, "-m", "app", "benchmark", "--model", "mlp", "--dataset", "synthetic",
           "--policies", "float32", "--max-train-samples", "192", "--max-val-samples", "64",
           "--batch-size", "32", "--epochs", "1", "--warmup-epochs", "0", "--repeats", "1",
           "--tuned", str(tmp_path / "tune.json"), "--output", str(out),
           "--workspace", str(tmp_path / "ws")]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((out / "benchmark.json").read_text())
    runs = {r["series"]: r for r in doc["runs"]}
    assert set(runs) == {"equal_batch", "best_batch"}, doc["runs"]
    for series, batch in (("equal_batch", 32), ("best_batch", 48)):
        metrics = json.loads((Path(runs[series]["output_dir"]) / "metrics.json").read_text())
        assert metrics["config"]["batch_size"] == batch, series
        assert metrics["status"] == "completed"
    best = doc["results_best_batch"]
    assert best["source"] == str(tmp_path / "tune.json")
    assert best["results"]["float32"]["batch_size"] == 48
    assert best["results"]["float32"]["samples_per_second"]["median"] > 0
    assert "Each at its own best batch" in proc.stdout and "| float32 | 48 |" in proc.stdout


@ONCE_IN_THE_IMAGE
def test_settings_rejected_by_train_exit_2_and_remove_output(tmp_path, capsys):
    # Only the trainer can tell that MNIST is missing in an offline, empty workspace.
    out = tmp_path / "bench"
    rc = cli.main(["benchmark", "--dataset", "mnist", "--offline", "--workspace",
                   str(tmp_path / "ws"), "--epochs", "2", "--repeats", "1", "--output", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert err[-1].startswith("error: tfmp train rejected the settings: ")
    assert "dataset 'mnist' not found: no mnist.npz in " in err[-1]
    assert "downloads are off" in err[-1] and err[-1].count("allowed:") == 1
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.host_only(reason=BENCHMARKED_IN_THE_IMAGE)
def test_named_mixed_float16_runs_on_cpu_and_is_explained(tmp_path):
    # Microscopic: float16 on a CPU is emulated and very slow.
    out = tmp_path / "bench"
    cmd = [sys.executable, "-m", "app", "benchmark", "--model", "mlp", "--dataset", "synthetic",
           "--policies", "mixed_float16", "--max-train-samples", "64", "--max-val-samples", "32",
           "--batch-size", "32", "--epochs", "2", "--repeats", "1", "--output", str(out),
           "--workspace", str(tmp_path / "ws")]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((out / "benchmark.json").read_text())
    assert doc["policies_run"] == ["float32", "mixed_float16"] and doc["baseline_added"]
    assert doc["skipped"] == []
    fp16 = doc["results"]["mixed_float16"]
    assert fp16["runs_ok"] == 1 and fp16["loss_scale"]["median"] > 1  # loss scaling was on
    assert "fp16_on_cpu" in [d["code"] for d in doc["diagnoses"]]


def test_sigterm_stops_the_running_training_process(tmp_path):
    # `docker stop` or a scheduler sends SIGTERM to the benchmark; its child must not linger.
    script = tmp_path / "bench.py"
    pidfile = tmp_path / "child.pid"
    script.write_text(f"""
import subprocess, sys
from app.benchmark import runner

def launcher(cmd, log_path, timeout, env):
    def popen(*a, **k):
        p = real_popen([sys.executable, "-c", "import time; time.sleep(120)"], **k)
        open({str(pidfile)!r}, "w").write(str(p.pid))
        return p
    real_popen, subprocess.Popen = subprocess.Popen, popen
    try:
        return runner.subprocess_launcher(cmd, log_path, timeout, env)
    finally:
        subprocess.Popen = real_popen

runner.run_schedule([{{"order": 0, "repeat": 1, "policy": "float32"}}], {{"model": "mlp"}},
                    {str(tmp_path / "runs")!r}, 1, launcher=launcher)
""")
    import signal
    import time

    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, str(script)], cwd=ROOT, env=env)
    try:
        for _ in range(200):
            if pidfile.exists() and pidfile.read_text():
                break
            time.sleep(0.05)
        child = int(pidfile.read_text())
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
        for _ in range(100):
            if not os.path.exists(f"/proc/{child}") or \
                    open(f"/proc/{child}/stat").read().split()[2] == "Z":
                break
            time.sleep(0.05)
        else:
            os.kill(child, signal.SIGKILL)
            raise AssertionError("the training process outlived the benchmark")
    finally:
        if proc.poll() is None:
            proc.kill()


# ---- your own model and data -------------------------------------------------------------------

USER_MODEL = '''
import tensorflow as tf


def build(input_shape, num_classes):
    inputs = tf.keras.Input(shape=input_shape)
    x = tf.keras.layers.Flatten()(inputs)
    x = tf.keras.layers.Dense(20, activation="relu")(x)     # 20: not a multiple of 8
    x = tf.keras.layers.Dense(num_classes)(x)
    outputs = tf.keras.layers.Activation("softmax", dtype="float32")(x)
    return tf.keras.Model(inputs, outputs)
'''

FAST_DATA = '''
import numpy as np


def load(seed):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, size=320).astype("int32")
    x = (rng.normal(size=(320, 12)) + y[:, None]).astype("float32")
    return (x[:256], y[:256]), (x[256:], y[256:])
'''

# Every training sample waits 2 s in a Python function, one at a time, four samples an
# epoch: the data, not the model, sets the pace (at most 0.5 samples/s). A sleep does not
# slow down on a busy machine while the model's steps do. Few long waits, not many short
# ones: on a loaded machine each sample's hand-offs between TF's threads and Python cost
# more, and with 16 samples of 0.2 s a CI machine under the image's self-test timed the
# pipeline alone at 3.1 samples/s where it trained at 4.9. Long ones, not 0.8 s: once a CI
# machine under the self-test stalled the timed training epoch 1.5 s beyond its 3.2 s of
# waits (0.83 samples/s against the pipeline's 1.2, 69%, under the 80% the diagnosis asks);
# 8 s of waits keep such a stall at under a fifth of the epoch.
SLOW_DATA = '''
import time

import numpy as np
import tensorflow as tf


def _slow(x):
    time.sleep(2.0)
    return x


def load():
    rng = np.random.default_rng(0)
    y = np.array([0, 1, 2, 0] + [0, 1, 2] * 4, dtype="int32")
    x = (rng.normal(size=(16, 12)) + y[:, None]).astype("float32")
    train = tf.data.Dataset.from_tensor_slices((x[:4], y[:4])).map(
        lambda a, b: (tf.ensure_shape(tf.py_function(_slow, [a], tf.float32), [12]), b))
    val = tf.data.Dataset.from_tensor_slices((x[4:], y[4:]))
    return train, val
'''


def _user_benchmark(tmp_path, model, dataset, *extra):
    """Run from the user's folder, with relative specs, as a user would."""
    out = tmp_path / "bench"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "app", "benchmark", "--model", model, "--dataset", dataset,
           "--batch-size", "16", "--epochs", "2", "--repeats", "1", "--output", "bench",
           "--workspace", "ws", *extra]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=900)
    return proc, out


@pytest.mark.slow
@pytest.mark.host_only(reason=BENCHMARKED_IN_THE_IMAGE)
@pytest.mark.in_containers(
    reason=BENCHMARKED_IN_THE_IMAGE,
    twins=("tests/image/test_your_model.py::test_user_model_is_benchmarked_over_ssh",))
def test_user_model_and_dataset_benchmark(tmp_path):
    (tmp_path / "nets").mkdir()
    (tmp_path / "nets" / "small.py").write_text(USER_MODEL)
    (tmp_path / "mydata.py").write_text(FAST_DATA)
    proc, out = _user_benchmark(tmp_path, "./nets/small.py:build", "mydata:load",
                                "--policies", "float32,mixed_bfloat16")
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((out / "benchmark.json").read_text())
    assert doc["settings"]["model"] == "./nets/small.py:build"
    assert doc["settings"]["dataset"] == "mydata:load"
    assert doc["policies_run"] == ["float32", "mixed_bfloat16"]
    for p in doc["policies_run"]:
        assert doc["results"][p]["runs_ok"] == 1
        assert doc["results"][p]["samples_per_second"]["median"] > 0
    runs = doc["runs"]
    assert all("./nets/small.py:build" in r["command"] for r in runs)
    ip = doc["input_pipeline"]
    assert ip["samples_per_second"] > 0 and ip["train_samples"] == 256
    # --epochs 2 is one warm-up and one timed epoch; the pipeline times two at least
    assert [e["samples"] for e in ip["epochs"]] == [256, 256, 256]
    # the user's model was built once in the input-rate child: its hidden width is checked
    assert doc["layer_widths"]["widths"] == [20]
    eight = [d for d in doc["diagnoses"] if d["code"] == "not_multiple_of_8"]
    assert eight and "layer widths 20" in eight[0]["message"]
    assert "Input pipeline alone" in proc.stdout


@pytest.mark.slow
@pytest.mark.host_only(reason=BENCHMARKED_IN_THE_IMAGE)
def test_slow_user_pipeline_is_diagnosed_input_bound(tmp_path):
    (tmp_path / "small.py").write_text(USER_MODEL)
    (tmp_path / "slowdata.py").write_text(SLOW_DATA)
    proc, out = _user_benchmark(tmp_path, "small.py:build", "slowdata.py:load",
                                "--policies", "float32", "--batch-size", "4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((out / "benchmark.json").read_text())
    ip = doc["input_pipeline"]
    assert 0 < ip["samples_per_second"] <= 0.5   # 2 s a sample
    bound = [d for d in doc["diagnoses"] if d["code"] == "input_bound"]
    assert bound, ({k: ip.get(k) for k in ("epochs", "first_timing", "retimed")},
                   doc["results"]["float32"]["samples_per_second"])
    assert "input-bound" in proc.stdout and "num_parallel_calls=tf.data.AUTOTUNE" in proc.stdout


@pytest.mark.parametrize("model, dataset, words", [
    ("./nets/none.py:build", "synthetic", "file './nets/none.py' does not exist"),
    ("mlp", "nosuchmodule_abc:load", "no module named 'nosuchmodule_abc'"),
    ("small.py:nothing_here", "synthetic", "nothing_here"),    # found by the child
])
@ONCE_IN_THE_IMAGE
def test_bad_user_specs_one_line_exit_2_nothing_written(tmp_path, model, dataset, words):
    (tmp_path / "small.py").write_text(USER_MODEL)
    proc, out = _user_benchmark(tmp_path, model, dataset)
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and words in errors[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert not out.exists() and not (tmp_path / "ws").exists()


def test_best_batch_tunes_the_benchmarks_own_job_first(tmp_path, monkeypatch):
    """--best-batch: the tuner gets the benchmark's task and policies, its best batches
    are what the second set of runs uses."""
    from app.commands import benchmark
    from app.tuner import tuning as api

    calls = []

    def fake_tune(model, data, **kw):
        calls.append((model, data, kw))
        return {"precisions": {"float32": {"best_batch": 128},
                               "mixed_bfloat16": {"best_batch": 512},
                               "mixed_float16": {"best_batch": None}}}

    monkeypatch.setattr(api, "tune", fake_tune)
    settings = {"model": "resnet", "dataset": "synthetic", "learning_rate": 0.01,
                "max_train_samples": 512, "jit": False, "offline": True, "workspace": "ws"}
    best = benchmark.tune_first(settings, ["float32", "mixed_bfloat16"], str(tmp_path / "b"))
    assert best == {"float32": 128, "mixed_bfloat16": 512}
    (model, data, kw), = calls
    assert (model, data) == ("resnet", "synthetic")
    assert kw["precision"] == "float32,mixed_bfloat16" and kw["learning_rate"] == 0.01
    assert kw["output"] == str(tmp_path / "b" / "tune") and kw["max_train_samples"] == 512
