"""Models keep their output and loss in float32 under every policy."""
import pytest
import tensorflow as tf

from app.precision import policy as precision
from app.task.models import build_model, input_shape_for

from app.core import catalog as registry

POLICIES = ["float32", "mixed_float16", "mixed_bfloat16"]
# bfloat16 runs only where this TensorFlow has the model's kernels here (tests/conftest.py).
CASES = [pytest.param(name, policy, id=f"{name}-{policy}",
                      marks=[pytest.mark.bf16_kernels(*registry.layer_kinds(name))]
                      if policy == "mixed_bfloat16" else [])
         for name in registry.MODEL_NAMES for policy in POLICIES]


@pytest.mark.parametrize("name, policy", CASES)
def test_output_is_float32_and_body_uses_the_policy(name, policy):
    precision.apply_policy(policy)
    model = build_model(name, input_shape_for(name), 10)
    assert model.output.dtype == tf.float32 or model.output.dtype == "float32"
    assert model.layers[-1].name == "probabilities"
    compute = tf.keras.mixed_precision.Policy(policy).compute_dtype
    assert model.get_layer("logits").compute_dtype == compute
    y = model(tf.zeros((2,) + input_shape_for(name)))
    assert y.dtype == tf.float32


def test_seed_architectures():
    mlp = build_model("mlp", (784,), 10)
    assert [l.units for l in mlp.layers if isinstance(l, tf.keras.layers.Dense)] == [512, 256, 10]
    cnn = build_model("cnn", (28, 28, 1), 10)
    assert [l.filters for l in cnn.layers if isinstance(l, tf.keras.layers.Conv2D)] == [32]


def test_resnet_channels_are_multiples_of_8():
    model = build_model("resnet", (32, 32, 3), 10)
    filters = [l.filters for l in model.layers if isinstance(l, tf.keras.layers.Conv2D)]
    assert filters and all(f % 8 == 0 for f in filters)
    assert any(isinstance(l, tf.keras.layers.Add) for l in model.layers)
