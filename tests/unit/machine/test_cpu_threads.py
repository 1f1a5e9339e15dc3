"""TensorFlow's CPU thread pools as the environment sets them, and the AMX deadlock of TF
2.9's bfloat16 convolutions (app/machine/cpu_threads.py; the image's entrypoint side is
tests/image/test_run.py::test_one_inter_op_thread_on_an_amx_cpu_without_a_gpu)."""
import os
from types import SimpleNamespace

import pytest

from app.machine.cpu_threads import describe, state


@pytest.mark.parametrize("environ, amx, gpus, version, hang", [
    ({}, True, 0, "2.9.3", True),                                   # the image, entrypoint bypassed
    ({"TF_NUM_INTEROP_THREADS": "1"}, True, 0, "2.9.3", False),     # as the entrypoint sets it
    ({"TF_NUM_INTEROP_THREADS": "2"}, True, 0, "2.9.3", True),
    ({"TF_NUM_INTEROP_THREADS": "0"}, True, 0, "2.9.3", True),      # 0: TensorFlow's default
    ({"TF_NUM_INTEROP_THREADS": "x"}, True, 0, "2.9.3", True),
    ({}, False, 0, "2.9.3", False),                                 # no AMX
    ({}, True, 1, "2.9.3", False),                                  # a GPU: its ops are not oneDNN's
    ({}, True, 0, "2.21.0", False),                                 # never hung on 2.21
    ({}, True, 0, "2.10.0", False),
    ({}, True, 0, "2.8.4", True),
    ({}, True, 0, "nightly", False),
])
def test_the_amx_hang_is_named_where_it_can_happen(environ, amx, gpus, version, hang):
    assert state(environ, amx, gpus, version)["amx_hang"] is hang


def test_the_pools_as_set():
    s = state({"TF_NUM_INTEROP_THREADS": " 1 ", "TF_NUM_INTRAOP_THREADS": "8"}, True, 0, "2.9.3")
    assert (s["inter_op"], s["intra_op"]) == (1, 8) and s["cores"] >= 1
    assert describe(s) == f"inter-op 1, intra-op 8 ({s['cores']} core(s))"
    unset = state({}, False, 0, "2.9.3")
    assert describe(unset).startswith("inter-op TensorFlow's default, intra-op TensorFlow's default")
    hang = describe(state({}, True, 0, "2.9.3"))
    assert "can deadlock on this CPU with AMX: set TF_NUM_INTEROP_THREADS=1" in hang


def _model(conv: bool):
    import tensorflow as tf

    layers = [tf.keras.Input((8, 8, 1))]
    if conv:
        layers += [tf.keras.layers.Conv2D(4, 3, name="first_conv"),
                   tf.keras.layers.Conv2D(4, 3, name="second_conv")]
    layers += [tf.keras.layers.Flatten(), tf.keras.layers.Dense(2)]
    return tf.keras.Sequential(layers)


@pytest.mark.parametrize("conv, policy, environ", [
    (True, "mixed_bfloat16", {}),
    (False, "mixed_bfloat16", {}),                                  # no convolution to hang
    (True, "float32", {}),
    (True, "mixed_bfloat16", {"TF_NUM_INTEROP_THREADS": "1"}),      # the entrypoint's setting
])
def test_a_run_without_the_entrypoint_is_warned(monkeypatch, capsys, conv, policy, environ):
    """`tfmp train` on an AMX CPU without a GPU, its inter-op threads not set to 1: a
    mixed_bfloat16 model with convolutions is warned, on TF 2.9 only (the image's self-test
    runs this there; the host's TensorFlow has never hung)."""
    import tensorflow as tf

    from app.machine.hardware import HardwareInfo
    from app.training import job

    monkeypatch.delenv("TF_NUM_INTEROP_THREADS", raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    run = SimpleNamespace(decision=SimpleNamespace(policy=policy),
                          hardware=HardwareInfo(cpu_flags=frozenset({"amx_bf16", "amx_tile"})))
    threads = state(os.environ, True, 0, tf.__version__)   # as envreport.collect() reports it
    job._warn_of_the_amx_hang(run, _model(conv), threads)
    err = capsys.readouterr().err
    on_29 = tf.__version__.startswith("2.9.")
    if conv and policy == "mixed_bfloat16" and not environ and on_29:
        assert err == ("warning: with more than one inter-op thread TF 2.9's bfloat16 "
                       "convolutions (this model's 'first_conv' and 1 more) can deadlock on this "
                       "CPU with AMX: set TF_NUM_INTEROP_THREADS=1 before Python starts (the "
                       "image's entrypoint does; docs/image.md, \"CPUs with AMX\")\n")
    else:
        assert err == ""
