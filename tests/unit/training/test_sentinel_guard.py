"""The unscaled guard (float32) step by step: a fault never reaches the weights, nor does any
update after it, and the latch and the stash keep the first fault's step, kind and batch."""
import numpy as np
import pytest
import tensorflow as tf

from app.training.sentinel import SentinelState
from app.training.step_stats import StepStats


def _guarded():
    w = tf.Variable([1.0, 2.0])
    opt = tf.keras.optimizers.SGD(0.5)
    stats = StepStats()
    spec = (tf.TensorSpec([2], tf.float32), tf.TensorSpec([2], tf.float32))
    state = SentinelState(stats, spec, batch_size=2)

    @tf.function
    def step(x, grad, loss):
        state.guard(opt, [grad], loss, (x, grad), lambda g: opt.apply_gradients(zip(g, [w])))
        stats.steps.assign_add(1)
    return w, state, step


def _run(step, x, grad, loss):
    step(tf.constant(x, tf.float32), tf.constant(grad, tf.float32), tf.constant(loss, tf.float32))


def test_a_nan_gradient_is_latched_and_no_update_lands_after_it():
    w, state, step = _guarded()
    _run(step, [1, 1], [1, 1], 0.5)                    # step 1: applied
    np.testing.assert_allclose(w.numpy(), [0.5, 1.5])
    _run(step, [2, 2], [np.nan, 1], 0.5)               # step 2: a gradient's fault
    _run(step, [3, 3], [1, 1], 0.5)                    # step 3: finite, and skipped
    np.testing.assert_allclose(w.numpy(), [0.5, 1.5])
    assert state.latched()
    c = state.counters()
    assert (c.fault_step, c.fault_code) == (2, 2)
    (x, g), = state.batches()                          # the fault's batch, not a later one
    np.testing.assert_array_equal(x.numpy(), [2, 2])


def test_a_non_finite_loss_is_a_forward_fault_even_with_finite_gradients():
    w, state, step = _guarded()
    _run(step, [4, 4], [1, 1], np.inf)
    np.testing.assert_allclose(w.numpy(), [1.0, 2.0])
    c = state.counters()
    assert (c.fault_step, c.fault_code) == (1, 1)
    np.testing.assert_array_equal(state.batches()[0][0].numpy(), [4, 4])


def test_ordinary_steps_latch_and_stash_nothing():
    w, state, step = _guarded()
    for _ in range(3):
        _run(step, [1, 1], [0.1, 0.1], 0.5)
    np.testing.assert_allclose(w.numpy(), [0.85, 1.85], rtol=1e-6)
    assert not state.latched() and state.batches() == []


def test_a_sparse_gradient_with_a_nan_is_skipped_and_a_finite_one_lands_on_its_rows():
    table = tf.Variable([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])
    opt = tf.keras.optimizers.SGD(1.0)
    state = SentinelState(StepStats(), (tf.TensorSpec([1], tf.float32),), batch_size=1)

    @tf.function
    def step(values):
        grad = tf.IndexedSlices(values, tf.constant([1]), tf.constant([3, 2]))
        state.guard(opt, [grad], tf.constant(0.5), (tf.constant([7.0]),),
                    lambda g: opt.apply_gradients(zip(g, [table])))
        state.stats.steps.assign_add(1)
    step(tf.constant([[1.0, 1.0]]))
    np.testing.assert_allclose(table.numpy(), [[1, 1], [1, 1], [3, 3]])
    step(tf.constant([[np.nan, 1.0]]))
    np.testing.assert_allclose(table.numpy(), [[1, 1], [1, 1], [3, 3]])
    c = state.counters()
    assert (c.fault_step, c.fault_code) == (2, 2)


def _adam_guarded(jit: bool, pivot: bool = True):
    w = tf.Variable([1.0, 2.0])
    opt = tf.keras.optimizers.Adam(0.1)
    stats = StepStats()
    spec = (tf.TensorSpec([2], tf.float32), tf.TensorSpec([2], tf.float32))
    state = SentinelState(stats, spec, batch_size=2)

    @tf.function(jit_compile=jit)
    def step(x, grad, loss):
        state.guard(opt, [grad], loss, (x, grad), lambda g: opt.apply_gradients(zip(g, [w])),
                    pivot=pivot)
        stats.steps.assign_add(1)
    return w, opt, state, step


