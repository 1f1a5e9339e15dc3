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

import pytest

from app import cli

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PER_POLICY = ("seconds_per_epoch", "samples_per_second", "speedup_vs_float32", "peak_memory",
              "val_accuracy", "accuracy_gap_points", "loss_scale", "skipped_steps")


@pytest.mark.parametrize("argv, words", [
    (["--policies", "fp8"], "policies must be a comma-separated list of float32, mixed_float16"),
    (["--policies", ""], "policies must be"),
    (["--repeats", "0"], "repeats must be at least 1"),
    (["--epochs", "1"], "epochs must exceed warmup_epochs"),
    (["--warmup-epochs", "-1"], "warmup_epochs must be 0 or more"),
    (["--model", "vgg"], "invalid choice: 'vgg'"),
    (["--model", "cnn", "--dataset", "cifar10"], "expects 28x28x1 images"),
    (["--loop", "custom", "--steps-per-execution", "4"], "applies to --loop fit only"),
    (["--repeats", "two"], "invalid int value: 'two'"),
    (["--timeout", "0"], "timeout must be positive"),
])
def test_bad_arguments_one_line_exit_2_nothing_written(tmp_path, capsys, argv, words):
    out = tmp_path / "bench"
    with pytest.raises(SystemExit) as exc_info:
        raise SystemExit(cli.main(["benchmark", "--output", str(out), *argv]))
    assert exc_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and words in err, err
    assert not out.exists()


def test_non_empty_output_refused(tmp_path, capsys):
    (tmp_path / "old.txt").write_text("x")
    assert cli.main(["benchmark", "--output", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "already exists" in err and "allowed:" in err and err.count("\n") == 1
    assert os.listdir(tmp_path) == ["old.txt"]


@pytest.mark.slow
def test_real_benchmark_on_cpu(tmp_path):
    out = tmp_path / "bench"
    cmd = [sys.executable, "-m", "app", "benchmark", "--model", "mlp", "--dataset", "synthetic",
           "--max-train-samples", "256", "--max-val-samples", "64", "--batch-size", "64",
           "--epochs", "2", "--repeats", "2", "--output", str(out),
           "--workspace", str(tmp_path / "ws")]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in ("benchmark.json", "benchmark.md", "benchmark.png", "env.json", "env.txt"):
        assert (out / name).stat().st_size > 0, name
    assert (out / "benchmark.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    doc = json.loads((out / "benchmark.json").read_text())
    env = json.loads((out / "env.json").read_text())
    assert "tensorflow" in env and doc["environment"]["tensorflow"] == env["tensorflow"]

    cpu_bf16 = env["hardware"]["cpu_avx512_bf16"] or env["hardware"]["cpu_amx"]
    expected_policies = ["float32", "mixed_bfloat16"] if cpu_bf16 else ["float32"]
    assert doc["policies_run"] == expected_policies
    skipped = {s["policy"]: s["reason"] for s in doc["skipped"]}
    assert "no GPU" in skipped["mixed_float16"]
    for p in expected_policies:
        r = doc["results"][p]
        assert r["runs_ok"] == 2
        for field in PER_POLICY:
            assert field in r, (p, field)
        assert r["samples_per_second"]["median"] > 0
        assert r["peak_memory"]["kind"] == "cpu_rss" and r["peak_memory"]["median"] > 0
        assert r["val_accuracy"]["median"] is not None
    assert doc["settings"]["jit"] is False and doc["settings"]["steps_per_execution"] == 1
    assert doc["warmup"]["epochs_excluded"] == 1

    runs = sorted(doc["runs"], key=lambda r: r["order"])
    assert [r["policy"] for r in runs] == expected_policies * 2
    assert [r["repeat"] for r in runs] == sorted(r["repeat"] for r in runs)
    assert all(r["policy_used"] == r["policy"] for r in runs)
    assert len({r["output_dir"] for r in runs}) == len(runs)  # one fresh process/folder each
    assert all(r["measured"]["epochs_timed"] == 1 for r in runs)

    table = (out / "benchmark.md").read_text()
    assert table.strip() in proc.stdout
    assert "| float32 |" in table and "Peak RSS of the CPU process (MiB)" in table


def test_settings_rejected_by_train_exit_2_and_remove_output(tmp_path, capsys):
    # Only the trainer can tell that MNIST is missing in an offline, empty workspace.
    out = tmp_path / "bench"
    rc = cli.main(["benchmark", "--dataset", "mnist", "--offline", "--workspace",
                   str(tmp_path / "ws"), "--epochs", "2", "--repeats", "1", "--output", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert err[-1].startswith("error: python -m app train rejected the settings: ")
    assert "data directory" in err[-1] and err[-1].count("allowed:") == 1
    assert not out.exists()


@pytest.mark.slow
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

    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
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
