"""The precision decision table, with fake hardware (no TensorFlow needed)."""
import pytest

from app.core.errors import UsageError
from app.machine.hardware import HardwareInfo, has_tensor_cores, make_gpu, parse_cpuinfo_flags
from app.precision.policy import choose_policy, resolve, slow_fp16_warning

GB = 2**30
CPU_PLAIN = frozenset({"sse4_2", "avx2", "avx512f"})
CPU_BF16 = CPU_PLAIN | {"avx512_bf16"}
CPU_AMX = CPU_PLAIN | {"amx_bf16", "amx_tile"}


def gpu_box(name, cc, cpu=CPU_PLAIN):
    return HardwareInfo(gpus=[make_gpu(name, cc, 16 * GB)], cpu_flags=cpu)


@pytest.mark.parametrize("name, cc, policy", [
    ("Tesla V100-SXM2-16GB", (7, 0), "mixed_float16"),
    ("Tesla T4", (7, 5), "mixed_float16"),
    ("NVIDIA A100-SXM4-40GB", (8, 0), "mixed_float16"),
    ("NVIDIA GeForce RTX 3090", (8, 6), "mixed_float16"),
    ("NVIDIA H100 80GB HBM3", (9, 0), "mixed_float16"),
    ("Tesla P100-PCIE-16GB", (6, 0), "float32"),
    ("Tesla K80", (3, 7), "float32"),
    ("NVIDIA GeForce GTX 1660 SUPER", (7, 5), "float32"),   # TU116: no Tensor Cores
    ("NVIDIA GeForce GTX 1650", (7, 5), "float32"),         # TU117
    ("TU116 engineering sample", (7, 5), "float32"),
])
def test_gpu_decisions(name, cc, policy):
    # A bf16 CPU must not change a GPU decision.
    decision = choose_policy(gpu_box(name, cc, cpu=CPU_BF16))
    assert decision.policy == policy
    assert name in decision.reason


@pytest.mark.parametrize("flags, policy, word", [
    (CPU_BF16, "mixed_bfloat16", "AVX512_BF16"),
    (CPU_AMX, "mixed_bfloat16", "AMX"),
    (CPU_PLAIN, "float32", "no CPU bfloat16"),
    (frozenset(), "float32", "no GPU"),
])
def test_cpu_decisions(flags, policy, word):
    decision = choose_policy(HardwareInfo(cpu_flags=flags))
    assert decision.policy == policy
    assert word in decision.reason


def test_mixed_gpus_without_tensor_cores_fall_back_to_float32():
    hw = HardwareInfo(gpus=[make_gpu("Tesla T4", (7, 5)), make_gpu("Tesla P100", (6, 0))])
    assert choose_policy(hw).policy == "float32"


def test_tensor_core_rule():
    assert has_tensor_cores("Tesla T4", (7, 5))
    assert not has_tensor_cores("NVIDIA GeForce GTX 1660 Ti", (7, 5))
    assert not has_tensor_cores("Tesla P100", (6, 0))
    assert not has_tensor_cores("anything", None)


def test_cpuinfo_parser_reads_the_flags_line():
    text = "processor\t: 0\nmodel name\t: Xeon\nflags\t\t: fpu avx512f avx512_bf16 amx_tile\n"
    flags = parse_cpuinfo_flags(text)
    hw = HardwareInfo(cpu_flags=flags)
    assert hw.cpu_bf16 and hw.cpu_amx
    assert parse_cpuinfo_flags("no flags here") == frozenset()


def test_unknown_precision_is_rejected_keras_style():
    with pytest.raises(UsageError) as info:
        resolve("fp8", HardwareInfo())
    assert ("precision must be one of float32, mixed_float16, mixed_bfloat16, auto. "
            "Received: precision='fp8'") in str(info.value)


def test_explicit_fp16_on_cpu_warns_loudly_and_says_why():
    decision = resolve("mixed_float16", HardwareInfo(cpu_flags=CPU_BF16))
    assert decision.policy == "mixed_float16"
    assert "60 times slower" in decision.warning
    assert "no fast float16" in decision.warning


def test_explicit_fp16_on_gpu_without_tensor_cores_warns():
    warning = slow_fp16_warning(gpu_box("NVIDIA GeForce GTX 1660", (7, 5)))
    assert "Tensor Cores" in warning


def test_explicit_fp16_on_tensor_core_gpu_is_quiet():
    assert resolve("mixed_float16", gpu_box("Tesla T4", (7, 5))).warning is None


def test_auto_is_announced_in_one_line(capsys):
    from app.precision.policy import announce

    announce(resolve("auto", HardwareInfo(cpu_flags=CPU_BF16)))
    out = capsys.readouterr().out.strip().splitlines()
    assert out == ["precision: auto chose mixed_bfloat16 (no GPU; the CPU has AVX512_BF16, "
                   "so bfloat16 math is native)"]
