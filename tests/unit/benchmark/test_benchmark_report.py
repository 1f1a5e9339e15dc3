"""benchmark.json / benchmark.md / benchmark.png from a full run with a fake trainer.

The fake launcher stands in for ``python -m app train`` (it writes the same metrics.json
fields), so these tests check the files, fields and order without TensorFlow.  The real
trainer is exercised by tests/unit/benchmark/test_benchmark_cli.py.
"""
from __future__ import annotations

import io
import json
import os

import pytest

from app.benchmark import report, suite

FAKE_ENV = {"tensorflow": "2.x-fake", "hardware": {"gpus": [], "cpu_avx512_bf16": True,
                                                   "cpu_amx": False}}
SETTINGS = {"model": "mlp", "dataset": "synthetic", "loop": "fit", "epochs": 2,
            "batch_size": 64, "max_train_samples": 256, "max_val_samples": 64,
            "steps_per_execution": None, "jit": False}
POLICY_FIELDS = ("seconds_per_epoch", "samples_per_second", "speedup_vs_float32", "peak_memory",
                 "memory_ratio_vs_float32", "val_accuracy", "accuracy_gap_points", "loss_scale",
                 "skipped_steps", "nonfinite_loss", "runs_ok", "runs_failed")


class FakeTrain:
    """Writes a metrics.json like the real trainer; remembers the order it was called in."""

    def __init__(self, fail_policy=None, input_rate=10_000.0):
        self.calls = []
        self.fail_policy = fail_policy
        self.input_rate = input_rate
        self.input_commands = []

    def __call__(self, cmd, log_path, timeout, env):
        if "app.benchmark.input_rate" in cmd:   # the input pipeline alone, first
            self.input_commands.append(cmd)
            # A list: one rate a timing, in turn (the last repeats).
            rates = self.input_rate if isinstance(self.input_rate, list) else [self.input_rate]
            rate = rates[min(len(self.input_commands), len(rates)) - 1]
            with open(log_path, "w") as fh:
                fh.write("$ fake\n" + json.dumps({"samples_per_second": rate,
                                                   "epochs": [], "layer_widths": None}) + "\n")
            return 0
        policy = cmd[cmd.index("--precision") + 1]
        out = cmd[cmd.index("--output") + 1]
        self.calls.append(policy)
        with open(log_path, "w") as fh:
            fh.write("fake\n" + ("error: boom\n" if policy == self.fail_policy else ""))
        if policy == self.fail_policy:
            return 3
        fast = {"float32": 1.0, "mixed_bfloat16": 1.2, "mixed_float16": 0.02}[policy]
        epochs = [{"loss": 0.5, "accuracy": 0.9, "val_loss": 0.5, "val_accuracy": 0.9,
                   "epoch_seconds": s / fast, "samples_per_second": 256 * fast / s,
                   "loss_scale": 32768.0 if policy == "mixed_float16" else None,
                   "skipped_steps": 0} for s in (5.0, 1.0)]
        doc = {"config": {"precision": policy}, "precision": {"policy": policy},
               "epochs": epochs, "peak_memory": {"kind": "cpu_rss", "bytes": 300 * 2**20},
               "status": "completed", "data": {"train_samples": 256}}
        with open(os.path.join(out, "metrics.json"), "w") as fh:
            json.dump(doc, fh)
        return 0


def _bench(tmp_path, policies=None, repeats=2, fail_policy=None, input_rate=10_000.0):
    fake = FakeTrain(fail_policy, input_rate)
    out = str(tmp_path / "bench")
    lines = []
    rc = suite.run_benchmark(dict(SETTINGS), policies, out, repeats=repeats, warmup_epochs=1,
                             max_accuracy_gap=1.0, launcher=fake, environment=FAKE_ENV,
                             echo=lines.append)
    return rc, out, fake, "\n".join(lines)


