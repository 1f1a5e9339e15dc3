"""``train --tuned --scale-lr linear`` scales the learning rate by the batch an update
really sees: micro-batch x the N in effect, the tune's or the one given (--accumulate,
--global-batch), and says that batch in its line and in metrics.json's ``tuned`` block."""
from __future__ import annotations

import json

import pytest

from app.training import tuned
from app.tuner import report

GIB = 2**30


def _accumulating_tune(tmp_path, micro=64, n=4):
    """A tune.json as ``tfmp tune --global-batch micro*n`` writes it (float32)."""
    glob = micro * n
    doc = {"schema": report.SCHEMA, "task": {"model": "mlp", "dataset": "synthetic"},
           "budget_bytes": 2 * GIB, "margin": 0.1, "reference_batch_size": 128,
           "precisions": {"float32": {"max_batch": micro, "best_batch": micro}},
           "global_batch": {"requested": glob, "plans": {"float32": {
               "micro_batch": micro, "accumulate": n, "samples_per_second": 900.0,
               "trials": []}}},
           "choice": {"precision": "float32", "batch_size": micro, "accumulate": n,
                      "global_batch": glob, "samples_per_second": 900.0},
           "verified": {"fits": True, "precision": "float32", "batch_size": micro,
                        "accumulate": n, "global_batch": glob, "steps": 10}}
    path = tmp_path / "tune.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    return str(path)


def _apply(path, **given):
    given = dict({"precision": None, "batch_size": None}, **given)
    return tuned.apply(path, model="mlp", dataset="synthetic", learning_rate=1e-3,
                       scale_lr="linear", default_batch=128, **given)


def test_the_tunes_accumulation_taken_scales_by_micro_batch_times_n(tmp_path):
    applied = _apply(_accumulating_tune(tmp_path))           # 64 x 4 = 256: 2x the 128
    assert (applied.batch_size, applied.accumulate) == (64, 4)
    assert applied.learning_rate == pytest.approx(2e-3)
    lr = applied.record["learning_rate"]
    assert (lr["update_batch"], lr["micro_batch"], lr["accumulate"]) == (256, 64, 4)
    assert "256 per replica (micro-batch 64 x 4) is 2x the 128" in \
        applied.record["optimization_note"]


@pytest.mark.parametrize("micro,given,update,rate", [
    (64, {"accumulate": 2}, 128, 1e-3),          # the QA repro: 64 x 2 = 128, unchanged
    (64, {"global_batch": 128}, 128, 1e-3),
    (32, {"global_batch": 256}, 256, 2e-3),      # was 0.00025 (the micro-batch 32 alone)
    (32, {"accumulate": 4, "global_batch": 256}, 256, 2e-3),   # e.g. 32 x 4 x 2 replicas
])
def test_an_accumulation_given_is_the_one_the_rate_is_scaled_for(tmp_path, micro, given,
                                                                  update, rate):
    applied = _apply(_accumulating_tune(tmp_path, micro=micro), accumulation_given=True,
                     **given)
    assert applied.accumulate is None                          # the tune's N is not taken
    assert applied.learning_rate == pytest.approx(rate)
    rec = applied.record
    assert rec["learning_rate"]["after"] == pytest.approx(rate)
    assert rec["learning_rate"]["update_batch"] == update
    assert any("not used" in n for n in rec["notes"])
    line = tuned.console_line(rec)
    if update == 128:                                          # the rate was set for 128
        assert "scale-lr" not in line and "0.0005" not in line
    elif "global_batch" in given:                              # the whole update's
        assert "the global batch 256 an update sees (--global-batch, over all replicas) is " \
               "2x the 128" in line and "makes it 0.002" in line
    else:
        assert f"an update's batch {update} per replica (micro-batch {micro} x " \
               f"{update // micro}) is 2x the 128" in line and "makes it 0.002" in line


def test_the_scaled_batch_says_it_is_per_replica_and_what_several_replicas_see(tmp_path):
    rec = _apply(_accumulating_tune(tmp_path)).record          # tuned 64 x 4
    assert rec["learning_rate"]["update_batch_is_per_replica"] is True
    one = tuned.console_line(rec)
    assert "an update's batch 256 per replica (micro-batch 64 x 4) is 2x the 128" in one
    assert "over" not in one                                   # one replica: nothing more
    two = tuned.console_line(rec, replicas=2)
    assert "the update sees 512 over 2 replicas, which the learning rate is not scaled for " \
           "(--global-batch 512 scales it for the whole update)" in two
    # the global batch given is the whole update's already: nothing to add for replicas
    glob = _apply(_accumulating_tune(tmp_path), accumulation_given=True,
                  global_batch=512).record
    assert glob["learning_rate"]["update_batch_is_per_replica"] is False
    assert glob["learning_rate"]["update_batch"] == 512 and glob["learning_rate"]["after"] == \
        pytest.approx(4e-3)
    assert "over 2 replicas" not in tuned.console_line(glob, replicas=2)


@pytest.mark.parametrize("given, env, rate", [
    ({"accumulate": 2}, {}, 1e-3),              # 64 x 2 = 128, the rate's own batch (QA: 0.0005)
    ({"global_batch": 512}, {}, 4e-3),          # the update's 512
    ({}, {"TFMP_ACCUMULATE": "2"}, 1e-3),       # the variable, as the flag
    ({}, {}, 2e-3),                             # the tune's 64 x 4
])
def test_train_scales_by_the_accumulation_it_is_given(tmp_path, given, env, rate):
    """Through train's own resolve_config, which gave tuned.apply only whether an
    accumulation was given, never its N."""
    from app.training.config import resolve_config

    cfg = resolve_config(dict({"model": "mlp", "dataset": "synthetic", "scale_lr": "linear",
                               "tuned": _accumulating_tune(tmp_path)}, **given), environ=env)
    assert cfg.learning_rate == pytest.approx(rate)


def test_a_global_batch_is_judged_against_the_tunes_micro_batch_not_the_default(tmp_path):
    """A tune of micro-batch 64 and --global-batch 192: refused as 'not a multiple of the
    micro-batch 128', the default the tune replaces, before the tune applied."""
    from app.core.errors import UsageError
    from app.training.config import resolve_config

    path = _accumulating_tune(tmp_path)
    cfg = resolve_config({"model": "mlp", "dataset": "synthetic", "tuned": path,
                          "global_batch": 192}, environ={})
    assert (cfg.batch_size, cfg.global_batch) == (64, 192)
    with pytest.raises(UsageError, match="not a multiple of the micro-batch 64"):
        resolve_config({"model": "mlp", "dataset": "synthetic", "tuned": path,
                        "global_batch": 200}, environ={})
