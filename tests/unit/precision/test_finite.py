"""The gradients' finiteness tests: the sum a step makes, and a dense kernel's gradient
proved finite from its factors."""
import numpy as np
import pytest
import tensorflow as tf

from app.precision import finite

BIG = float(np.finfo(np.float32).max)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_sum_finite_sees_one_bad_element_in_any_gradient(bad):
    grads = [tf.ones((3, 4)), None, tf.constant([1.0, bad, 2.0]), tf.zeros((2,), tf.float16)]
    assert bool(finite.sum_finite(grads)) is False
    assert bool(finite.all_finite(grads)) is False


def test_sum_finite_passes_finite_gradients_of_any_float_dtype_and_sparse_values():
    dense = [tf.fill((64, 64), 60000.0), tf.constant([-65504.0, 65504.0], tf.float16)]
    sparse = tf.IndexedSlices(tf.constant([[1.0, 2.0]]), tf.constant([7]), tf.constant([10 ** 6, 2]))
    assert bool(finite.sum_finite(dense + [sparse, None])) is True
    poisoned = tf.IndexedSlices(tf.constant([[1.0, float("nan")]]), tf.constant([7]),
                                tf.constant([10 ** 6, 2]))
    assert bool(finite.sum_finite(dense + [poisoned])) is False
    assert bool(finite.sum_finite([None])) is True


def _kernel_gradient_check(batch: int, fan_in: int, fan_out: int, dtype=tf.float32):
    """A traced function: the gradient of sum((x @ w) * upstream) for w, i.e. x^T upstream
    (a dense layer's kernel gradient, the upstream gradient given), and its test; the
    graph's ops and what ``matmul_factors`` made of the gradient are kept for inspection."""
    w = tf.Variable(tf.zeros((fan_in, fan_out), dtype))
    seen = {}

    @tf.function
    def check(x, upstream):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.matmul(x, w) * upstream)
        grad = tape.gradient(loss, w)
        seen["grad"], seen["factors"] = grad, finite.matmul_factors(grad)
        return finite.sum_finite([grad, tf.zeros((3,))]), grad

    spec = (tf.TensorSpec((batch, fan_in), dtype), tf.TensorSpec((batch, fan_out), dtype))
    seen["graph"] = check.get_concrete_function(*spec).graph
    return check, seen


def test_a_large_kernels_gradient_is_proved_from_its_factors_and_never_summed_on_the_way():
    _, seen = _kernel_gradient_check(128, 784, 512)
    a, b = seen["factors"]
    assert tuple(a.shape) == (128, 784) and tuple(b.shape) == (128, 512)
    assert finite.LIMIT == BIG / 8
    ops = seen["graph"].get_operations()
    norms = [op for op in ops if op.type == "L2Loss"]
    assert {op.inputs[0].name for op in norms} == {a.name, b.name}
    # Outside the cond's else-branch nothing reads the gradient but its consumers: no sum.
    readers = [op.type for op in ops if any(t is seen["grad"] for t in op.inputs)]
    assert "Sum" not in readers and any(t in ("If", "StatelessIf") for t in readers), readers


@pytest.mark.parametrize("shape", [(128, 256, 10), (4096, 512, 256), (16, 100, 100)])
def test_gradients_smaller_than_their_factors_or_small_are_summed(shape):
    _, seen = _kernel_gradient_check(*shape)
    assert seen["factors"] is None


def test_half_precision_and_eager_gradients_are_summed():
    _, seen = _kernel_gradient_check(128, 784, 512, tf.float16)
    assert seen["factors"] is None
    assert finite.matmul_factors(tf.ones((784, 512))) is None


def _case(x_at, up_at):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(128, 784)).astype(np.float32)
    up = rng.normal(size=(128, 512)).astype(np.float32) * 1e-3
    for (i, j), v in x_at.items():
        x[i, j] = v
    for (i, j), v in up_at.items():
        up[i, j] = v
    return x, up


@pytest.mark.parametrize("x_at, up_at, expected", [
    ({}, {}, True),
    ({(5, 7): float("nan")}, {}, False),
    ({(5, 7): float("inf")}, {}, False),
    ({}, {(9, 3): float("-inf")}, False),
    ({}, {(9, 3): float("nan")}, False),
    # Past the bound (|x| |upstream| is about 1.4e38) yet finite: summed, and found finite.
    ({(0, 0): 1e30}, {(0, 0): 1e8, (0, 1): 1e8}, True),
    # An element past float32's range (1e30 x 1e9): the sum finds it.
    ({(0, 0): 1e30}, {(0, 0): 1e9}, False),
    # A factor whose squares overflow float32 (1e25^2), its row meeting zeros upstream: the
    # bound fails, yet the gradient is finite (1e25 x 0): summed, and found finite.
    ({(0, 0): 1e25}, {(0, j): 0.0 for j in range(512)}, True),
], ids=["ordinary", "nan-input", "inf-input", "inf-upstream", "nan-upstream",
        "near-the-limit", "overflow", "huge-input-times-zero"])
def test_the_proof_answers_as_the_gradient_itself_does(x_at, up_at, expected):
    check, seen = _kernel_gradient_check(128, 784, 512)
    assert seen["factors"] is not None
    x, up = _case(x_at, up_at)
    ok, grad = check(x, up)
    assert bool(ok) is expected
    assert bool(np.isfinite(grad.numpy()).all()) is expected


def _two_kernels_check():
    """Two dense layers' kernel gradients, each proved from its factors, in one test."""
    w1, w2 = tf.Variable(tf.zeros((784, 512))), tf.Variable(tf.zeros((512, 512)))

    @tf.function
    def check(x, h, up1, up2):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.matmul(x, w1) * up1) + tf.reduce_sum(tf.matmul(h, w2) * up2)
        grads = tape.gradient(loss, [w1, w2])
        assert all(finite.matmul_factors(g) is not None for g in grads)
        return finite.sum_finite(grads), tf.reduce_all([tf.reduce_all(tf.math.is_finite(g))
                                                        for g in grads])
    return check


@pytest.mark.parametrize("where, value", [
    (None, None), ("h", float("nan")), ("up2", float("inf")), ("x", float("-inf")),
    # An input whose square passes float32's range (1e38): its bound fails, yet its kernel's
    # gradient (about 1e35) is finite: summed, and found finite.
    ("x", 1e38),
])
def test_two_proved_kernels_answer_as_their_gradients_do(where, value):
    rng = np.random.default_rng(1)
    arrays = {"x": rng.normal(size=(128, 784)), "h": rng.normal(size=(128, 512)),
              "up1": rng.normal(size=(128, 512)) * 1e-3, "up2": rng.normal(size=(128, 512)) * 1e-3}
    if where is not None:
        arrays[where][3, 4] = value
    ok, truth = _two_kernels_check()(*(tf.constant(arrays[k], tf.float32)
                                       for k in ("x", "h", "up1", "up2")))
    assert bool(ok) is bool(truth) is (where is None or bool(np.isfinite(value)))
