"""app.machine.kernels: the rule (fake CPUs of both kinds), the refusal lines, and the probe against
the rule on the TensorFlow that runs the suite (TF 2.9 in the image, a current one on the host)."""
from __future__ import annotations

import re

import pytest

from app.machine import kernels
from app.core import catalog as registry
from app.core.errors import PrecisionUnsupported
from app.machine.kernels import Machine

BF16 = "mixed_bfloat16"
# /proc/cpuinfo flags of the two kinds of CPU these machines have.
AMD_EPYC_ZEN3 = frozenset("fpu sse2 avx avx2 fma bmi2 sha_ni vaes vpclmulqdq".split())
INTEL_SPR = frozenset("avx avx2 fma avx512f avx512bw avx512vl avx512dq avx512cd avx512_vnni "
                      "avx512_bf16 amx_tile amx_bf16 amx_int8".split())
INTEL_SKYLAKE = frozenset("avx avx2 fma avx512f avx512bw avx512vl avx512dq avx512cd".split())
CONVS = ("Conv1D", "Conv2D", "Conv2DTranspose", "Conv3D", "DepthwiseConv2D", "SeparableConv2D")


def test_tf29_on_a_cpu_without_avx512_has_no_bfloat16_convolutions():
    m = Machine("2.9.3", AMD_EPYC_ZEN3)
    assert kernels.onednn(m)[0] is False and "none of them" in kernels.onednn(m)[1]
    fails = kernels.expected_failures(BF16, m)
    assert set(fails) == set(kernels.KINDS) - {"Dense", "Embedding", "MaxPooling2D"}
    assert set(CONVS) | {"BatchNormalization", "LayerNormalization"} <= set(fails)
    why = fails["Conv2D"].text("Conv2D")
    assert "TensorFlow 2.9" in why and "this CPU lacks AVX-512" in why and "Conv2D" in why
    assert fails["Conv2D"].allowed == kernels.ALLOWED
    assert kernels.probe_is_safe(BF16, m)


def test_tf29_on_an_avx512_bf16_cpu_runs_convolutions_but_not_every_gradient():
    m = Machine("2.9.3", INTEL_SPR)
    assert kernels.onednn(m) == (True, "on by default: the CPU has AVX512_VNNI, AVX512_BF16, "
                                       "AMX_TILE, AMX_INT8, AMX_BF16")
    fails = kernels.expected_failures(BF16, m)
    assert set(fails) == {"Conv3D", "DepthwiseConv2D", "SeparableConv2D", "LSTM", "GRU"}
    assert "gradient" in fails["DepthwiseConv2D"].text("DepthwiseConv2D")
    assert "Ampere" in fails["DepthwiseConv2D"].allowed


@pytest.mark.parametrize("flags", [AMD_EPYC_ZEN3, INTEL_SPR, INTEL_SKYLAKE])
def test_tf29s_lstm_and_gru_fail_for_their_cudnn_op_on_any_cpu(flags):
    """Keras 2.9 traces cuDNN's RNN op beside the generic loop; the op takes no bfloat16,
    whatever oneDNN does (measured in the image: eager calls work, traced ones fail)."""
    fails = kernels.expected_failures(BF16, Machine("2.9.3", flags))
    for kind in ("LSTM", "GRU"):
        assert fails[kind] is kernels.CUDNN_RNN_CAUSE
        assert f"Keras 2.9 builds cuDNN's fused RNN op beside the generic loop of {kind}" in fails[kind].text(kind)
    assert "recurrent_dropout" in fails["LSTM"].allowed


def test_a_build_that_fails_for_a_bfloat16_op_is_the_refusal_naming_the_layer(monkeypatch):
    m = Machine("2.9.3", INTEL_SPR)
    monkeypatch.setitem(kernels._CACHE, BF16, kernels.reconcile(
        BF16, m, {k: "TypeError: in user code:" for k in kernels.expected_failures(BF16, m)}))
    keras2 = TypeError('Exception encountered when calling layer "forward_gru" (type GRU).\n\n'
                       "Value passed to parameter 'input' has DataType bfloat16 not in list of "
                       "allowed values: float16, float32, float64")
    line = kernels.refusal_from_error(keras2, "seq.py:build").line()
    assert line.startswith("error: mixed_bfloat16 cannot run layer 'forward_gru' (GRU) of model "
                           "'seq.py:build' here: Keras 2.9 builds cuDNN's fused RNN op beside the generic loop of GRU")
    # a layer of no known kind: the op's own words
    odd = TypeError('Exception encountered when calling layer "mine" (type Mine).\n'
                    "Value passed to parameter 'x' has DataType bfloat16 not in list of "
                    "allowed values: float32")
    line = kernels.refusal_from_error(odd, "m:b").line()
    assert line.startswith(
        "error: mixed_bfloat16 cannot run layer 'mine' (Mine) of model 'm:b': one of its "
        "ops takes no bfloat16 (Value passed to parameter 'x' has DataType bfloat16")
    assert line.endswith("allowed: --precision float32, or --float32-layers mine (that layer "
                         "in float32, the rest in bfloat16)")
    # Keras 3 names only the class: the model's layer of that class is named
    keras3 = RuntimeError("Exception encountered when calling LogGamma.call().\n\nCould not "
                          "find device for node: {{node Lgamma}} = Lgamma[T=DT_BFLOAT16]")
    assert "layer 'block/lg' (LogGamma) of model 'm:b': TensorFlow has no bfloat16 kernel for " \
        "its op Lgamma here" in kernels.refusal_from_error(keras3, "m:b",
                                                           [("block/lg", "LogGamma")]).line()
    assert kernels.refusal_from_error(ValueError("shapes differ"), "m:b") is None


