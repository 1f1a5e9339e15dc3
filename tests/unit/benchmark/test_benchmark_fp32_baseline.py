"""``benchmark --fp32-baseline tf32|strict|both`` with fake hardware and a fake trainer: which
float32 runs (``--tf32 off`` for strict), what each run records about TF32, and the
explanation with and without TF32 hardware."""
from __future__ import annotations

import json
import os

import pytest

from app.benchmark import baseline, suite
from app.machine.hardware import HardwareInfo, make_gpu

A100 = {"tensorflow": "2.9.3", "hardware": {"gpus": [
    {"name": "A100-SXM4-40GB", "compute_capability": [8, 0], "memory_bytes": 40 * 2**30}],
    "cpu_avx512_bf16": False, "cpu_amx": False}}
T4 = {"tensorflow": "2.9.3", "hardware": {"gpus": [
    {"name": "Tesla T4", "compute_capability": [7, 5], "memory_bytes": 15 * 2**30}],
    "cpu_avx512_bf16": False, "cpu_amx": False}}
SETTINGS = {"model": "mlp", "dataset": "synthetic", "loop": "fit", "epochs": 2,
            "batch_size": 64, "max_train_samples": 256, "max_val_samples": 64,
            "steps_per_execution": None, "jit": False}
# samples/s on the fake A100: TF32 float32 is already 2x strict float32; fp16 is 3x strict.
RATE = {("float32", "on"): 2000.0, ("float32", "off"): 1000.0, ("mixed_float16", "on"): 3000.0}


class FakeTrain:
    def __init__(self, env):
        self.env, self.calls = env, []

    def __call__(self, cmd, log_path, timeout, env):
        if "app.benchmark.input_rate" in cmd:
            with open(log_path, "w") as fh:
                fh.write(json.dumps({"samples_per_second": 1e6, "epochs": []}) + "\n")
            return 0
        policy = cmd[cmd.index("--precision") + 1]
        out = cmd[cmd.index("--output") + 1]
        tf32 = cmd[cmd.index("--tf32") + 1] if "--tf32" in cmd else "on"
        profile = cmd[cmd.index("--profile-steps") + 1] if "--profile-steps" in cmd else None
        self.calls.append((policy, tf32, profile))
        capable = self.env["hardware"]["gpus"][0]["compute_capability"][0] >= 8
        sps = RATE[(policy, tf32 if capable else "off")] if capable else 1000.0 * (
            1.0 if policy == "float32" else 2.5)
        epochs = [{"loss": 0.5, "val_accuracy": 0.9, "epoch_seconds": 256 / sps,
                   "samples_per_second": sps, "skipped_steps": 0} for _ in range(2)]
        doc = {"config": {"precision": policy}, "precision": {"policy": policy},
               "environment": {"tf32": {"on": capable and tf32 == "on"}},
               "epochs": epochs, "peak_memory": {"kind": "gpu", "bytes": 2**30},
               "status": "completed", "data": {"train_samples": 256}}
        with open(log_path, "w") as fh:
            fh.write("fake\n")
        with open(os.path.join(out, "metrics.json"), "w") as fh:
            json.dump(doc, fh)
        return 0


def _bench(tmp_path, env, choice, profile=False):
    fake = FakeTrain(env)
    out = str(tmp_path / "bench")
    lines = []
    rc = suite.run_benchmark(dict(SETTINGS), ["float32", "mixed_float16"], out, repeats=2,
                             warmup_epochs=1, max_accuracy_gap=1.0, launcher=fake,
                             environment=env, echo=lines.append, fp32_baseline=choice,
                             profile=profile)
    with open(os.path.join(out, "benchmark.json")) as fh:
        return rc, json.load(fh), fake, "\n".join(lines)


