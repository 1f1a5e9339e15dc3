"""The rules that tell loss scaling's expected overflow from a fault, on recorded step
counters (app.numerics.rules, and app.training.monitor.divergence, the rules without the
sentinel), the headroom arithmetic (app.numerics.limits) and the report's words
(app.numerics.diagnosis).  No model is built: these are the pure parts."""
from __future__ import annotations

import math

import pytest

from app.numerics import diagnosis as dx
from app.numerics import limits, rules
from app.training import monitor


def counters(**kw):
    base = dict(step=100, fault_step=-1, fault_code=0, fault_scale=1.0, run_start=0,
                skipped_total=0, worst_run=0, in_a_row=0)
    base.update(kw)
    return rules.Counters(**base)


def fault(c, loss_scaled=True, policy="mixed_float16", max_skipped=20, scale=1024.0):
    return rules.fault(c, loss_scaled=loss_scaled, policy=policy, max_skipped_steps=max_skipped,
                       loss_scale_now=scale)


@pytest.mark.parametrize("skipped,worst", [(1, 1), (15, 4), (40, 20), (200, 3)])
def test_loss_scaling_skipping_now_and_then_is_never_an_alarm(skipped, worst):
    """Steps skipped while the scale settles, even many over a long run, are how loss
    scaling works: counted, not a fault."""
    assert fault(counters(skipped_total=skipped, worst_run=worst)) is None


# The QA's run (tfmp train ... --initial-loss-scale 2**40 --log-every 5): its first 23 steps
# skipped, each halving the scale, 2**17 from step 24 on; the rule fired at step 30 with
# "training diverged at 23 steps in a row had non-finite gradients".
def _recorded_huge_start(steps=40, first_scale=2.0 ** 40, skipped=23):
    """(counters, loss scale) as a check after each step reads them."""
    out = []
    for step in range(1, steps + 1):
        in_a_row = step if step <= skipped else 0
        scale = first_scale / 2 ** min(step, skipped)
        out.append((counters(step=step, skipped_total=min(step, skipped),
                             worst_run=min(step, skipped), run_start=1, in_a_row=in_a_row),
                    scale))
    return out


def test_a_huge_first_loss_scale_coming_down_is_expected_overflow_not_a_fault():
    """23 skips in a row (more than --max-skipped-steps 20), each halving the scale, then
    training: no check, during the run or after the scale recovered, calls it a fault."""
    for c, scale in _recorded_huge_start():
        assert fault(c, scale=scale) is None, (c, scale)
    # nor the rules without the sentinel (--no-sentinel)
    for c, scale in _recorded_huge_start():
        assert monitor.divergence(c.step, 0, c.skipped_total, c.in_a_row, True, 20,
                                  lambda: scale) is None, (c, scale)


def test_a_run_of_skips_that_ended_is_not_counted_against_the_limit():
    """The scale recovered: the latest step trained (nothing in a row now), whatever the
    longest run since the last check was."""
    assert fault(counters(worst_run=23, in_a_row=0, run_start=1), scale=1.0) is None
    assert fault(counters(worst_run=60, in_a_row=0), scale=131072.0) is None


def test_skips_still_going_at_the_floor_past_the_limit_are_a_fault():
    f = fault(counters(step=45, in_a_row=21, skipped_total=30, run_start=25), scale=1.0)
    assert f.kind == "skipped" and f.step == 45 and f.loss_scale == 1.0
    assert f.headline == ("the loss scale reached its floor (1); every step since step 25 was "
                          "skipped (21 in a row, more than --max-skipped-steps 20)")
    # app.train names the keyword
    assert f.in_words(command_line=False).headline.endswith(
        "(21 in a row, more than max_skipped_steps=20)")
    assert f.in_words(command_line=True) == f
    # at the limit, or above the floor, not yet
    assert fault(counters(in_a_row=20), scale=1.0) is None
    assert fault(counters(in_a_row=21), scale=2.0) is None


def test_without_the_sentinel_the_same_rule_in_the_words_of_what_ran_the_run():
    line = monitor.divergence(45, 0, 30, 21, True, 20, lambda: 1.0, command_line=False)
    assert line == ("step 45 (epoch 1): the loss scale reached its floor (1); every step since "
                    "step 25 was skipped (21 in a row, more than max_skipped_steps=20)")
    assert "--max-skipped-steps 20)" in monitor.divergence(45, 0, 30, 21, True, 20, lambda: 1.0)