def _optimizer_state(opt) -> list:
    """Every variable of the optimizer (its step count, Adam's two slots), both Kerases."""
    variables = opt.variables() if callable(opt.variables) else opt.variables
    return [np.array(v.numpy()) for v in variables]


@pytest.mark.parametrize("jit", [False, True], ids=["gated", "xla"])
def test_a_skipped_step_leaves_the_optimizer_as_it_was_and_the_rest_of_the_step_runs(jit):
    """Adam: a faulty step changes no weight, no slot and not the optimizer's step count
    (its bias correction), while the step's other work (here the step counter) still runs.
    Without XLA the update waits on a pivot; under XLA, which compiles no Switch, on a
    tf.cond."""
    w, opt, state, step = _adam_guarded(jit)
    _run(step, [1, 1], [1, 1], 0.5)
    before = [w.numpy().copy()] + _optimizer_state(opt)
    assert not np.array_equal(before[0], [1.0, 2.0])           # step 1 landed
    _run(step, [2, 2], [1, np.inf], 0.5)
    after = [w.numpy()] + _optimizer_state(opt)
    assert len(after) == len(before) >= 4                     # weights, count, m, v
    for was, now in zip(before, after):
        np.testing.assert_array_equal(was, now)
    assert int(state.stats.steps.numpy()) == 2
    assert (state.counters().fault_step, state.counters().fault_code) == (2, 2)
    _run(step, [3, 3], [1, 1], 0.5)                             # latched: skipped too
    np.testing.assert_array_equal(w.numpy(), before[0])


@pytest.mark.parametrize("jit,pivot", [(False, True), (True, True), (False, False)],
                         ids=["gated", "xla", "fit"])
def test_the_update_is_behind_a_pivot_unless_xla_or_fit_puts_it_in_a_cond(jit, pivot):
    """Without XLA the writes to the weights are ops of the step itself, behind one pivot:
    a tf.cond would route every variable and slot through a Switch of its own after the
    test, about 1 point of the mlp's step (docs/numerics.md).  Under XLA they are in the cond's
    branch, and so they are when fit's step asks for it (``pivot=False``)."""
    w, _, _, step = _adam_guarded(jit, pivot)
    graph = step.get_concrete_function(*([tf.TensorSpec([2], tf.float32)] * 2),
                                       tf.TensorSpec([], tf.float32)).graph
    handle = next(inner for outer, inner in graph.captures if outer is w.handle)
    writes = [op for op in graph.get_operations() if any(t is handle for t in op.inputs)
              and ("Assign" in op.type or "Apply" in op.type)]
    assert bool(writes) is (pivot and not jit), [op.type for op in writes]
    for op in writes:   # each waits on the pivot, directly or through Adam's scalars
        assert any(a.type == "Switch" for a in _ancestors(op)), op.name


def test_fits_step_asks_for_the_update_in_a_cond():
    """``Model.fit``'s apply (``step_stats._applied``) guards with ``pivot=False``: in Keras
    2's fit the pivot measured 2 points slower than the cond (docs/numerics-cost-record.md)."""
    from app.training import step_stats

    seen = {}

    class Fit:
        @staticmethod
        def step():
            return tf.constant(0.5), None

    class Sentinel:
        fit = Fit()

        @staticmethod
        def guard(opt, grads, loss, batch, run, **kwargs):
            seen.update(kwargs)
            return grads, None, None
    step_stats._applied(Sentinel(), None, [tf.constant(1.0)], lambda g: None)
    assert seen == {"pivot": False}


def _ancestors(op) -> set:
    """Every op ``op`` waits on, through data and control edges."""
    seen, todo = set(), [op]
    while todo:
        current = todo.pop()
        for a in [t.op for t in current.inputs] + list(current.control_inputs):
            if a not in seen:
                seen.add(a)
                todo.append(a)
    return seen


