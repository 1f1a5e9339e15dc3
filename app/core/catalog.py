"""The names the package knows, written once and free of TensorFlow.

The built-in models with their input shapes, hidden widths and layer kinds, the built-in datasets with
their sample shapes, the dtype policies, the default initial loss scale, which built-in
model fits which built-in dataset, and which policy has a fast path on given hardware.
Everything else (argparse choices, validation, the benchmark's plan and diagnoses, the
model builders in ``app.task.models``) reads them from here, so a new entry is one edit.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple


@dataclass(frozen=True)
class BuiltinModel:
    name: str
    about: str
    # Hidden layer widths (Dense units, Conv filters) in layer order, the class-count output
    # layer left out (its width is the task's): what the benchmark checks for multiples of 8
    # without building the model.  tests/unit/benchmark/test_benchmark_diagnose.py compares them with
    # the real models.
    hidden_widths: Tuple[int, ...]
    gray_28: bool   # trained on 28x28x1 images (else 32x32x3 colour images)
    # The kinds of layer it computes with (``app.machine.kernels.KINDS``), so a policy this
    # TensorFlow cannot run here for one of them is refused before any data loads.
    # tests/unit/machine/test_kernels.py compares them with the real models.
    layer_kinds: Tuple[str, ...]

    def input_shape(self, image_size: int = 32) -> tuple:
        """The shape the guide trains this model on (resnet: square colour images)."""
        if self.name == "mlp":
            return (784,)
        return (28, 28, 1) if self.gray_28 else (image_size, image_size, 3)


_MODELS = (
    BuiltinModel("mlp", "the guide's 784-512-256-10 multilayer perceptron", (512, 256), True,
                 ("Dense",)),
    BuiltinModel("cnn", "the guide's Conv2D(32, 3) + Flatten + Dense", (32,), True,
                 ("Conv2D", "Dense")),
    BuiltinModel("resnet", "a small residual CNN for 32x32x3 images",
                 (32, 32, 32, 64, 64, 64, 128, 128, 128), False,
                 ("Conv2D", "BatchNormalization", "Dense")),
)
MODELS: Dict[str, BuiltinModel] = {m.name: m for m in _MODELS}
MODEL_NAMES: Tuple[str, ...] = tuple(MODELS)

# Natural sample shapes of the built-in datasets (None: the images' own, resized).
DATASET_SHAPES: Dict[str, Optional[tuple]] = {
    "mnist": (28, 28, 1), "fashion_mnist": (28, 28, 1), "cifar10": (32, 32, 3),
    "synthetic": (28, 28, 1), "images": None,
}
DATASET_NAMES: Tuple[str, ...] = tuple(DATASET_SHAPES)
_GRAY_DATASETS = ("mnist", "fashion_mnist")
_COLOUR_DATASETS = ("cifar10", "images")

POLICIES: Tuple[str, ...] = ("float32", "mixed_float16", "mixed_bfloat16")
# The compute dtypes of the mixed policies: what the layer checks, the dtype-mismatch warning
# and the sentinel's headroom call 16-bit.
SIXTEEN_BIT: Tuple[str, ...] = ("float16", "bfloat16")
PRECISIONS: Tuple[str, ...] = POLICIES + ("auto",)
BASELINE_POLICY = "float32"
# What the dynamic LossScaleOptimizer starts with (Keras' own default too).
DEFAULT_INITIAL_LOSS_SCALE = 2.0 ** 15
# The fewest updates an epoch a batch should leave: tune's batches stay within a tenth of the
# training set, and train notes a batch that leaves one.  A batch that is most of a small
# training set trains in a handful of updates however fast each step is: 1,200 samples of
# 64 features, 10 classes, 5 epochs, batch 1,200 (what tune chose when only the set's size
# bounded it) reached val accuracy 0.23, batch 128 (9 updates an epoch) 0.99.
MIN_UPDATES_PER_EPOCH = 10


def builtin_input_shape(name: str, image_size: int = 32) -> tuple:
    return MODELS[name].input_shape(image_size)


def layer_kinds(model: str) -> Optional[Tuple[str, ...]]:
    """A built-in model's layer kinds; None for a user's model (known once it is built)."""
    return MODELS[model].layer_kinds if model in MODELS else None


def pairing_problem(model: str, dataset: str) -> Optional[Tuple[str, str]]:
    """(what, allowed) when a built-in model cannot train on a built-in dataset, else None."""
    if model not in MODELS or dataset not in DATASET_SHAPES:
        return None
    gray = [n for n in MODEL_NAMES if MODELS[n].gray_28]
    colour = [n for n in MODEL_NAMES if not MODELS[n].gray_28]
    if MODELS[model].gray_28 and dataset in _COLOUR_DATASETS:
        return (f"model {model!r} expects 28x28x1 images, dataset {dataset!r} has colour images",
                f"{' or '.join(colour)} with {'/'.join(_COLOUR_DATASETS)}")
    if not MODELS[model].gray_28 and dataset in _GRAY_DATASETS:
        return (f"model {model!r} expects 32x32x3 images, dataset {dataset!r} has 28x28x1",
                f"{' or '.join(gray)} with {'/'.join(_GRAY_DATASETS)}")
    return None


def pairings_hint() -> str:
    """Which built-in models go with which built-in datasets, for error messages."""
    gray = [n for n in MODEL_NAMES if MODELS[n].gray_28]
    colour = [n for n in MODEL_NAMES if not MODELS[n].gray_28]
    return (f"{'/'.join(gray)} with {' or '.join(_GRAY_DATASETS)}, "
            f"{'/'.join(colour)} with {' or '.join(_COLOUR_DATASETS)}")


# bfloat16 Tensor Cores start with Ampere.
BF16_TENSOR_CORES = (8, 0)


def has_fast_path(policy: str, hw) -> Optional[bool]:
    """Does ``policy`` run on fast hardware units on ``hw`` (an ``app.machine.hardware.HardwareInfo``)?

    float32 always; mixed_float16 only when every GPU has Tensor Cores; mixed_bfloat16 on
    GPUs from Ampere on (compute capability 8.0) and on CPUs with AVX512_BF16 or AMX.
    None when it cannot be told (GPUs that report no compute capability).  The one answer
    behind ``--precision auto``, the benchmark's default plan and its diagnoses."""
    if policy == BASELINE_POLICY:
        return True
    if policy == "mixed_float16":
        return bool(hw.gpus) and all(g.tensor_cores for g in hw.gpus)
    if policy == "mixed_bfloat16":
        if not hw.gpus:
            return bool(hw.cpu_bf16)
        caps = [tuple(g.compute_capability) for g in hw.gpus if g.compute_capability]
        return min(caps) >= BF16_TENSOR_CORES if caps else None
    raise ValueError(f"unknown policy {policy!r}")


def fast_policy(hw) -> str:
    """The policy ``--precision auto`` trains with: float16 on GPUs that all have Tensor
    Cores, bfloat16 on a CPU with native bfloat16 math, float32 otherwise (a GPU without
    Tensor Cores gains nothing from either 16-bit type)."""
    if hw.gpus:
        return "mixed_float16" if has_fast_path("mixed_float16", hw) else BASELINE_POLICY
    return "mixed_bfloat16" if has_fast_path("mixed_bfloat16", hw) else BASELINE_POLICY
