"""Checks that need a real NVIDIA GPU (skipped elsewhere; run them with the image's pytest),
and the table of real GPUs they are checked against (that part runs everywhere).

On the development machines there is no GPU: the GPU decisions are covered there only by the
table test below and the fake-hardware tests in tests/unit/precision/test_precision.py.
"""
import re

import pytest

# Real GPUs as TensorFlow names them, from NVIDIA's specifications (not from app.machine.hardware):
# (name, compute capability, has Tensor Cores).  A GPU box's own GPU is looked up here.
KNOWN_GPUS = [
    ("Tesla V100-SXM2-16GB", (7, 0), True),        # Volta: the first Tensor Cores
    ("Tesla T4", (7, 5), True),                    # Turing
    ("NVIDIA A100-SXM4-40GB", (8, 0), True),       # Ampere
    ("NVIDIA GeForce RTX 3090", (8, 6), True),
    ("NVIDIA GeForce RTX 2080 Ti", (7, 5), True),
    ("NVIDIA A10G", (8, 6), True),
    ("NVIDIA L4", (8, 9), True),                   # Ada
    ("NVIDIA H100 80GB HBM3", (9, 0), True),       # Hopper
    ("NVIDIA GeForce GTX 1660", (7, 5), False),    # Turing without Tensor Cores
    ("NVIDIA GeForce GTX 1650", (7, 5), False),
    ("Tesla P100-PCIE-16GB", (6, 0), False),       # Pascal
    ("NVIDIA GeForce GTX 1080 Ti", (6, 1), False),
    ("Tesla K80", (3, 7), False),                  # Kepler
]


def _known(name: str):
    """The table's row for a GPU TensorFlow reports (names vary by board: -PCIE-, -SXM4-, memory)."""
    def model(n: str) -> str:
        n = re.sub(r"^(NVIDIA |Tesla )?(GeForce )?", "", n)
        return re.split(r"[- ](\d+GB|PCIE|SXM\d?|HBM\d)", n, maxsplit=1)[0].strip()
    return next((row for row in KNOWN_GPUS if model(row[0]) == model(name)), None)


@pytest.mark.parametrize("name, capability, tensor_cores", KNOWN_GPUS,
                         ids=[row[0] for row in KNOWN_GPUS])
def test_known_gpus_get_the_right_tensor_core_answer_and_precision(name, capability,
                                                                   tensor_cores):
    """Host test (fake HardwareInfo): the package's rule against the table of real GPUs."""
    from app.machine.hardware import HardwareInfo, make_gpu
    from app.precision.policy import choose_policy, slow_fp16_warning

    gpu = make_gpu(name, capability, 16 * 2**30)
    assert gpu.tensor_cores is tensor_cores
    hw = HardwareInfo(gpus=[gpu])
    assert choose_policy(hw).policy == ("mixed_float16" if tensor_cores else "float32")
    assert (slow_fp16_warning(hw) is None) is tensor_cores


def test_the_table_lookup_ignores_board_suffixes():
    assert _known("Tesla V100-PCIE-32GB")[0] == "Tesla V100-SXM2-16GB"
    assert _known("NVIDIA A100 80GB PCIe")[0] == "NVIDIA A100-SXM4-40GB"
    assert _known("NVIDIA GeForce GTX 1660 Ti") is None  # another board: add its own row
    assert _known("NVIDIA GeForce RTX 3090")[1] == (8, 6)


@pytest.mark.gpu
def test_detect_reports_the_gpu_with_compute_capability():
    from app.machine.hardware import detect

    hw = detect()
    assert hw.gpus, "TensorFlow sees no GPU"
    gpu = hw.gpus[0]
    assert gpu.compute_capability is not None and gpu.compute_capability >= (3, 5)
    assert gpu.name


@pytest.mark.gpu
def test_this_gpu_matches_its_row_in_the_table():
    """The GPU here, looked up by name: compute capability as detected, Tensor Cores and the
    auto precision as the table (NVIDIA's specifications) says."""
    from app.machine.hardware import detect
    from app.precision.policy import choose_policy

    hw = detect()
    rows = [(g, _known(g.name)) for g in hw.gpus]
    unknown = [g.name for g, row in rows if row is None]
    if unknown:
        pytest.skip(f"{unknown} not in KNOWN_GPUS (tests/gpu/test_gpu_precision.py): add a row "
                    "(name, compute capability, Tensor Cores) to check it")
    for gpu, (_, capability, tensor_cores) in rows:
        assert gpu.compute_capability == capability, gpu
        assert gpu.tensor_cores is tensor_cores, gpu
    expected = "mixed_float16" if all(row[2] for _, row in rows) else "float32"
    assert choose_policy(hw).policy == expected


@pytest.mark.gpu
def test_mixed_float16_trains_on_the_gpu(tmp_path):
    from app.training.config import TrainConfig
    from app.training.job import train

    for loop in ("fit", "custom"):
        m = train(TrainConfig(model="mlp", dataset="synthetic", precision="mixed_float16",
                              loop=loop, epochs=2, batch_size=128, max_train_samples=4096,
                              max_val_samples=512, workspace=str(tmp_path),
                              output=str(tmp_path / loop), progress="lines", save_model=False))
        assert m["status"] == "completed"
        assert m["epochs"][-1]["val_accuracy"] >= 0.9
        assert m["peak_memory"]["kind"] == "gpu" and m["peak_memory"]["bytes"] > 0