def test_an_op_without_a_float16_kernel_in_a_training_step_is_named_by_its_node():
    """Keras' RandomContrast runs AdjustContrastv2, float32 only on a CPU: under
    mixed_float16 the first fit step failed with a traceback (TF 2.9, measured)."""
    import tensorflow as tf

    fit_error = RuntimeError(
        "Graph execution error:\n\nNo OpKernel was registered to support Op "
        "'AdjustContrastv2' used by {{node model/augment/random_contrast/loop_body/"
        "adjust_contrast}} with these attrs: [T=DT_HALF]\nRegistered devices: [CPU]\n"
        "\t [[model/augment/random_contrast/loop_body/adjust_contrast]] [Op:__inference_"
        "train_function_5924]")
    layers = [("augment", "Sequential"), ("augment/random_contrast", "RandomContrast"),
              ("conv2d", "Conv2D")]
    refusal = kernels.refusal_from_error(fit_error, "aug.py:build", layers, "mixed_float16")
    assert refusal.policy == "mixed_float16"
    cpu = " (on this CPU; a GPU's kernels may have it: run check there before you change " \
        "the model)" if not tf.config.list_physical_devices("GPU") else ""
    assert refusal.line() == (
        "error: mixed_float16 cannot run layer 'augment/random_contrast' (RandomContrast) of "
        "model 'aug.py:build': TensorFlow has no float16 kernel for its op AdjustContrastv2 "
        f"here{cpu}; allowed: --precision float32, or --float32-layers augment/random_contrast "
        "(that layer in float32, the rest in float16)")
    # The same error is none of bfloat16's, and float32 has no refusal at all.
    assert kernels.refusal_from_error(fit_error, "m:b", layers, "mixed_bfloat16") is None
    assert kernels.refusal_from_error(fit_error, "m:b", layers, "float32") is None


def test_an_rnn_that_cannot_use_cudnn_is_of_no_probed_kind():
    import tensorflow as tf

    assert kernels.kind_of(tf.keras.layers.LSTM(2)) == "LSTM"
    assert kernels.kind_of(tf.keras.layers.GRU(2)) == "GRU"
    generic = tf.keras.layers.LSTM(2, recurrent_dropout=0.1)
    # Keras 2 says whether it may take cuDNN's path; Keras 3 has no such attribute
    expected = None if hasattr(generic, "_could_use_gpu_kernel") else "LSTM"
    assert kernels.kind_of(generic) == expected


@pytest.mark.parametrize("env, flags, expect", [
    ("0", INTEL_SPR, "TF_ENABLE_ONEDNN_OPTS=0 turns it off"),   # how this suite forces it
    ("false", INTEL_SPR, "TF_ENABLE_ONEDNN_OPTS=0 turns it off"),
    (None, INTEL_SKYLAKE, "neither VNNI nor BF16"),
])
def test_oneDNN_off_on_an_avx512_cpu_names_the_reason(env, flags, expect):
    fails = kernels.expected_failures(BF16, Machine("2.9.3", flags, env))
    assert "Conv2D" in fails and expect in fails["Conv2D"].text("Conv2D")
    if env is None:
        assert "TF_ENABLE_ONEDNN_OPTS=1" in fails["Conv2D"].allowed


def test_oneDNN_forced_on_without_avx512_is_never_probed():
    """oneDNN's bfloat16 needs AVX-512: limited to AVX2 it segfaults in the first MatMul."""
    for m in (Machine("2.9.3", AMD_EPYC_ZEN3, "1"), Machine("2.9.3", INTEL_SPR, None, 0, "AVX2")):
        assert not kernels.probe_is_safe(BF16, m)
        fails = kernels.expected_failures(BF16, m)
        assert set(fails) == set(kernels.KINDS) and "crashes" in fails["Dense"].text("Dense")
        support = kernels.reconcile(BF16, m, None)
        assert support.everything and not support.probed
        refusal = kernels.refusal_for_layers(support, [("act", "MyLayer", None)], "m.py:build")
        assert refusal is not None and "layer 'act' (MyLayer)" in refusal.line()