def test_a_rule_fault_without_a_batch_is_one_block_with_step_fix_and_then():
    """The QA pass met "error: training diverged at 23 steps in a row had ..." and nothing
    more: no step, no fix, no then line."""
    f = fault(counters(step=45, in_a_row=21), scale=1.0)
    d = dx.unreplayed(f.headline, f.kind, f.step, 2, "mixed_float16")
    lines = d.lines(output="runs/x")
    assert lines[0] == ("error: training diverged at step 45 (epoch 2): the loss scale reached "
                        "its floor (1); every step since step 25 was skipped (21 in a row, "
                        "more than --max-skipped-steps 20)")
    assert all(line.startswith("  ") for line in lines[1:])
    fix = next(line for line in lines if line.startswith("  fix: "))
    assert "tfmp check --steps 45" in fix and "--float32-layers NAME" in fix
    assert lines[-1].startswith("  then: the same command, with the fix, with --resume")
    assert d.verdict == "not replayed" and "verdict: not replayed" in d.summary()
    api = dx.unreplayed(f.in_words(False).headline, f.kind, f.step, 2, "mixed_float16",
                        command_line=False)
    assert "--" not in "\n".join(api.lines(command_line=False))
    assert "app.check(model, data, steps=45)" in api.fix and "learning_rate=" in api.fix
    weights = dx.unreplayed("the weights are not finite", "weights", 7, 1, "float32",
                            weights=["dense/kernel:0"])
    assert weights.verdict == "optimizer" and "dense/kernel:0" in weights.where.text()
    assert weights.then_text().startswith("start the run again")


def test_the_latched_floor_says_since_when_every_step_was_skipped():
    f = fault(counters(fault_step=18, fault_code=rules.CODE_OF["floor"], run_start=1,
                       worst_run=18))
    assert f.kind == "floor" and f.step == 18
    assert f.headline == "the loss scale reached its floor (1); every step since step 1 was skipped"


def test_a_forward_fault_without_loss_scaling_says_nothing_of_it():
    """The QA pass: a float32 run said 'which loss scaling cannot help', and it has none."""
    c = counters(step=4, fault_step=3, fault_code=rules.CODE_OF["forward"])
    assert fault(c, loss_scaled=False, policy="float32").headline == (
        "the loss was not finite (a non-finite value in the forward pass)")
    assert fault(c).headline.endswith("which loss scaling cannot help)")


def test_the_headroom_warning_names_the_setting_as_the_run_takes_it_with_its_float32_layers():
    """app.train's keyword under app.train, the flag under tfmp train; either way the run's
    own float32 layers with the new one (the setting's value replaces them)."""
    from app.numerics.headroom import Headroom

    probed = {"head": ("float16", 30000.0, True)}
    (line,) = Headroom().update(5, probed, command_line=False, kept=("grow",))
    assert line.endswith('if it keeps growing it will overflow: float32_layers=["grow", "head"] '
                         "runs it in float32"), line
    (line,) = Headroom().update(5, {"head": ("float16", 1.0, False)}, kept=("grow",))
    assert line.endswith("run it in float32 with --float32-layers grow,head"), line
    (line,) = Headroom().update(5, probed)
    assert line.endswith("--float32-layers head runs it in float32"), line


def test_a_non_finite_loss_is_a_fault_under_loss_scaling_too():
    """Loss scaling scales the backward pass only: a forward value past float16 is a fault."""
    f = fault(counters(fault_step=62, fault_code=rules.CODE_OF["forward"], fault_scale=512.0))
    assert f.kind == "forward" and f.step == 62 and f.loss_scale == 512.0
    assert "forward pass" in f.headline


def test_without_loss_scaling_one_non_finite_gradient_is_a_fault():
    f = fault(counters(fault_step=5, fault_code=rules.CODE_OF["gradients"]), loss_scaled=False,
              policy="mixed_bfloat16")
    assert f.kind == "gradients" and "mixed_bfloat16" in f.headline


def test_without_loss_scaling_a_long_run_of_counted_steps_is_not_read_as_skipping():
    # float32 counts nothing as skipped; worst_run only means something under loss scaling.
    assert fault(counters(worst_run=50), loss_scaled=False, policy="float32") is None


def test_the_latch_wins_over_the_skip_rule():
    f = fault(counters(fault_step=9, fault_code=rules.CODE_OF["forward"], worst_run=30,
                       in_a_row=30), scale=1.0)
    assert f.kind == "forward"


def test_kind_codes_are_one_to_one():
    assert {rules.CODE_OF[k]: k for k in rules.CODE_OF} == rules.KIND_CODES
    assert 0 not in rules.KIND_CODES


@pytest.mark.parametrize("value,dtype,bits", [
    (65504.0, "float16", 0.0), (16376.0, "float16", 2.0), (1.0, "float16", math.log2(65504)),
    (math.inf, "float16", -math.inf), (0.0, "float16", math.inf), (1e30, "bfloat16", None)])
def test_headroom_is_log2_of_the_limit_over_the_value(value, dtype, bits):
    got = limits.headroom_bits(value, dtype)
    if bits is None:
        assert got == pytest.approx(math.log2(limits.LARGEST["bfloat16"] / 1e30))
    else:
        assert got == pytest.approx(bits)