def test_default_on_ampere_compares_with_tf32_and_says_why_the_speedup_is_smaller(tmp_path):
    rc, doc, fake, table = _bench(tmp_path, A100, "tf32")
    assert rc == 0 and all(t == "on" for _, t, _ in fake.calls)
    fp = doc["fp32_baseline"]
    assert fp["primary"] == "tf32" and fp["tf32_applies"] and fp["strict_float32"] is None
    assert doc["results"]["mixed_float16"]["speedup_vs_float32"]["median"] == pytest.approx(1.5)
    assert set(doc["tf32_by_run"].values()) == {True}
    assert "with TF32 on" in table and "smaller than against strict float32" in table


def test_both_runs_strict_float32_beside_each_float32_run_and_reports_it(tmp_path):
    rc, doc, fake, table = _bench(tmp_path, A100, "both")
    assert rc == 0
    assert [c[:2] for c in fake.calls] == [("float32", "on"), ("float32", "off"),
                                           ("mixed_float16", "on")] * 2
    fp = doc["fp32_baseline"]
    assert fp["strict_float32"]["samples_per_second"]["median"] == pytest.approx(1000.0)
    assert fp["speedup_vs_strict_float32"] == {"float32": 2.0, "mixed_float16": 3.0}
    assert doc["tf32_by_run"]["float32#1-strict"] is False and doc["tf32_by_run"]["float32#1"]
    # The table's baseline stays what a user gets: float32 with TF32.
    assert doc["results"]["mixed_float16"]["speedup_vs_float32"]["median"] == pytest.approx(1.5)
    assert "Strict float32 (TF32 off): 1,000 samples/s" in table
    assert "mixed_float16 3.00x" in table


def test_strict_on_ampere_turns_tf32_off_for_the_baseline_and_says_it_is_not_the_default(tmp_path):
    rc, doc, fake, table = _bench(tmp_path, A100, "strict")
    assert ("float32", "off", None) in fake.calls and ("float32", "on", None) not in fake.calls
    assert doc["results"]["mixed_float16"]["speedup_vs_float32"]["median"] == pytest.approx(3.0)
    assert "not the float32 a user gets" in table


@pytest.mark.parametrize("choice", baseline.CHOICES)
def test_without_tf32_hardware_one_strict_baseline_is_measured(tmp_path, choice):
    rc, doc, fake, table = _bench(tmp_path, T4, choice)
    assert all(t == "on" for _, t, _ in fake.calls) and len(fake.calls) == 4  # no extra runs
    fp = doc["fp32_baseline"]
    assert fp["primary"] == "strict" and not fp["tf32_applies"]
    assert "no TF32 Tensor Cores" in table
    assert ("one float32 baseline was measured" in table) is (choice != "tf32")


def test_profile_adds_one_short_untimed_run_per_policy(tmp_path):
    rc, doc, fake, table = _bench(tmp_path, T4, "tf32", profile=True)
    profiled = [c for c in fake.calls if c[2]]
    assert [c[0] for c in profiled] == ["float32", "mixed_float16"]
    assert {c[2] for c in profiled} == {"3-5"}
    assert set(doc["profiles"]) == {"float32", "mixed_float16"}
    assert doc["results"]["float32"]["runs_ok"] == 2        # the profiled run is not timed
    assert "Profiles (one short untimed run per policy" in table


def test_plan_rules():
    a100 = HardwareInfo(gpus=[make_gpu("A100", (8, 0))])
    assert baseline.primary_tf32_flag(baseline.plan("strict", a100)) == "off"
    assert baseline.primary_tf32_flag(baseline.plan("tf32", a100)) is None
    assert baseline.primary_tf32_flag(baseline.plan("strict", HardwareInfo())) is None
    with pytest.raises(ValueError):
        baseline.plan("fp19", a100)


def test_the_users_tf32_and_profile_variables_do_not_reach_the_runs():
    from app.benchmark import runner

    env = runner.child_env({"TFMP_TF32": "off", "TFMP_PROFILE_STEPS": "1-9", "TFMP_SEED": "3"})
    assert "TFMP_TF32" not in env and "TFMP_PROFILE_STEPS" not in env
    assert env["TFMP_SEED"] == "3"