@pytest.mark.parametrize("m", [Machine("2.16.1", AMD_EPYC_ZEN3), Machine("2.9.3", AMD_EPYC_ZEN3,
                                                                         gpus=1)])
def test_no_rule_outside_tf29_on_a_cpu(m):
    assert kernels.expected_failures(BF16, m) is None
    assert kernels.expected_failures("float32", Machine("2.9.3", AMD_EPYC_ZEN3)) is None


def test_refusal_lines_name_the_layer_the_cause_and_what_works():
    m = Machine("2.9.3", AMD_EPYC_ZEN3)
    support = kernels.reconcile(BF16, m, {"Conv2D": "ValueError: x",
                                          "BatchNormalization": "ValueError: y"})
    line = kernels.refusal_for_kinds(support, registry.layer_kinds("resnet"), "resnet").line()
    assert line == (
        "error: mixed_bfloat16 cannot run the Conv2D layers of model 'resnet' (also "
        "BatchNormalization) here: TensorFlow 2.9 has bfloat16 CPU kernels for Conv2D only in "
        "oneDNN, which it turns on only on CPUs with AVX-512 (VNNI or BF16) or AMX, and this "
        "CPU lacks AVX-512; allowed: --precision float32, or mixed_bfloat16 on a CPU with "
        "AVX-512 (VNNI or BF16) or AMX, or a GPU from Ampere on")
    assert kernels.refused_policy(line) == BF16 and kernels.refused_policy(line[7:]) == BF16
    assert kernels.refused_policy("error: output directory 'x' already holds a run") is None
    assert kernels.refused_policy("error: mixed_float16 cannot run layer 'a' (A) of model "
                                  "'m:b': TensorFlow has no float16 kernel") == "mixed_float16"
    assert kernels.refusal_for_kinds(support, registry.layer_kinds("mlp"), "mlp") is None
    layers = [("dense", "Dense", "Dense"), ("block/conv", "MyConv", "Conv2D")]
    err = kernels.refusal_for_layers(support, layers, "./heavy.py:build")
    assert isinstance(err, PrecisionUnsupported) and err.policy == BF16
    assert err.line().startswith("error: mixed_bfloat16 cannot run layer 'block/conv' (MyConv) of "
                                 "model './heavy.py:build' here: TensorFlow 2.9 has bfloat16 CPU "
                                 "kernels for Conv2D only in oneDNN")
    # A kind the rule did not foresee: the probe's own error, in words.
    odd = kernels.reconcile(BF16, Machine("2.9.3", INTEL_SPR), {"Embedding": "NotFoundError: z"})
    assert odd.failing["Embedding"].text("Embedding") == (
        "TensorFlow 2.9.3 has no bfloat16 kernel for Embedding here (a tiny Embedding failed "
        "forward or backward: NotFoundError: z)")


def test_support_survives_the_env_report_and_refuses_builtins_from_it():
    support = kernels.reconcile(BF16, Machine("2.9.3", AMD_EPYC_ZEN3, "0"), {"Conv2D": "E: 1"})
    d = support.to_dict()
    assert d["runs"] == [k for k in kernels.KINDS if k != "Conv2D"] and d["probed"]
    assert d["onednn"] == {"on": False, "why": "TF_ENABLE_ONEDNN_OPTS=0 turns it off"}
    assert d["causes"][0]["kinds"] == ["Conv2D"] and "these layer types" in d["causes"][0]["why"]
    env = {"precision_support": {BF16: d}}
    assert set(kernels.builtin_refusals("cnn", env)) == {BF16}
    assert kernels.builtin_refusals("mlp", env) == {}
    assert kernels.builtin_refusals("./net.py:build", env) == {}
    assert kernels.builtin_refusals("cnn", {}) == {}


def test_fake_cpus_through_the_benchmark_plan():
    from app.benchmark import plan
    from app.machine.hardware import HardwareInfo

    hw = HardwareInfo(cpu_flags=INTEL_SPR)
    cannot = {BF16: "mixed_bfloat16 cannot run the Conv2D layers of model 'cnn' here: ..."}
    for requested in (None, ["float32", BF16]):
        p = plan.plan_policies(requested, hw, cannot)
        assert p.run == ("float32",) and p.skipped[BF16] == cannot[BF16]
    assert plan.plan_policies([BF16], hw).run == ("float32", BF16)


# ---- the real TensorFlow ---------------------------------------------------------------------

def test_registry_kinds_are_the_builtin_models_kinds():
    import tensorflow as tf

    from app.task import model_layers, models

    for name in registry.MODEL_NAMES:
        model = models.build_model(name, registry.builtin_input_shape(name), 10)
        found = {kernels.kind_of(l) for l in model.layers if not isinstance(l, tf.keras.Model)}
        assert found - {None} == set(registry.layer_kinds(name)), name


