"""Which policies the benchmark runs where, and the interleaved order (pure, no TensorFlow)."""
from __future__ import annotations

import pytest

from app.benchmark import plan
from app.machine.hardware import HardwareInfo, make_gpu

CPU_BF16 = HardwareInfo(cpu_flags=frozenset({"avx512_bf16"}))
CPU_PLAIN = HardwareInfo(cpu_flags=frozenset({"avx2"}))
T4 = HardwareInfo(gpus=[make_gpu("Tesla T4", (7, 5))])
A100 = HardwareInfo(gpus=[make_gpu("NVIDIA A100-SXM4-40GB", (8, 0))])
P100 = HardwareInfo(gpus=[make_gpu("Tesla P100-PCIE-16GB", (6, 0))])


def test_default_on_bf16_cpu_skips_fp16_with_reason():
    p = plan.plan_policies(None, CPU_BF16)
    assert p.run == ("float32", "mixed_bfloat16")
    assert set(p.skipped) == {"mixed_float16"}
    assert "no GPU" in p.skipped["mixed_float16"]
    assert "--policies" in p.skipped["mixed_float16"]


def test_default_on_plain_cpu_runs_only_float32():
    p = plan.plan_policies(None, CPU_PLAIN)
    assert p.run == ("float32",)
    assert "AVX512_BF16" in p.skipped["mixed_bfloat16"]


def test_default_on_t4_skips_bf16_before_ampere():
    p = plan.plan_policies(None, T4)
    assert p.run == ("float32", "mixed_float16")
    assert "Ampere" in p.skipped["mixed_bfloat16"]


def test_default_on_a100_runs_all():
    assert plan.plan_policies(None, A100).run == plan.POLICIES


def test_gpu_without_tensor_cores_still_measures_fp16():
    # "no speed-up because no Tensor Cores" is what users need to see measured.
    assert "mixed_float16" in plan.plan_policies(None, P100).run


def test_named_policies_always_run_and_float32_is_added_first():
    p = plan.plan_policies(["mixed_float16", "mixed_float16"], CPU_PLAIN)
    assert p.run == ("float32", "mixed_float16")
    assert p.baseline_added and p.skipped == {}
    q = plan.plan_policies(["mixed_bfloat16", "float32"], CPU_PLAIN)
    assert q.run == ("mixed_bfloat16", "float32") and not q.baseline_added


def test_unknown_policy_rejected():
    with pytest.raises(ValueError):
        plan.plan_policies(["fp8"], CPU_BF16)


def test_schedule_is_round_robin():
    s = plan.interleaved_schedule(["float32", "mixed_bfloat16"], 3)
    assert [(e["policy"], e["repeat"]) for e in s] == [
        ("float32", 1), ("mixed_bfloat16", 1),
        ("float32", 2), ("mixed_bfloat16", 2),
        ("float32", 3), ("mixed_bfloat16", 3)]
    assert [e["order"] for e in s] == list(range(6))


def test_schedule_rejects_zero_repeats():
    with pytest.raises(ValueError):
        plan.interleaved_schedule(["float32"], 0)


def test_describe():
    assert plan.describe(T4) == "GPU Tesla T4, compute capability 7.5"
    assert plan.describe(CPU_BF16) == "CPU only (AVX512_BF16)"


@pytest.mark.parametrize("hw", [CPU_BF16, CPU_PLAIN, T4, A100, P100,
                                HardwareInfo(cpu_flags=frozenset({"amx_bf16", "amx_tile"}))])
def test_hardware_survives_the_env_report_round_trip(hw):
    # The benchmark learns the hardware from `python -m app env --json` (a child process).
    from app.benchmark.suite import hardware_from_env

    back = hardware_from_env({"hardware": hw.to_dict()})
    assert plan.plan_policies(None, back) == plan.plan_policies(None, hw)
    assert [g.tensor_cores for g in back.gpus] == [g.tensor_cores for g in hw.gpus]
    assert (back.cpu_bf16, back.cpu_amx) == (hw.cpu_bf16, hw.cpu_amx)


def test_failed_env_report_falls_back_to_cpuinfo():
    from app.benchmark.suite import hardware_from_env

    assert hardware_from_env({"error": "boom"}).gpus == []