def test_files_fields_and_order(tmp_path):
    rc, out, fake, printed = _bench(tmp_path)
    assert rc == 0
    for name in suite.OUTPUT_FILES:
        assert os.path.getsize(os.path.join(out, name)) > 0, name
    assert not [f for f in os.listdir(out) if f.startswith(".tmp")]
    doc = json.load(open(os.path.join(out, "benchmark.json")))
    assert doc["policies_run"] == ["float32", "mixed_bfloat16"]
    for p in doc["policies_run"]:
        for field in POLICY_FIELDS:
            assert field in doc["results"][p], (p, field)
    assert doc["settings"]["jit"] is False and doc["settings"]["steps_per_execution"] == 1
    # interleaved A,B,A,B, both as planned and as actually run
    expected = ["float32", "mixed_bfloat16"] * 2
    assert fake.calls == expected
    assert [r["policy"] for r in sorted(doc["runs"], key=lambda r: r["order"])] == expected
    assert all(len(r["load_average"]) == 2 for r in doc["runs"])
    starts = [r["started_utc"] for r in doc["runs"]]
    assert starts == sorted(starts)
    assert doc["interleaving"]["order"] == ["float32#1", "mixed_bfloat16#1",
                                            "float32#2", "mixed_bfloat16#2"]
    su = doc["results"]["mixed_bfloat16"]["speedup_vs_float32"]["median"]
    assert su == pytest.approx(1.2)
    # skipped policy with reason, in JSON and in the printed table
    assert doc["skipped"][0]["policy"] == "mixed_float16" and "no GPU" in doc["skipped"][0]["reason"]
    assert "mixed_float16: no GPU" in printed
    assert "| mixed_bfloat16 |" in printed and "1.20x" in printed
    # s/epoch to three significant digits (0.833 s showed as 0.83, a 0.0345 s epoch as 0.03)
    assert "| float32 | 1.00 |" in printed and "| mixed_bfloat16 | 0.833 |" in printed, printed
    assert "Peak RSS of the CPU process (MiB)" in printed
    assert open(os.path.join(out, "benchmark.md")).read().strip() in printed


def test_chart_is_a_png(tmp_path):
    _, out, _, _ = _bench(tmp_path, repeats=1)
    path = os.path.join(out, "benchmark.png")
    with open(path, "rb") as fh:
        data = fh.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image as mpimg

    img = mpimg.imread(io.BytesIO(data), format="png")
    assert img.shape[0] > 100 and img.shape[1] > 300


def test_failed_policy_is_recorded_and_exit_1(tmp_path):
    rc, out, _, printed = _bench(tmp_path, policies=["mixed_float16"], repeats=1,
                                 fail_policy="mixed_float16")
    assert rc == 1
    doc = json.load(open(os.path.join(out, "benchmark.json")))
    assert doc["status"] == "partial" and doc["baseline_added"] is True
    assert doc["results"]["mixed_float16"]["runs_failed"] == 1
    assert doc["diagnoses"][0]["code"] == "run_failed"
    assert "error: boom" in doc["diagnoses"][0]["message"]
    assert "failed (1 runs)" in printed


def test_write_atomic_leaves_old_file_on_error(tmp_path):
    path = str(tmp_path / "x.json")
    report.write_atomic(path, "old")


    with pytest.raises(TypeError):
        report.write_atomic(path, 123)  # neither str nor bytes
    assert open(path).read() == "old"
    assert os.listdir(tmp_path) == ["x.json"]


def test_rejected_settings_empty_the_users_folder_but_keep_it(tmp_path):
    from app.core.errors import UsageError

    def rejects(cmd, log_path, timeout, env):
        with open(log_path, "w") as fh:
            fh.write("noise\nerror: dataset 'mnist' not found; allowed: put mnist.npz there\n")
        return 2

    out = tmp_path / "mine"
    out.mkdir()
    with pytest.raises(UsageError) as exc_info:
        suite.run_benchmark(dict(SETTINGS), None, str(out), repeats=2, warmup_epochs=1,
                            max_accuracy_gap=1.0, launcher=rejects, environment=FAKE_ENV)
    assert exc_info.value.line() == ("error: tfmp train rejected the settings: dataset "
                                     "'mnist' not found; allowed: put mnist.npz there")
    assert out.is_dir() and list(out.iterdir()) == []