def test_the_probe_agrees_with_the_rule_here_and_leaves_no_trace():
    """On TF 2.9 (the image) the rule must foresee exactly what the probe finds, on this
    CPU and with this machine's oneDNN setting; elsewhere the probe alone decides."""
    import tensorflow as tf

    before = tf.keras.mixed_precision.global_policy().name
    support = kernels.support(BF16)
    assert kernels.support(BF16) is support            # once per process
    assert tf.keras.mixed_precision.global_policy().name == before
    m = kernels.this_machine()
    rule = kernels.expected_failures(BF16, m)
    if rule is not None and support.probed:
        assert set(support.failing) == set(rule), (support.errors, m)
    assert "Dense" in support.to_dict()["runs"] or support.everything
    # no automatic layer name used up: a new Dense is still "dense" if none was made before
    name = tf.keras.layers.Dense(1).name
    assert not name.startswith("tfmp_probe")


def test_check_model_passes_float32_models_without_probing(monkeypatch):
    import tensorflow as tf

    from app.task import model_layers, models

    monkeypatch.setattr(kernels, "support", lambda *a, **k: pytest.fail("probed"))
    tf.keras.mixed_precision.set_global_policy("float32")
    model_layers.check_model(models.build_model("cnn", (28, 28, 1), 10), "cnn")


# ---- the refusal where it is used, with a machine that lacks bfloat16 convolutions -----------

@pytest.fixture
def no_bf16_convs(monkeypatch):
    """This process' probe result replaced by a TF 2.9 CPU without AVX-512's."""
    m = Machine("2.9.3", AMD_EPYC_ZEN3)
    fails = kernels.expected_failures(BF16, m)
    monkeypatch.setitem(kernels._CACHE, BF16, kernels.reconcile(
        BF16, m, {k: "ValueError: Incompatible type conversion" for k in fails}))


def test_train_refuses_a_builtin_before_any_data_loads(no_bf16_convs, tiny_config, tmp_path):
    from app.training.job import prepare

    # mnist offline from an empty data folder would fail with another line if data were
    # loaded (a folder that does not exist is refused earlier, with the other settings)
    (tmp_path / "empty").mkdir()
    cfg = tiny_config(model="cnn", dataset="mnist", precision=BF16,
                      data_dir=str(tmp_path / "empty"))
    with pytest.raises(PrecisionUnsupported) as err:
        prepare(cfg)
    assert err.value.line().startswith("error: mixed_bfloat16 cannot run the Conv2D layers of "
                                       "model 'cnn' here: TensorFlow 2.9")
    assert not (tmp_path / "run").exists()
    # auto falls back to float32 and says why; a Dense-only model trains in bfloat16
    from app.machine.hardware import HardwareInfo

    auto = prepare(tiny_config(model="cnn", precision="auto", max_train_samples=64),
                   hardware=HardwareInfo(cpu_flags=INTEL_SPR))
    assert auto.decision.policy == "float32"
    assert "so bfloat16 math is native, but mixed_bfloat16 cannot run the Conv2D layers of " \
        "model 'cnn' here: TensorFlow 2.9 has bfloat16 CPU kernels for Conv2D only in " \
        "oneDNN" in auto.decision.reason
    assert prepare(tiny_config(model="mlp", precision=BF16)).decision.policy == BF16


def test_a_users_model_is_refused_after_its_build_not_blamed(no_bf16_convs, tiny_config):
    import os

    from app.task.task import Task

    from tests.paths import USER_MODELS

    task = Task.from_specs(os.path.join(USER_MODELS, "normalized.py") + ":build",
                           "synthetic", input_shape=(8, 8, 1))
    import tensorflow as tf

    bundle = task.load_data(8, max_train_samples=16, max_val_samples=8)
    tf.keras.mixed_precision.set_global_policy(BF16)
    with pytest.raises(PrecisionUnsupported) as err:
        task.build(bundle, bundle.sample_batch)
    line = err.value.line()
    assert "your code raised" not in line and line.startswith("error: mixed_bfloat16 cannot run "
                                                             "layer 'conv2d")
    assert "(also BatchNormalization, LayerNormalization)" in line
    assert "allowed: " + kernels.ALLOWED + ", or --float32-layers conv2d," in line
    assert line.endswith(" (those layers in float32, the rest in bfloat16)"), line


@pytest.fixture
def no_bf16_lstm(monkeypatch):
    """This process' probe result replaced by TF 2.9's on a CPU with AVX512_BF16: every kind
    runs but three convolutions' gradients and the LSTM and GRU."""
    m = Machine("2.9.3", INTEL_SPR)
    monkeypatch.setitem(kernels._CACHE, BF16, kernels.reconcile(
        BF16, m, {k: "TypeError: in user code:" for k in kernels.expected_failures(BF16, m)}))


