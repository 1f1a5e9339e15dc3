"""Are the gradients finite?  The tests the training step makes before an update, and the
replay's element-wise one.

``sum_finite`` is the one on a training step's critical path (the update waits for it), so
it reads as little as it can:

* one sum a gradient, added up: finite only when every element is (a NaN or an inf in any
  of them makes the total not finite);
* a dense layer's kernel gradient, ``C = A^T B`` (A the layer's input, B the gradient of its
  output), is proved finite from its two factors when they hold fewer elements than it does:
  by Cauchy-Schwarz every element of C, and every partial sum the matmul makes of it, is at
  most ``|A| |B|`` (Frobenius norms).  The test adds ``l2_loss(A) * l2_loss(B)`` (a quarter
  of ``|A|^2 |B|^2``) to the other sums: that product is finite only when both factors are
  and ``|A| |B|`` is under about 5e19 (rounding included) - under float32's largest value
  (3.4e38) by a factor of 10^18 - so a finite total proves C finite.  The factors are ready before C
  is made (B is the last thing the backward pass computes before C), so the test no longer
  waits for the last and largest gradient of the step, the first layer's kernel: the mlp's
  first kernel is 784x512 = 401k elements, its factors at batch 128 are 166k, and their test
  runs beside the matmul that makes C.  Only when the total is not finite (a factor, another
  gradient or the loss not finite, or factors that large) are the kernels themselves summed,
  so the answer is the same as summing every gradient: one test, one ``tf.cond`` a step,
  however many kernels are proved.
"""
from __future__ import annotations

import tensorflow as tf

# The bound holds for factors of up to this many elements and contractions this long: the
# float32 sums of their squares (l2_loss) and the matmul's own accumulation are then within
# 25% of exact (relative error at most n * 2^-24), which the bound's margin of 10^18 covers.
_MAX_TERMS = 2 ** 22
# Smaller gradients are summed: a product's ops cost more than the sum they save.
_MIN_ELEMENTS = 1 << 16


def all_finite(grads) -> tf.Tensor:
    """Every element of every gradient finite (None left out): an element-wise test, for
    the replay and the probes, which need to know which tensor holds the fault."""
    return tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in grads if g is not None])


def sum_finite(grads, scalars=()) -> tf.Tensor:
    """True when every gradient (and each of ``scalars``, None left out) is finite: one sum
    of each, or for a large dense kernel's gradient the product of its factors' norms (see
    the module's docstring), added up and tested once.  N + 2 ops for N gradients where
    ``all_finite`` takes 2N + 1.  Finite gradients whose sum passes float32's range count as
    non-finite too: an update that large is a fault of its own.  Sparse gradients: their
    values, never densified."""
    sums, products, kernels = [], [], []
    for g in grads:
        if g is None:
            continue
        factors = matmul_factors(g)
        if factors is None:
            sums.append(tf.reduce_sum(tf.cast(_values(g), tf.float32)))
        else:
            products.append(tf.nn.l2_loss(factors[0]) * tf.nn.l2_loss(factors[1]))
            kernels.append(g)
    for s in scalars:
        if s is not None:
            s = tf.cast(s, tf.float32)
            sums.append(s if s.shape.rank == 0 else tf.reduce_sum(s))
    if not kernels:
        return tf.math.is_finite(tf.add_n(sums)) if sums else tf.constant(True)
    rest = tf.add_n(sums) if sums else tf.constant(0.0)
    proved = tf.math.is_finite(tf.add_n([rest] + products))

    def summed():   # the bound failed: the kernels' own sums decide
        return tf.math.is_finite(tf.add_n([rest] + [tf.reduce_sum(k) for k in kernels]))
    return tf.cond(proved, lambda: tf.constant(True), summed)


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
    size, na, nb = g.shape.num_elements(), a.shape.num_elements(), b.shape.num_elements()
    if size < _MIN_ELEMENTS or max(terms, na, nb) > _MAX_TERMS or na + nb >= size:
        return None
    return a, b


def _values(g):
    return g.values if isinstance(g, tf.IndexedSlices) else g
