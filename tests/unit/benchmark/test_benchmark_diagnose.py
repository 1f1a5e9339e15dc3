"""Plain-word diagnoses from measured summaries and fake hardware (pure, no TensorFlow)."""
from __future__ import annotations

import pytest

from app.benchmark import diagnose, input_rate, layout
from app.machine.hardware import HardwareInfo, make_gpu

T4 = HardwareInfo(gpus=[make_gpu("Tesla T4", (7, 5))])
P100 = HardwareInfo(gpus=[make_gpu("Tesla P100-PCIE-16GB", (6, 0))])
GTX1660 = HardwareInfo(gpus=[make_gpu("NVIDIA GeForce GTX 1660 SUPER", (7, 5))])
CPU_BF16 = HardwareInfo(cpu_flags=frozenset({"avx512_bf16"}))
CPU_PLAIN = HardwareInfo()
SETTINGS = {"batch_size": 128, "steps_per_execution": 1, "jit": False}


def _s(speedup=1.0, gap=0.0, spe=1.0, nonfinite=False, scale=None, skipped=0, sps=(100, 100, 100)):
    return {"speedup_vs_float32": {"median": speedup}, "accuracy_gap_points": gap,
            "seconds_per_epoch": {"median": spe}, "nonfinite_loss": nonfinite,
            "loss_scale": {"median": scale}, "skipped_steps": {"max": skipped},
            "samples_per_second": {"median": sps[0], "min": sps[1], "max": sps[2], "n": 3},
            "memory_ratio_vs_float32": 0.6}


def codes(diags):
    return [d.code for d in diags]


def test_no_tensor_cores_on_pascal_and_gtx16():
    for hw in (P100, GTX1660):
        d = diagnose.diagnose({"float32": _s(), "mixed_float16": _s(0.95)}, hw, SETTINGS)
        assert "no_tensor_cores" in codes(d)
        assert "launch_bound" not in codes(d)


def test_launch_bound_on_capable_gpu_suggests_steps_jit_batch():
    d = diagnose.diagnose({"float32": _s(spe=0.5), "mixed_float16": _s(1.02)}, T4, SETTINGS,
                          steps_per_epoch=469)
    [lb] = [x for x in d if x.code == "launch_bound"]
    assert "--steps-per-execution" in lb.message and "--jit" in lb.message
    assert "--batch-size" in lb.message and "ms" in lb.message


def test_launch_bound_drops_hints_already_used():
    settings = {"batch_size": 128, "steps_per_execution": 32, "jit": True}
    d = diagnose.diagnose({"float32": _s(), "mixed_float16": _s(1.0)}, T4, settings)
    [lb] = [x for x in d if x.code == "launch_bound"]
    assert "--steps-per-execution" not in lb.message and "--jit" not in lb.message


def test_long_steps_without_speedup_point_at_input_pipeline():
    d = diagnose.diagnose({"float32": _s(spe=10.0), "mixed_float16": _s(1.0)}, T4, SETTINGS,
                          steps_per_epoch=100)
    assert "no_speedup_input_bound" in codes(d)


def test_cpu_fp16_and_plain_cpu_bf16_explained():
    d = diagnose.diagnose({"float32": _s(), "mixed_float16": _s(0.02)}, CPU_BF16, SETTINGS)
    assert "fp16_on_cpu" in codes(d)
    d = diagnose.diagnose({"float32": _s(), "mixed_bfloat16": _s(0.5)}, CPU_PLAIN, SETTINGS)
    assert "bf16_cpu_without_instructions" in codes(d)


def test_bf16_cpu_with_small_speedup_is_launch_bound():
    d = diagnose.diagnose({"float32": _s(), "mixed_bfloat16": _s(1.03)}, CPU_BF16, SETTINGS)
    assert "launch_bound" in codes(d)


def test_pays_when_fast():
    d = diagnose.diagnose({"float32": _s(), "mixed_float16": _s(1.6)}, T4, SETTINGS)
    assert codes(d) == ["pays"]


def test_multiples_of_8():
    d = diagnose.diagnose({"float32": _s(), "mixed_float16": _s(1.6)}, T4,
                          dict(SETTINGS, batch_size=100), layer_widths=[512, 250])
    [m] = [x for x in d if x.code == "not_multiple_of_8"]
    assert "batch size 100" in m.message and "250" in m.message
    d = diagnose.diagnose({"float32": _s()}, T4, dict(SETTINGS, batch_size=100))
    assert "not_multiple_of_8" not in codes(d)  # only matters under a mixed policy


def test_nonfinite_and_accuracy_gap_flagged():
    summary = {"float32": _s(), "mixed_float16": _s(1.6, gap=-2.5, nonfinite=True)}
    d = diagnose.diagnose(summary, T4, SETTINGS, max_accuracy_gap=1.0)
    assert codes(d)[:2] == ["nonfinite_loss", "accuracy_gap"]
    assert "2.50 points below" in d[1].message
    assert "accuracy_gap" not in codes(diagnose.diagnose(summary, T4, SETTINGS, max_accuracy_gap=3))