def test_a_run_whose_code_raised_stops_the_benchmark_and_shows_the_traceback(tmp_path, capsys):
    """The user's model file has a syntax error: every run would fail on it.  The first one
    stops the benchmark (three failed runs and a report of them before), its traceback and
    train's line are shown, and the folder the benchmark made goes."""
    from app.core.errors import ReportedError

    calls = []
    trace = ('Traceback (most recent call last):\n  File "/w/syn.py", line 2\n'
             '    return None\nSyntaxError: invalid syntax\n')
    line = ("error: your code raised SyntaxError while importing ./syn.py (./syn.py:build): "
            "invalid syntax (syn.py, line 2) (the traceback above points at the line)")

    def raises(cmd, log_path, timeout, env):
        calls.append(cmd)
        with open(log_path, "w") as fh:
            fh.write("$ tfmp train ...\n" + trace + line + "\n")
        return 1

    out = tmp_path / "bench"
    with pytest.raises(ReportedError) as exc_info:
        suite.run_benchmark(dict(SETTINGS), None, str(out), repeats=3, warmup_epochs=1,
                            max_accuracy_gap=1.0, launcher=raises, environment=FAKE_ENV)
    assert exc_info.value.line() == line and exc_info.value.exit_status == 1
    assert len(calls) == 1   # the input pipeline's child, the first to import the code
    assert capsys.readouterr().err.endswith(trace)
    assert not out.exists()


def test_input_pipeline_rate_recorded_and_input_bound_said(tmp_path):
    # The fake trains mixed_bfloat16 at 307 samples/s after warm-up; a pipeline of 330
    # samples/s alone makes that 93%: input-bound.
    rc, out, fake, printed = _bench(tmp_path, input_rate=330.0)
    assert rc == 0
    doc = json.load(open(os.path.join(out, "benchmark.json")))
    ip = doc["input_pipeline"]
    assert ip["samples_per_second"] == 330.0 and 0.9 < ip["training_share"] < 0.95
    assert len(fake.input_commands) == 1 and "--model" in fake.input_commands[0]
    assert "retimed" not in ip
    codes = [d["code"] for d in doc["diagnoses"]]
    assert "input_bound" in codes
    assert "Input pipeline alone" in printed and "input-bound" in printed
    # the built-in mlp's widths come from layout's table
    assert doc["layer_widths"] == {"widths": [512, 256], "note": None}


def test_a_pipeline_timing_the_runs_outran_is_timed_again(tmp_path):
    # First timing 100 samples/s (a busy moment), the runs then trained at 307: impossible
    # for the pipeline's own rate, so it is timed again after them, at 330: input-bound.
    rc, out, fake, printed = _bench(tmp_path, input_rate=[100.0, 330.0])
    assert rc == 0
    assert len(fake.input_commands) == 2 and fake.input_commands[0] == fake.input_commands[1]
    doc = json.load(open(os.path.join(out, "benchmark.json")))
    ip = doc["input_pipeline"]
    assert ip["samples_per_second"] == 330.0 and ip["first_timing"] == 100.0
    assert ip["retimed"]["samples_per_second"] == 330.0
    assert ip["retimed"]["log"] == os.path.join(out, suite.RETIMED_LOG)
    assert os.path.getsize(os.path.join(out, "input_pipeline.log")) > 0
    assert os.path.getsize(os.path.join(out, suite.RETIMED_LOG)) > 0
    codes = [d["code"] for d in doc["diagnoses"]]
    assert "input_bound" in codes and "input_rate_mistimed" not in codes
    assert "timed again after the runs, which outran its first timing of 100" in printed


def test_a_second_timing_that_is_slower_keeps_the_first_and_says_mistimed(tmp_path):
    rc, out, fake, _ = _bench(tmp_path, input_rate=[100.0, 90.0])
    doc = json.load(open(os.path.join(out, "benchmark.json")))
    ip = doc["input_pipeline"]
    assert len(fake.input_commands) == 2
    assert ip["samples_per_second"] == 100.0 and ip["retimed"]["samples_per_second"] == 90.0
    assert "input_rate_mistimed" in [d["code"] for d in doc["diagnoses"]]


