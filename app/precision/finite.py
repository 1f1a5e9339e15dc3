"""Are the gradients finite?  The tests the training step makes before an update, and the
replay's element-wise one.

``sum_finite`` is the one on a training step's critical path (the update waits for it), so
it reads as little as it can:

* one sum a gradient, added up: finite only when every element is (a NaN or an inf in any
  of them makes the total not finite);
* a dense layer's kernel gradient, ``C = A^T B`` (A the layer's input, B the gradient of its
  output), is proved finite from its two factors when they hold fewer elements than it does:
  by Cauchy-Schwarz every element of C, and every partial sum the matmul makes of it, is at
  most ``|A| |B|`` (Frobenius norms), so finite factors whose norms multiply to well under
  float32's largest value make a finite C.  The factors are ready before C is made (B is
  the last thing the backward pass computes before C), so the test no longer waits for the
  last and largest gradient of the step, the first layer's kernel: the mlp's first kernel
  is 784x512 = 401k elements, its factors at batch 128 are 166k, and their test runs beside
  the matmul that makes C.  Only when the bound does not hold (a factor not finite, or
  values near float32's limit) is C itself summed, so the answer is the same as summing
  C, less the one case where a bounded C's elements add up past float32's range.
"""
from __future__ import annotations

import tensorflow as tf

# What the factors' norms must multiply to under: float32's largest value with a margin of
# 8, for the rounding of the computed norms and of the matmul's own accumulation (relative
# error at most k * 2^-24 for k terms, see _MAX_TERMS).
LIMIT = float(tf.float32.max) / 8.0
# Contractions longer than this could round past the margin: their gradient is summed.
_MAX_TERMS = 2 ** 22
# Smaller gradients are summed: a bound's few scalar ops and its cond cost more than they save.
_MIN_ELEMENTS = 1 << 16


def variables_of(weights) -> list:
    """The variables among a model's (or a layer's) ``weights``: Keras 2's lookup layers
    (StringLookup, TextVectorization) list a vocabulary handler there that is no variable
    and has no dtype."""
    return [w for w in weights if getattr(w, "dtype", None) is not None]


def floating_variables(weights) -> list:
    """The floating-point variables among ``weights`` (integer ones cannot hold a NaN)."""
    return [w for w in variables_of(weights) if tf.as_dtype(w.dtype).is_floating]


def all_finite(grads) -> tf.Tensor:
    """Every element of every gradient finite (None left out): an element-wise test, for
    the replay and the probes, which need to know which tensor holds the fault."""
    return tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in grads if g is not None])


def sum_finite(grads, scalars=()) -> tf.Tensor:
    """True when every gradient (and each of ``scalars``, None left out) is finite: one sum
    of each, added up, or for a large dense kernel's gradient the bound on its factors (see
    the module's docstring).  N + 2 ops for N gradients where ``all_finite`` takes 2N + 1.
    Finite gradients whose sum passes float32's range count as non-finite too: an update
    that large is a fault of its own.  Sparse gradients: their values, never densified."""
    sums, proved = [], []
    for g in grads:
        if g is None:
            continue
        factors = matmul_factors(g)
        if factors is None:
            sums.append(tf.reduce_sum(tf.cast(_values(g), tf.float32)))
        else:
            proved.append(_product_finite(g, *factors))
    for s in scalars:
        if s is not None:
            s = tf.cast(s, tf.float32)
            sums.append(s if s.shape.rank == 0 else tf.reduce_sum(s))
    tests = [tf.math.is_finite(tf.add_n(sums))] if sums else []
    tests += proved
    if not tests:
        return tf.constant(True)
    return tests[0] if len(tests) == 1 else tf.reduce_all(tf.stack(tests))


def matmul_factors(g):
    """(A, B) when ``g`` is a float32 ``MatMul``'s output in a graph, with static shapes,
    large enough to be worth the bound and with factors smaller than it; else None."""
    if isinstance(g, tf.IndexedSlices) or tf.executing_eagerly() or not hasattr(g, "op"):
        return None
    op = g.op
    if op.type != "MatMul" or g.dtype != tf.float32 or not g.shape.is_fully_defined():
        return None
    a, b = op.inputs[0], op.inputs[1]
    if not (a.shape.is_fully_defined() and b.shape.is_fully_defined()):
        return None
    terms = a.shape[0] if op.get_attr("transpose_a") else a.shape[1]
    size = g.shape.num_elements()
    if (size < _MIN_ELEMENTS or terms > _MAX_TERMS
            or a.shape.num_elements() + b.shape.num_elements() >= size):
        return None
    return a, b


def _product_finite(c, a, b) -> tf.Tensor:
    """C = op(A) op(B) finite: proved from |A| |B| < ``LIMIT``, else C's own sum.  L2Loss is
    sum(x^2) / 2, so |A|^2 |B|^2 = 4 la lb, multiplied in float64 (the product of two
    float32 norms can pass float32's range); a factor with a NaN or an inf gives a NaN or an
    inf there, which fails the comparison."""
    la = tf.cast(tf.nn.l2_loss(a), tf.float64)
    lb = tf.cast(tf.nn.l2_loss(b), tf.float64)
    bounded = 4.0 * la * lb < LIMIT * LIMIT
    return tf.cond(bounded, lambda: tf.constant(True),
                   lambda: tf.math.is_finite(tf.reduce_sum(c)))


def _values(g):
    return g.values if isinstance(g, tf.IndexedSlices) else g