def test_collapsed_loss_scale_and_noise():
    summary = {"float32": _s(sps=(100, 50, 150)), "mixed_float16": _s(1.6, scale=0.5, skipped=40)}
    c = codes(diagnose.diagnose(summary, T4, SETTINGS))
    assert "loss_scale_collapsed" in c and "noisy" in c


def test_failed_runs_reported_first():
    d = diagnose.diagnose({"float32": _s()}, T4, SETTINGS,
                          failed_runs=[{"order": 1, "policy": "mixed_float16", "repeat": 1,
                                        "returncode": 3, "error": "diverged"}])
    assert d[0].code == "run_failed" and "diverged" in d[0].message


def test_layer_width_table_matches_models():
    tf = pytest.importorskip("tensorflow")
    from app.task import models

    for name, shape in (("mlp", (784,)), ("cnn", (28, 28, 1)), ("resnet", (32, 32, 3))):
        m = models.build_model(name, shape, 10)
        widths = [getattr(l, "units", None) or getattr(l, "filters", None) for l in m.layers]
        widths = [w for w in widths if w and l_is_hidden(w)]
        assert sorted(widths) == sorted(layout.HIDDEN_WIDTHS[name]), name
    del tf


def l_is_hidden(width):
    return width != 10  # the class-count output layer is left out on purpose


def test_noise_names_competing_work_when_the_load_was_high():
    summary = {"float32": _s(sps=(100, 50, 150))}
    [quiet] = diagnose.diagnose(summary, CPU_BF16, SETTINGS, max_load=2.5, cpu_count=2)
    [busy] = diagnose.diagnose(summary, CPU_BF16, SETTINGS, max_load=5.4, cpu_count=2)
    assert "throttling" in quiet.message
    assert "load average up to 5.4 on 2 CPUs" in busy.message


# ---- input-bound: the decision as a pure function ---------------------------------------------

def _sps(**medians):
    return {p: {"samples_per_second": {"median": v, "min": v, "max": v, "n": 1}}
            for p, v in medians.items()}


@pytest.mark.parametrize("train, pipeline, bound", [
    ({"float32": 900.0, "mixed_bfloat16": 950.0}, 1000.0, True),    # 95% of the data's rate
    ({"float32": 800.0}, 1000.0, True),                             # exactly the threshold
    ({"float32": 500.0, "mixed_bfloat16": 790.0}, 1000.0, False),   # the fastest decides
    ({"float32": 30_000.0}, 250_000.0, False),                      # a fast pipeline
    ({"float32": 1250.0}, 1000.0, True),                            # within the timing's noise
    ({"float32": 900.0}, None, False),                              # not measured
    ({"float32": None}, 1000.0, False),                             # every run failed
])
def test_input_bound_decision(train, pipeline, bound):
    out = diagnose.input_bound(_sps(**train), pipeline, {"batch_size": 32})
    assert bool(out) == bound
    if bound:
        d = out[0]
        assert d.code == "input_bound" and d.severity == "warning"
        assert d.policy == max((p for p in train), key=lambda p: train[p])
        for words in ("input-bound", "cannot train faster than the data", "cache()",
                      "num_parallel_calls=tf.data.AUTOTUNE", "prefetch", "--batch-size than 32"):
            assert words in d.message, words


def test_training_faster_than_its_pipeline_alone_is_no_input_bound_verdict():
    """Seen with a 1,600-sample table: 117k samples/s trained, 73k for the pipeline alone,
    and the warning said "input-bound ... 161% of it"."""
    [d] = diagnose.input_bound(_sps(float32=117_391.0, mixed_bfloat16=101_815.0), 72_823.0,
                               {"batch_size": 128})
    assert (d.code, d.severity, d.policy) == ("input_rate_mistimed", "info", "float32")
    assert d.message == (
        "the input pipeline alone measured 72,823 samples/s, slower than training with "
        "float32 (117,391): its epochs were too short to time, or the machine was busier "
        "while they ran, so whether the job is input-bound is not known; more training "
        "samples (or --epochs) on a quiet machine measure it")


def test_the_pipeline_rate_is_its_fastest_epoch_after_the_warm_up():
    """CI once timed a sleep-bound pipeline's one timed epoch at 12.5 samples/s while another
    test loaded both cores, then trained at 19.4 (the pipeline's true rate): the job was
    input-bound, and the diagnosis said its epochs were too short to time."""
    rows = [{"samples_per_second": r} for r in (3.0, 12.5, 19.5, 19.0)]
    assert input_rate.pipeline_rate(rows, warmup_epochs=1) == 19.5
    assert input_rate.pipeline_rate(rows[:1], warmup_epochs=1) is None
    assert input_rate.MIN_TIMED_EPOCHS >= 2


def test_input_bound_is_part_of_all_diagnoses():
    codes = [d.code for d in diagnose.diagnose(_sps(float32=990.0), HardwareInfo(), SETTINGS,
                                               input_rate=1000.0)]
    assert "input_bound" in codes


def test_unknown_layer_widths_are_said_with_the_reason():
    summary = _sps(float32=100.0, mixed_bfloat16=100.0)
    out = diagnose.diagnose(summary, HardwareInfo(), SETTINGS, layer_widths=None,
                            layer_widths_note="the model could not be built for the check")
    notes = [d for d in out if d.code == "layer_widths_unknown"]
    assert notes and "could not be built" in notes[0].message