def test_a_second_timing_that_fails_keeps_the_first(tmp_path):
    class SecondFails(FakeTrain):
        def __call__(self, cmd, log_path, timeout, env):
            if "app.benchmark.input_rate" in cmd and self.input_commands:
                self.input_commands.append(cmd)
                with open(log_path, "w") as fh:
                    fh.write("$ fake\nKilled\n")
                return -9
            return super().__call__(cmd, log_path, timeout, env)

    fake = SecondFails(input_rate=100.0)
    out = str(tmp_path / "bench")
    rc = suite.run_benchmark(dict(SETTINGS), None, out, repeats=1, warmup_epochs=1,
                             max_accuracy_gap=1.0, launcher=fake, environment=FAKE_ENV,
                             echo=lambda s: None)
    assert rc == 0
    ip = json.load(open(os.path.join(out, "benchmark.json")))["input_pipeline"]
    assert ip["samples_per_second"] == 100.0 and ip["retimed"]["error"] == "timed out"


def test_fast_input_pipeline_is_not_called_input_bound(tmp_path):
    rc, out, _, printed = _bench(tmp_path, input_rate=100_000.0)
    doc = json.load(open(os.path.join(out, "benchmark.json")))
    assert doc["input_pipeline"]["training_share"] < 0.01
    assert "input_bound" not in [d["code"] for d in doc["diagnoses"]]
    assert "Input pipeline alone" in printed


class FakeTrainAtBatches(FakeTrain):
    """Like FakeTrain, and samples/s grows with the batch size (as mixed precision's
    larger batch would make it); remembers (policy, batch) of every run."""

    def __init__(self):
        super().__init__()
        self.batches = []

    def __call__(self, cmd, log_path, timeout, env):
        rc = super().__call__(cmd, log_path, timeout, env)
        if "--precision" in cmd:
            batch = int(cmd[cmd.index("--batch-size") + 1])
            self.batches.append((cmd[cmd.index("--precision") + 1], batch))
            path = os.path.join(cmd[cmd.index("--output") + 1], "metrics.json")
            doc = json.load(open(path))
            for e in doc["epochs"]:
                e["samples_per_second"] *= batch / 64
            doc["peak_memory"]["bytes"] = batch * 2**20
            json.dump(doc, open(path, "w"))
        return rc


def test_each_policy_at_its_own_best_batch(tmp_path):
    fake = FakeTrainAtBatches()
    out = str(tmp_path / "bench")
    lines = []
    rc = suite.run_benchmark(dict(SETTINGS), None, out, repeats=2, warmup_epochs=1,
                             max_accuracy_gap=1.0, launcher=fake, environment=FAKE_ENV,
                             echo=lines.append,
                             best_batches={"float32": 128, "mixed_bfloat16": 256,
                                           "mixed_float16": 512},
                             best_batch_source="t/tune.json")
    assert rc == 0
    # equal-batch runs first (A,B,A,B at 64), then each at its own best, interleaved too;
    # mixed_float16 is not in the plan on this CPU, so it is not run at its best either
    assert fake.batches == [("float32", 64), ("mixed_bfloat16", 64)] * 2 + \
        [("float32", 128), ("mixed_bfloat16", 256)] * 2
    doc = json.load(open(os.path.join(out, "benchmark.json")))
    assert doc["results"]["mixed_bfloat16"]["speedup_vs_float32"]["median"] == pytest.approx(1.2)
    best = doc["results_best_batch"]
    assert best["source"] == "t/tune.json"
    res = best["results"]
    assert list(res) == ["float32", "mixed_bfloat16"]
    assert (res["float32"]["batch_size"], res["mixed_bfloat16"]["batch_size"]) == (128, 256)
    # 1.2x the speed, and twice the batch: 2.4x float32 at its own best
    assert res["mixed_bfloat16"]["speedup_vs_float32"]["median"] == pytest.approx(2.4)
    assert res["mixed_bfloat16"]["peak_memory"]["median"] == 256 * 2**20
    assert [r["series"] for r in doc["runs"]].count("best_batch") == 4
    assert doc["interleaving"]["order"][-1] == "mixed_bfloat16#2@b256"
    printed = "\n".join(lines)
    assert "Each at its own best batch (from t/tune.json)" in printed
    assert "| mixed_bfloat16 | 256 |" in printed and "2.40x" in printed
    assert "results_best_batch" in doc and doc["results_best_batch"]["not_run"] == {}


def test_without_a_tune_the_benchmark_is_as_before(tmp_path):
    rc, out, fake, printed = _bench(tmp_path)
    doc = json.load(open(os.path.join(out, "benchmark.json")))
    assert doc["results_best_batch"] is None and "own best batch" not in printed
    assert len(fake.calls) == 4