def test_auto_tries_bfloat16_on_a_users_model_and_falls_back_for_an_lstm(no_bf16_lstm,
                                                                         tiny_config, tmp_path):
    """auto never picks a policy it would refuse: the model is built once under bfloat16,
    checked, dropped; the run folder is named for float32, and the names of the layers the
    run builds are the first ones (Keras' counters cleared)."""
    import os

    import tensorflow as tf

    from app.machine.hardware import HardwareInfo
    from app.training.job import prepare
    from tests.paths import USER_MODELS

    recurrent = os.path.join(USER_MODELS, "recurrent.py")
    spr = HardwareInfo(cpu_flags=INTEL_SPR)
    run = prepare(tiny_config(model=f"{recurrent}:build", dataset=f"{recurrent}:arrays",
                              precision="auto", output=None), hardware=spr)
    assert run.decision.policy == "float32"
    assert ("so bfloat16 math is native, but mixed_bfloat16 cannot run layer 'lstm' (LSTM) of "
            f"model '{recurrent}:build' here: Keras 2.9 builds cuDNN's fused RNN op beside the generic loop of LSTM"
            ) in run.decision.reason
    assert run.output.endswith("-float32") and not os.path.exists(run.output)
    assert tf.keras.mixed_precision.global_policy().name == "float32"
    assert tf.keras.layers.LSTM(2).name == "lstm"
    # the generic loop runs in bfloat16: auto keeps it; so does a model of Dense layers
    for build in ("build_generic",) if hasattr(tf.keras.layers.LSTM(2, recurrent_dropout=0.1),
                                               "_could_use_gpu_kernel") else ():
        kept = prepare(tiny_config(model=f"{recurrent}:{build}", dataset=f"{recurrent}:arrays",
                                   precision="auto"), hardware=spr)
        assert kept.decision.policy == BF16
    assert prepare(tiny_config(model=os.path.join(USER_MODELS, "policy_aware.py") + ":build",
                               precision="auto", input_shape="8,8,1"),
                   hardware=spr).decision.policy == BF16


def test_an_lstm_in_bfloat16_is_refused_in_one_line_whose_float32_layers_flag_trains(
        no_bf16_lstm, tiny_config):
    import os

    from app.training.job import train
    from tests.paths import USER_MODELS

    recurrent = os.path.join(USER_MODELS, "recurrent.py")
    with pytest.raises(PrecisionUnsupported) as err:
        train(tiny_config(model=f"{recurrent}:build", dataset=f"{recurrent}:arrays",
                          precision=BF16))
    assert err.value.line().startswith(
        f"error: mixed_bfloat16 cannot run layer 'lstm' (LSTM) of model '{recurrent}:build' here")
    assert err.value.line().endswith(
        ", or --float32-layers lstm (that layer in float32, the rest in bfloat16)")
    # The flag it gives: the LSTM computes in float32 from the model function's first call of
    # it (Keras 2.9 traces its cuDNN op there), the Dense layers in bfloat16.  Keras' names
    # as a new process (the command line) gives them.
    import tensorflow as tf

    tf.keras.backend.clear_session()
    m = train(tiny_config(model=f"{recurrent}:build", dataset=f"{recurrent}:arrays",
                          precision=BF16, float32_layers="lstm", epochs=1))
    assert m["status"] == "completed" and m["precision"]["policy"] == BF16
    assert m["task"]["float32_layers"] == ["lstm"]


def test_an_op_without_a_bfloat16_kernel_is_a_refusal_and_float32_layers_is_its_fix(
        no_bf16_lstm, tiny_config, tmp_path):
    """A custom layer's op with no bfloat16 kernel failed on the first batch as "your code
    raised NotFoundError"; auto picked bfloat16 for it and blamed the user.  auto's part
    reads the probe of a CPU with AVX512_BF16 (``no_bf16_lstm``): on TF 2.9 without
    AVX-512, auto gives up bfloat16 for any model before it builds one (oneDNN is off),
    and this test then ran into that reason instead of the trial's."""
    import os

    from app.machine.hardware import HardwareInfo
    from app.training.job import prepare, train
    from tests.paths import USER_MODELS

    spec = os.path.join(USER_MODELS, "no_bf16_op.py") + ":build"
    cfg = dict(model=spec, input_shape="8", epochs=1)
    with pytest.raises(PrecisionUnsupported) as err:
        train(tiny_config(precision=BF16, **cfg))
    assert err.value.line() == (
        f"error: mixed_bfloat16 cannot run layer 'log_gamma' (LogGamma) of model '{spec}': "
        "TensorFlow has no bfloat16 kernel for its op Lgamma here; allowed: --precision "
        "float32, or --float32-layers log_gamma (that layer in float32, the rest in bfloat16)")
    m = train(tiny_config(precision=BF16, float32_layers="log_gamma",
                          output=str(tmp_path / "fixed"), **cfg))
    assert m["status"] == "completed" and m["precision"]["policy"] == BF16
    auto = prepare(tiny_config(precision="auto", **cfg),
                   hardware=HardwareInfo(cpu_flags=INTEL_SPR))
    assert auto.decision.policy == "float32"
    assert auto.decision.reason.endswith("but mixed_bfloat16 cannot run layer 'log_gamma' "
                                         f"(LogGamma) of model '{spec}': TensorFlow has no "
                                         "bfloat16 kernel for its op Lgamma here")