def test_the_warning_threshold_is_within_4x_of_the_limit():
    assert limits.headroom_bits(65504 / 4 + 1, "float16") < limits.WARN_BITS
    assert limits.headroom_bits(65504 / 4 - 1, "float16") > limits.WARN_BITS


@pytest.mark.parametrize("eps,dtype,zero", [(1e-12, "float16", True), (1e-7, "float16", False),
                                            (1e-12, "bfloat16", False), (1e-3, "float16", False)])
def test_an_epsilon_that_rounds_to_zero(eps, dtype, zero):
    assert limits.underflows(eps, dtype) is zero


def test_the_report_block_and_its_one_line_summary():
    d = dx.Diagnosis("the loss was not finite", "forward", 62, 1, "mixed_float16",
                     dx.Where("layer", "block/grow", "Dense", "float16"), "precision",
                     dx.layer_fix("block/grow", "float16", "forward"), float32_finite=True,
                     largest_before=512.0, float32_largest=131008.0, layers=["block/grow"])
    lines = d.lines()
    assert lines[0] == "error: training diverged at step 62 (epoch 1): the loss was not finite"
    assert all(line.startswith("  ") for line in lines[1:])
    assert "layer 'block/grow' (Dense, computing in float16)" in lines[1]
    assert "2x float16's largest, 65504" in lines[2]
    assert d.flag == "--float32-layers block/grow" and "--float32-layers block/grow" in d.fix
    assert "verdict: precision" in d.summary() and d.to_json()["flag"] == d.flag


def test_the_report_names_replica_and_worker():
    d = dx.Diagnosis("h", "forward", 3, 1, "float32", dx.Where("input samples", samples=[5]),
                     "data", "fix", replica=1, worker=2)
    assert "(replica 1, worker 2)" in d.lines()[0]
    assert "(worker 0)" in dx.Diagnosis("h", "forward", 3, 1, "float32", dx.Where("none"),
                                        "not reproduced", "fix", worker=0).lines()[0]
    assert "the input batch: the sample at position 5 of the epoch is not finite" in d.lines()[1]
    # A data fault's resume needs the data fixed first; a model's, its fix with the resume.
    assert d.lines()[-1].startswith("  then: once those samples are fixed or removed in the "
                                    "data, the same command with --resume continues")
    layer = dx.Diagnosis("h", "forward", 3, 1, "mixed_float16", dx.Where("layer", "grow"),
                         "precision", "fix")
    assert layer.lines()[-1].startswith("  then: the same command, with the fix, with --resume")


def test_after_the_optimizer_verdict_the_run_starts_again_not_from_the_checkpoint():
    """The checkpoint saved at an optimizer's fault holds the weights that grew (the guard
    stops only non-finite updates): the QA pass resumed from it with a lower learning rate
    and diverged again at once.  The 'then' line says to start again, in the words of
    what ran the run (tfmp train's flags, app.train's keywords), and the folder to clear."""
    d = dx.Diagnosis("h", "forward", 2, 1, "float32", dx.Where("layer", "logits"),
                     "optimizer", "the weights grew to 1e+30: lower --learning-rate")
    then = d.lines(output="runs/lr x")[-1]
    assert then.startswith("  then: start the run again with the fix, with a new --output or "
                           "after removing runs/lr x (rm -r 'runs/lr x'): the checkpoint saved "
                           "at the fault holds the weights that grew"), then
    assert "--resume continues" not in then
    api = d.then_text(output="runs/lr", command_line=False)
    assert "a new output= or after removing 'runs/lr'" in api and "resume=True would" in api
    assert "--" not in api
    # The other verdicts resume from that checkpoint, app.train's with resume=True.
    layer = dx.Diagnosis("h", "forward", 3, 1, "mixed_float16", dx.Where("layer", "grow"),
                         "precision", "fix")
    assert layer.then_text(command_line=False) == (
        "the same app.train call, with the fix, with resume=True continues from the "
        "checkpoint saved at the fault")


def test_the_loss_is_named_by_its_name_or_not_at_all():
    """The QA pass met "where it began: the loss (None)" (and "None" in metrics.json) for
    the default loss: the name is the loss's, and an unknown one leaves no parentheses."""
    assert dx.Where("loss", "sparse_categorical_crossentropy").text().startswith(
        "the loss (sparse_categorical_crossentropy): non-finite")
    assert dx.Where("loss").text() == ("the loss: non-finite while every layer's output is "
                                       "finite")


def test_the_input_samples_are_named_in_the_singular_or_the_plural():
    def where(samples, kind="input samples"):
        return dx.Where(kind, name="sparse_categorical_crossentropy", samples=samples).text()
    assert where([3, 9]) == "the input batch: samples at positions 3, 9 of the epoch are not finite"
    assert where(list(range(14))).endswith("positions 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11 and "
                                           "2 more of the epoch are not finite")
    assert where([7], "loss") == ("the loss (sparse_categorical_crossentropy): non-finite for the "
                                  "sample at position 7 of the epoch while every layer's output "
                                  "is finite")


