"""A resume with no precision asked for (auto) that keeps the run's own policy, where auto
would pick another here: metrics.json said ``"requested": "float32"`` (a QA pass), as if the
user had named it.  What was asked for stays ``auto``; the policy is the run's own."""
from __future__ import annotations

from app.precision import policy as prec
from app.training.resuming import resumed_precision


def _named(policy: str) -> prec.PrecisionDecision:
    """As job.prepare resolves the kept policy: as one named."""
    return prec.PrecisionDecision(policy, "the run's own, kept by --resume", requested=policy)


def test_auto_keeping_the_runs_policy_is_still_auto(capsys):
    auto_here = prec.PrecisionDecision("mixed_bfloat16", "the CPU has AMX", requested="auto")
    kept = resumed_precision(auto_here, {"precision": {"policy": "float32"}}, "run", _named)
    assert (kept.requested, kept.policy, kept.reason) == (
        "auto", "float32", "the run's own, kept by --resume")
    assert "note: --resume keeps the run's precision, float32 (auto would pick " \
        "mixed_bfloat16 here)" in capsys.readouterr().err


def test_auto_picking_the_runs_policy_anyway_is_auto_as_before():
    auto_here = prec.PrecisionDecision("float32", "no fast 16-bit path", requested="auto")
    assert resumed_precision(auto_here, {"precision": {"policy": "float32"}}, "run",
                             _named) is auto_here