def test_check_under_auto_checks_what_train_would_pick(no_bf16_lstm, monkeypatch):
    """`tfmp check --precision auto` said "auto chose mixed_bfloat16" for a model train
    trains in float32 under auto, and blocked on the layer (found by a QA pass)."""
    import os

    from app.doctor.check import check
    from app.machine import hardware
    from tests.paths import USER_MODELS

    monkeypatch.setattr(hardware, "detect", lambda: hardware.HardwareInfo(cpu_flags=INTEL_SPR))
    spec = os.path.join(USER_MODELS, "no_bf16_op.py") + ":build"
    report = check(model=spec, data="synthetic", input_shape=(8,), precision="auto",
                   batch_size=16, steps=2, verbose=False)
    assert report["policy"] == "float32", report["precision"]
    assert report["precision"]["reason"].endswith(
        "but mixed_bfloat16 cannot run layer 'log_gamma' (LogGamma) of model "
        f"'{spec}': TensorFlow has no bfloat16 kernel for its op Lgamma here")
    assert report["verdict"] != "blocked", report["findings"]


def test_a_layer_that_fails_as_the_model_function_calls_it_takes_the_flag(tiny_config, tmp_path):
    """Keras 2.9's RandomRotation stops the model function under mixed_bfloat16 (its transform
    op takes no bfloat16): the line gives --float32-layers, and with it the layer computes
    in float32 from that first call, the rest in bfloat16, and the run trains."""
    import os

    import tensorflow as tf

    from app.precision.layer_policy import policy_name
    from app.training.job import train
    from tests.paths import USER_MODELS

    spec = os.path.join(USER_MODELS, "no_bf16_op.py") + ":rotated"
    cfg = dict(model=spec, input_shape="16,16,3", epochs=1, max_train_samples=64,
               max_val_samples=16, precision=BF16)
    try:
        train(tiny_config(**cfg))
    except PrecisionUnsupported as err:   # Keras 2.9; Keras 3's rotation takes bfloat16
        line = err.line()
        assert line.startswith(f"error: mixed_bfloat16 cannot run layer 'rotate' "
                               f"(RandomRotation) of model '{spec}': one of its ops takes no "
                               "bfloat16 ("), line
        assert line.endswith("; allowed: --precision float32, or --float32-layers rotate (that "
                             "layer in float32, the rest in bfloat16)"), line
    tf.keras.backend.clear_session()
    m = train(tiny_config(float32_layers="rotate", save_model=True,
                          output=str(tmp_path / "fixed"), **cfg))
    assert m["status"] == "completed" and m["precision"]["policy"] == BF16
    assert m["task"]["float32_layers"] == ["rotate"]
    saved = tf.keras.models.load_model(m["model_path"], compile=False)
    assert [policy_name(saved.get_layer(n)) for n in ("rotate", "dense")] == [
        "float32", BF16]


def test_check_reports_it_as_a_blocker(no_bf16_convs):
    from app.doctor.check import check

    report = check("cnn", precision=BF16, batch_size=8, steps=1, verbose=False)
    assert report["verdict"] == "blocked"
    (finding,) = [f for f in report["findings"] if f["check"] == "kernels"]
    assert finding["severity"] == "blocker" and "Conv2D" in finding["what"]
    # (Keras numbers the layer on in a process that built one before: conv2d_N.)
    assert re.fullmatch(re.escape("use " + kernels.ALLOWED) + r", or --float32-layers "
                        r"conv2d(_\d+)? \(that layer in float32, the rest in bfloat16\)",
                        finding["fix"]), finding["fix"]