def test_the_samples_rows_in_the_training_data_are_named_with_them():
    where = dx.Where("input samples", samples=[237], data="x_train", rows=[4711])
    assert where.text() == ("the input batch: the sample at position 237 of the epoch (row "
                            "4711 of x_train) is not finite")
    assert dx.Where("loss", name="mse", samples=[3, 9], data="x_train", rows=[12, 40]).text() == (
        "the loss (mse): non-finite for samples at positions 3, 9 of the epoch (rows 12, 40 "
        "of x_train) while every layer's output is finite")
    assert dx.rows_in([97, 301], "x_train") == "rows 97, 301 of x_train"
    assert dx.Where("input samples", samples=[237], data="x_train", rows=[97, 301]).text() == (
        "the input batch: the sample at position 237 of the epoch (any of rows 97, 301 of "
        "x_train: they hold the same values) is not finite")
    assert dx.Where("input samples", samples=[1, 2], data="x_train", rows=[5, 6, 9]).text() == (
        "the input batch: samples at positions 1, 2 of the epoch (rows 5, 6, 9 of x_train; "
        "some hold the same values) are not finite")
    assert dx.rows_in(list(range(200, 212)), "y_train", 60) == (
        "rows 200, 201, 202, 203, 204, 205, 206, 207, 208, 209, 210, 211 and 48 more of y_train")
    assert dx.rows_in([5], "x_train", 3) == "rows 5 and 2 more of x_train"
    # a report written before rows were named still reads back
    old = {"kind": "input samples", "name": None, "class_name": None, "dtype": None,
           "phase": "forward", "samples": [5]}
    d = dx.Diagnosis.from_json({**dx.Diagnosis("h", "forward", 3, 1, "float32", dx.Where(**old),
                                               "data", "fix").to_json(), "where": old})
    assert d.where.text().endswith("position 5 of the epoch is not finite")


def test_an_epsilon_fix_names_the_value_and_what_float16_holds():
    text = dx.layer_fix("rms", "float16", "forward", ("epsilon", 1e-12))
    assert "epsilon=1e-12 is 0 in float16" in text and "--float32-layers rms" in text


@pytest.mark.parametrize("args,env,wrong", [
    (["--numerics-every", "0"], {}, "--numerics-every must be at least 1"),
    (["--numerics-every", "often"], {}, "--numerics-every: invalid int value: 'often'"),
    ([], {"TFMP_NO_SENTINEL": "maybe"}, "TFMP_NO_SENTINEL='maybe' is not valid"),
    ([], {"TFMP_NUMERICS_EVERY": "-5"}, "TFMP_NUMERICS_EVERY must be at least 1")])
def test_a_bad_sentinel_setting_is_one_line_and_exit_2(tmp_path, args, env, wrong):
    import os

    from tests.unit.helpers import error_lines, run_app

    out = tmp_path / "run"
    proc = run_app("train", "--dataset", "synthetic", "--output", str(out), *args,
                   env={**os.environ, **env})
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = error_lines(proc.stderr)
    assert len(errors) == 1 and wrong in errors[0], proc.stderr
    assert not out.exists()


def test_an_underflow_is_told_from_an_overflow_in_the_values_and_the_fix():
    """A 0/0 from a value that is 0 in float16 is no overflow: no 'x float16's largest', no
    clip; where no constant is found, 'a value that is 0 in float16 (an epsilon?)'."""
    where = dx.Where("layer", "norm", "Norm", "float16")
    d = dx.Diagnosis("h", "forward", 4, 1, "mixed_float16", where, "precision",
                     dx.layer_fix("norm", "float16", "forward", cause="underflow"),
                     largest_before=2.857, float32_largest=2.889, cause="underflow",
                     inside_op="RealDiv")
    assert d.values_text() == (
        "the largest finite magnitude going in was 2.857; in float32 the value reaches 2.889, "
        "far under float16's largest (65504): not an overflow, but a division (RealDiv) by a "
        "value that is 0 in float16")
    assert d.fix.startswith("it divides by a value that is 0 in float16 (an epsilon?): run the "
                            "layer in float32 without editing the model: --float32-layers norm")
    assert "6.1e-05" in d.fix and "6e-08" in d.fix and "clip" not in d.fix
    inline = dx.layer_fix("norm", "float16", "forward", (None, 1e-8), cause="underflow")
    assert inline.startswith("the constant 1e-08 in its call (an epsilon?) is 0 in float16")
    overflow = dx.layer_fix("norm", "float16", "forward", cause="overflow")
    assert "clip it" in overflow and "epsilon" not in overflow
