"""Under mixed_float16 with no GPU, apply_policy turns Grappler's remapper off: its fused
float16 MatMul + BiasAdd on a CPU took 22x the unfused ops in a whole mlp run on TF 2.21
(tests/benchmarks/bench_cpu_float16_fusion.py).  Any other policy, or a GPU, gives back
TensorFlow's default, and a setting of the user's own is left alone."""
import pytest
import tensorflow as tf

from app.precision import policy as prec


@pytest.fixture(autouse=True)
def _from_float32():
    """Each test starts with the remapper not turned off by apply_policy: the process may
    hold mixed_float16 from before, and a setting made while apply_policy holds the remapper
    off cannot be told from its own.  tests/unit/conftest.py puts the policy back after
    each test, through apply_policy, which gives the remapper back with it."""
    prec.apply_policy("float32")


def remapping():
    return tf.config.optimizer.get_experimental_options().get("remapping", True)


def test_mixed_float16_on_a_cpu_turns_the_remapper_off_and_other_policies_turn_it_back():
    prec.apply_policy("mixed_float16")
    assert remapping() is False
    prec.apply_policy("mixed_bfloat16")     # its fused form is fast: kept
    assert remapping() is True
    prec.apply_policy("mixed_float16")
    prec.apply_policy("float32")
    assert remapping() is True


def test_with_a_gpu_visible_the_remapper_stays_on(monkeypatch):
    real = tf.config.list_physical_devices
    monkeypatch.setattr(tf.config, "list_physical_devices",
                        lambda kind=None: ["GPU:0"] if kind == "GPU" else real(kind))
    prec.apply_policy("mixed_float16")
    assert remapping() is True


def test_a_users_own_remapper_setting_is_left_alone():
    tf.config.optimizer.set_experimental_options({"remapping": False})
    try:
        prec.apply_policy("float32")        # apply_policy did not turn it off: not ours
        assert remapping() is False
    finally:
        tf.config.optimizer.set_experimental_options({"remapping": True})


def test_a_float16_dense_is_not_fused_in_a_function_traced_after_the_policy():
    """The graph option reaches the functions traced after it: the ops TensorFlow ran for
    a Dense layer's forward pass (its graph after Grappler) hold no fused MatMul; under
    float32 the same layer is fused, as TensorFlow does by default."""
    def ops_of_a_dense():
        layer = tf.keras.layers.Dense(8, activation="relu")
        return optimised_op_types(tf.function(lambda x: layer(x)), tf.ones([2, 4]))

    prec.apply_policy("mixed_float16")
    ops = ops_of_a_dense()
    assert any("MatMul" in op for op in ops) and not any("Fused" in op for op in ops), ops
    prec.apply_policy("float32")
    assert any("FusedMatMul" in op for op in ops_of_a_dense())


def optimised_op_types(fn, *args) -> set:
    """The op types of the graphs TensorFlow ran for one call of ``fn``, after Grappler
    (the run metadata's function graphs, after optimisation and partitioned)."""
    from tensorflow.python.eager import context

    ctx = context.context()
    ctx.enable_graph_collection()
    ctx.enable_run_metadata()
    try:
        fn(*args)
        meta = ctx.export_run_metadata()
    finally:
        ctx.disable_run_metadata()
        ctx.disable_graph_collection()
    graphs = [g for f in meta.function_graphs
              for g in [f.post_optimization_graph, *f.partition_graphs]]
    return {node.op for g in graphs for node in g.node}