def test_benchmark_leaves_a_refused_policy_out_and_goes_on(tmp_path):
    """A user's model: its first run under the policy exits 2 with the refusal line."""
    import json
    import os

    from app.benchmark import suite
    from tests.unit.benchmark.test_benchmark_report import FAKE_ENV, SETTINGS, FakeTrain

    line = ("error: mixed_bfloat16 cannot run layer 'conv2d' (Conv2D) of model 'n.py:build' "
            "here: TensorFlow 2.9 ...; allowed: --precision float32")

    class Refusing(FakeTrain):
        def __call__(self, cmd, log_path, timeout, env):
            if "--precision" in cmd and cmd[cmd.index("--precision") + 1] == BF16:
                self.calls.append(BF16)
                with open(log_path, "w") as fh:
                    fh.write(line + "\n")
                return 2
            return super().__call__(cmd, log_path, timeout, env)

    fake, out = Refusing(), str(tmp_path / "bench")
    rc = suite.run_benchmark(dict(SETTINGS), ["float32", BF16], out, repeats=2, warmup_epochs=1,
                             max_accuracy_gap=1.0, launcher=fake, environment=FAKE_ENV,
                             echo=lambda s: None)
    doc = json.load(open(os.path.join(out, "benchmark.json")))
    assert rc == 0 and fake.calls == ["float32", BF16, "float32"]   # tried once, then left out
    assert doc["policies_run"] == ["float32"]
    assert doc["skipped"] == [{"policy": BF16, "reason": line[len("error: "):]}]
    # a built-in model: left out from the env report, no run at all
    env = dict(FAKE_ENV, precision_support={BF16: kernels.reconcile(
        BF16, Machine("2.9.3", AMD_EPYC_ZEN3), {"Conv2D": "E"}).to_dict()})
    fake2 = FakeTrain()
    suite.run_benchmark(dict(SETTINGS, model="cnn"), None, str(tmp_path / "b2"), repeats=1,
                        warmup_epochs=1, max_accuracy_gap=1.0, launcher=fake2, environment=env,
                        echo=lambda s: None)
    assert fake2.calls == ["float32"]


def test_tune_leaves_a_refused_policy_out_and_goes_on(monkeypatch, tmp_path):
    """A user's model: the first trial under the policy reports it unsupported; a built-in
    model: left out from the env report before any trial; every policy refused: exit 2."""
    import json

    from app.tuner import runner
    from app.tuner import tuning as api
    from app.tuner.search import Outcome

    env = {"hardware": {"gpus": []}, "auto_precision": {"policy": "float32"},
           "tensorflow": "2.9.3",
           "precision_support": {BF16: kernels.reconcile(BF16, Machine("2.9.3", AMD_EPYC_ZEN3),
                                                         {"Conv2D": "E"}).to_dict()}}
    monkeypatch.setattr(api, "collect_environment", lambda: env)
    calls = []

    def trial(self, policy, batch, any_fit, phase="search", **kw):
        calls.append((policy, batch))
        if policy == BF16:
            raise runner.PolicyLeftOut("error: mixed_bfloat16 cannot run layer 'c' (Conv2D) "
                                       "of model 'm:build' here: ...; allowed: float32")
        return Outcome(batch <= 16, 2**20 * batch, 100.0 * batch, "" if batch <= 16 else "x", 1.0)

    monkeypatch.setattr(runner.TrialRunner, "__call__", trial)
    monkeypatch.setattr(runner.TrialRunner, "verify",
                        lambda self, p, b, steps: Outcome(True, 2**20 * b, 100.0 * b, "", 1.0))
    kw = dict(memory_budget="1GiB", max_batch=32, progress=False, workspace=str(tmp_path))
    doc = api.tune("tests.unit.user_models.normalized:build", "synthetic",
                   precision=f"float32,{BF16}", output=str(tmp_path / "t1"), **kw)
    assert set(doc["precisions"]) == {"float32"} and doc["choice"]["precision"] == "float32"
    assert doc["left_out"][0]["policy"] == BF16
    assert doc["left_out"][0]["reason"].startswith("mixed_bfloat16 cannot run layer 'c'")
    assert json.load(open(tmp_path / "t1" / "tune.json"))["left_out"] == doc["left_out"]
    calls.clear()
    doc = api.tune("cnn", "synthetic", precision=f"float32,{BF16}", output=str(tmp_path / "t2"),
                   **kw)
    assert {p for p, _ in calls} == {"float32"}     # no trial under the refused policy
    assert "the Conv2D layers of model 'cnn'" in doc["left_out"][0]["reason"]
    with pytest.raises(PrecisionUnsupported):
        api.tune("cnn", "synthetic", precision=BF16, output=str(tmp_path / "t3"), **kw)


def test_auto_falls_back_for_an_op_that_runs_in_training_alone(no_bf16_lstm, tiny_config):
    """An inference call never reaches the op: auto's trial runs a traced training step, as
    training does, and falls back to float32 instead of failing at the first batch."""
    import os

    from app.machine.hardware import HardwareInfo
    from app.training.job import prepare
    from tests.paths import USER_MODELS

    model = os.path.join(USER_MODELS, "training_only.py") + ":build"
    run = prepare(tiny_config(model=model, dataset="synthetic", input_shape="8",
                              precision="auto", output=None), hardware=HardwareInfo(
                                  cpu_flags=INTEL_SPR))
    assert run.decision.policy == "float32", run.decision.reason
    assert ("mixed_bfloat16 cannot run layer 'lgamma_when_training' (LgammaWhenTraining) of "
            f"model '{model}': TensorFlow has no bfloat16 kernel for its op Lgamma here"
            ) in run.decision.reason


