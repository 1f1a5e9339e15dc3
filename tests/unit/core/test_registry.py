"""The one registry (app/core/catalog.py): names, shapes and the fast-path rule that `auto`,
the benchmark's plan and its diagnoses all read.  No TensorFlow."""
import pytest

from app.core import catalog as registry
from app.benchmark import diagnose, plan
from app.machine.hardware import HardwareInfo, make_gpu
from app.precision.policy import choose_policy

MACHINES = {
    "T4": HardwareInfo(gpus=[make_gpu("Tesla T4", (7, 5))]),
    "A100": HardwareInfo(gpus=[make_gpu("NVIDIA A100-SXM4-40GB", (8, 0))]),
    "P100": HardwareInfo(gpus=[make_gpu("Tesla P100-PCIE-16GB", (6, 0))]),
    "GTX1660": HardwareInfo(gpus=[make_gpu("NVIDIA GeForce GTX 1660", (7, 5))]),
    "unknown GPU": HardwareInfo(gpus=[make_gpu("Some GPU", None)]),
    "CPU bf16": HardwareInfo(cpu_flags=frozenset({"avx512_bf16"})),
    "CPU": HardwareInfo(),
}


@pytest.mark.parametrize("name", sorted(MACHINES))
def test_auto_plan_and_diagnosis_agree_on_the_fast_path(name):
    hw = MACHINES[name]
    auto = choose_policy(hw).policy
    assert auto == registry.fast_policy(hw)
    assert registry.has_fast_path(auto, hw) is True
    for policy in registry.POLICIES:
        fast = registry.has_fast_path(policy, hw)
        assert diagnose._capable(policy, hw) is (fast is True)
        skipped = plan.skip_reason(policy, hw) is not None
        # a fast policy always runs; float16 on a GPU without Tensor Cores runs too, to be
        # measured and explained
        assert not (fast and skipped)
        if fast is False and not (policy == "mixed_float16" and hw.gpus):
            assert skipped, policy


def test_unknown_compute_capability_is_neither_fast_nor_skipped_for_bfloat16():
    hw = MACHINES["unknown GPU"]
    assert registry.has_fast_path("mixed_bfloat16", hw) is None
    assert plan.skip_reason("mixed_bfloat16", hw) is None


def test_builtin_shapes_and_pairings():
    assert registry.builtin_input_shape("mlp") == (784,)
    assert registry.builtin_input_shape("resnet", 48) == (48, 48, 3)
    assert registry.pairing_problem("mlp", "cifar10")[0] == (
        "model 'mlp' expects 28x28x1 images, dataset 'cifar10' has colour images")
    assert registry.pairing_problem("resnet", "mnist")[1] == "mlp or cnn with mnist/fashion_mnist"
    assert registry.pairing_problem("resnet", "cifar10") is None
    assert registry.pairing_problem("mlp", "my.py:load") is None
    assert registry.DEFAULT_INITIAL_LOSS_SCALE == 2.0 ** 15


def test_every_exit_status_has_a_meaning():
    from app.core import exit_codes

    codes = {v for k, v in vars(exit_codes).items() if k.startswith("EXIT_")}
    assert codes == set(exit_codes.MEANINGS)
    assert exit_codes.interrupted(2) == 130 and exit_codes.interrupted(15) == 143