MIRRORED_GUARD = '''
import json
import tensorflow as tf

tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2)
from app.training.sentinel import SentinelState
from app.training.step_stats import StepStats

strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
traces = []   # per trace of the step (tf.function traces twice when the first creates variables)
plain = tf.distribute.ReplicaContext.all_reduce


def counted(self, *args, **kwargs):
    traces[-1].append(1)
    return plain(self, *args, **kwargs)
tf.distribute.ReplicaContext.all_reduce = counted


def run(bad_replica, grad_bad, loss_bad, guarded=True):
    with strategy.scope():
        w = tf.Variable([1.0, 2.0])
        opt = tf.keras.optimizers.SGD(0.5)
    stats = StepStats()
    spec = (tf.TensorSpec([2], tf.float32), tf.TensorSpec([2], tf.float32))
    state = SentinelState(stats, spec, local_replicas=2, batch_size=2)

    def replica_step():
        rid = tf.distribute.get_replica_context().replica_id_in_sync_group
        mine = tf.equal(rid, bad_replica)
        grad = tf.where(mine, float("nan") if grad_bad else 1.0, 1.0) * tf.ones([2])
        loss = tf.where(mine, float("inf") if loss_bad else 0.5, 0.5)
        x = tf.cast(rid, tf.float32) * tf.ones([2])
        apply = lambda g: opt.apply_gradients(zip(g, [w]))
        state.guard(opt, [grad], loss, (x, grad), apply) if guarded else apply([grad])

    @tf.function
    def step():
        traces.append([])
        strategy.run(replica_step)
        stats.steps.assign_add(1)
    step()
    traced = len(traces[-1]) / 2   # each replica's trace calls it
    c = state.counters()
    return {"collectives": traced, "w": w.numpy().tolist(), "code": c.fault_code,
            "step": c.fault_step}

print(json.dumps({"grad": run(1, True, False), "loss": run(1, False, True),
                  "clean": run(-1, False, False), "unguarded": run(-1, False, False, False)}))
'''


def test_several_replicas_agree_in_one_all_reduce_and_keep_the_fault_kind():
    """MirroredStrategy over two logical CPUs (a fresh process: they must be made before
    TensorFlow starts).  Replica 1 alone has a NaN gradient (a gradient fault, code 2) or an
    inf loss (forward, code 1): neither replica updates, and the kind is the one every
    replica agreed on; the guard adds a single all-reduce to a replica's step (the gradients'
    and the loss's verdicts together) to what the optimizer's apply does itself."""
    import json
    import os
    import subprocess
    import sys

    from tests.paths import ROOT

    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run([sys.executable, "-c", MIRRORED_GUARD], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (out["grad"]["code"], out["grad"]["step"]) == (2, 1)
    assert (out["loss"]["code"], out["loss"]["step"]) == (1, 1)
    assert out["grad"]["w"] == out["loss"]["w"] == [1.0, 2.0]     # neither replica updated
    assert out["clean"]["code"] == 0 and out["clean"]["w"] == [0.0, 1.0]   # mean gradient 1
    own = out["unguarded"]["collectives"]     # the optimizer's apply, as Keras makes it
    assert [out[k]["collectives"] - own for k in ("grad", "loss", "clean")] == [1, 1, 1]


def test_the_headroom_probe_also_finds_a_weight_an_update_made_non_finite():
    """The probe's one call answers both: each layer's headroom and whether every weight
    is finite (the watch reads that as a 'weights' fault)."""
    from app.task import model_layers
    from app.numerics.headroom import HeadroomProbe

    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(3, name="hidden"),
                                 tf.keras.layers.Dense(2, name="out")])
    probe = HeadroomProbe(model, model_layers.walk(model))
    x = tf.ones((2, 4))
    probed = probe.measure(x)
    assert probed.weights_finite and set(probed.layers) >= {"hidden", "out"}
    kernel = model.get_layer("out").kernel
    kernel.assign(tf.tensor_scatter_nd_update(kernel, [[0, 1]], [np.inf]))
    probed = probe.measure(x)
    assert not probed.weights_finite
    assert not probed.layers["out"][2] and probed.layers["hidden"][2]