@pytest.mark.skipif(__import__("app.precision.keras_version", fromlist=["x"]).KERAS_MAJOR != 2,
                    reason="Keras 3's RandomContrast computes with ops that have float16 "
                           "kernels; Keras 2's runs AdjustContrastv2, float32 only on a CPU")
def test_an_op_without_a_float16_kernel_met_in_the_first_step_is_one_line(tiny_config):
    """mixed_float16 on a CPU: the first fit step failed with a traceback (TF 2.9); now the
    refusal names the layer by its node, metrics.json says it, and its flag is the fix.  A
    GPU has a float16 AdjustContrastv2 (adjust_contrast_op_gpu.cu.cc): there it trains."""
    import json
    import os

    import tensorflow as tf

    from app.core.errors import PrecisionUnsupported
    from app.training.job import train
    from tests.paths import USER_MODELS

    model = os.path.join(USER_MODELS, "training_only.py") + ":augmented"
    cfg = tiny_config(model=model, dataset="synthetic", input_shape="8,8,1",
                      precision="mixed_float16", epochs=1)
    if tf.config.list_physical_devices("GPU"):
        assert train(cfg)["status"] == "completed"
        return
    with pytest.raises(PrecisionUnsupported) as err:
        train(cfg)
    assert err.value.line() == (
        f"error: mixed_float16 cannot run layer 'augment/random_contrast' (RandomContrast) of "
        f"model '{model}': TensorFlow has no float16 kernel for its op AdjustContrastv2 here "
        "(on this CPU; a GPU's kernels may have it: run check there before you change the "
        "model); allowed: --precision float32, or --float32-layers augment/random_contrast "
        "(that layer in float32, the rest in float16)")
    metrics = json.loads(open(os.path.join(cfg.output, "metrics.json")).read())
    assert metrics["status"] == "failed" and "AdjustContrastv2" in metrics["diagnosis"]
    tf.keras.backend.clear_session()   # the layer names a new process gives, as in the line
    fixed = train(tiny_config(model=model, dataset="synthetic", input_shape="8,8,1",
                              precision="mixed_float16", epochs=1, output=cfg.output + "-fixed",
                              float32_layers="augment/random_contrast"))
    assert fixed["status"] == "completed"
    from app.doctor.check import check   # check's forward in training mode meets it too

    report = check(model, input_shape=(8, 8, 1), precision="mixed_float16", batch_size=8,
                   steps=1, verbose=False)
    blockers = [f for f in report["findings"] if f["severity"] == "blocker"]
    assert [f["check"] for f in blockers] == ["kernels"], report["findings"]
    assert "no float16 kernel for its op AdjustContrastv2" in blockers[0]["what"]


@pytest.mark.parametrize("model, chosen", [("mlp", BF16), ("cnn", "float32"),
                                           ("./net.py:build", "float32")])
def test_auto_with_onednn_off_keeps_bfloat16_for_dense_layers_only(monkeypatch, model, chosen):
    """With oneDNN off TF 2.9 has no bfloat16 convolutions: auto gave the mlp (Dense layers,
    which still run) float32 too, while `tfmp env` said mixed_bfloat16.  A user's model,
    whose layers are not known before it is built, still gets float32 there."""
    from app.machine import envreport
    from app.machine.hardware import HardwareInfo
    from app.precision.policy import resolve
    from app.training.runnable import runnable_by_kinds

    support = kernels.reconcile(BF16, Machine("2.9.3", INTEL_SPR, "0"), {"Conv2D": "E: 1"})
    monkeypatch.setitem(kernels._CACHE, BF16, support)
    hw = HardwareInfo(cpu_flags=INTEL_SPR)
    decision = runnable_by_kinds(resolve("auto", hw), model, hw)
    assert decision.policy == chosen, decision.reason
    if chosen == "float32":
        assert "oneDNN" in decision.reason, decision.reason
    report = {"auto_precision": {"policy": BF16, "reason": "no GPU"},
              "precision_support": {BF16: support.to_dict()}}
    line = next(l for l in envreport.format_text(_env_base(report)).splitlines()
                if l.startswith("auto precision:"))
    assert line.endswith("; a model with a layer it cannot run here (below) trains in float32, "
                         "as does a model of your own while oneDNN is off"), line


def _env_base(extra: dict) -> dict:
    return {"python": "3.9", "platform": "linux", "tensorflow": "2.9.3", "keras": "2.9.0",
            "keras_major": 2, "numpy": "1.26", "built_with_cuda": False, "cuda_version": None,
            "cudnn_version": None, "hardware": {"gpus": [], "cpu_avx512_bf16": True,
                                                "cpu_amx": True}, **extra}
