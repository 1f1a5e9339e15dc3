"""Numbers from one run's ``metrics.json``, and medians with min and max across runs.

Warm-up: the first ``warmup_epochs`` epochs of every run are discarded for timing (they
include graph tracing, XLA compilation and cuDNN autotuning).  Accuracy, loss scale and
skipped steps are taken from the whole run (the final epoch, or the sum over epochs).
"""
from __future__ import annotations

import math
import statistics
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

BASELINE = "float32"


def rate_text(samples_per_second: Optional[float]) -> str:
    """A rate for people: thousands separated from 100 up, three significant digits below
    (a slow pipeline at 0.5 samples/s read as "0 samples/s")."""
    v = samples_per_second
    if v is None or not math.isfinite(v):
        return "nan"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def spread(values: Iterable[Optional[float]]) -> Dict[str, Optional[float]]:
    """``{"median", "min", "max", "n"}`` over the finite values; None everywhere if none."""
    vals = [float(v) for v in values if _finite(v)]
    if not vals:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def epochs_of(metrics: Mapping[str, Any]) -> List[Mapping[str, Any]]:
    for key in ("epochs", "history", "per_epoch"):
        val = metrics.get(key)
        if isinstance(val, list):
            return val
    return []


def measure_run(metrics: Mapping[str, Any], warmup_epochs: int) -> Dict[str, Any]:
    """One run's contribution: timing over the epochs after warm-up, quality at the end."""
    epochs = epochs_of(metrics)
    timed = epochs[warmup_epochs:]
    final = epochs[-1] if epochs else {}
    losses = [e.get("loss") for e in epochs] + [e.get("val_loss") for e in epochs]
    nonfinite = any(isinstance(v, (int, float)) and not math.isfinite(v) for v in losses)
    # The trainer writes a non-finite loss as null (JSON has no NaN) and stops a run whose
    # loss scaling could not recover with status "diverged".
    nonfinite = nonfinite or any(v is None for v in (e.get("loss") for e in epochs))
    nonfinite = nonfinite or metrics.get("status") == "diverged"
    skipped = [e.get("skipped_steps") for e in epochs]
    peak = metrics.get("peak_memory") or {}
    return {
        "epochs_total": len(epochs),
        "epochs_timed": len(timed),
        "seconds_per_epoch": _median_or_none(e.get("epoch_seconds") for e in timed),
        "samples_per_second": _median_or_none(e.get("samples_per_second") for e in timed),
        "val_accuracy": _num(final.get("val_accuracy")),
        "final_loss": _num(final.get("loss")),
        "loss_scale": _num(final.get("loss_scale")),
        "skipped_steps": int(sum(s for s in skipped if _finite(s))) if any(_finite(s) for s in skipped) else 0,
        "nonfinite_loss": bool(nonfinite),
        "peak_memory_bytes": _num(peak.get("bytes")),
        "peak_memory_kind": peak.get("kind"),
    }


def _num(v: Any) -> Optional[float]:
    return float(v) if _finite(v) else None


def _median_or_none(values: Iterable[Any]) -> Optional[float]:
    vals = [float(v) for v in values if _finite(v)]
    return statistics.median(vals) if vals else None


def summarize(runs: Sequence[Mapping[str, Any]], policies: Sequence[str]) -> Dict[str, Dict[str, Any]]:
    """Per-policy summary from run records (``policy``, ``repeat``, ``ok``, ``measured``).

    Speed-up against float32 is the median of paired ratios: run r of the policy against run r
    of float32, the two being neighbours in the interleaved order.  Memory ratio and accuracy
    gap compare medians.  The accuracy gap is in percentage points (policy minus float32).
    """
    by_policy: Dict[str, List[Mapping[str, Any]]] = {p: [] for p in policies}
    # Failed runs count for "did the loss go non-finite" (a diverged run exits non-zero).
    diverged = {r.get("policy") for r in runs
                if r.get("measured") and r["measured"].get("nonfinite_loss")}
    for r in runs:
        if r.get("ok") and r.get("policy") in by_policy:
            by_policy[r["policy"]].append(r)

    out: Dict[str, Dict[str, Any]] = {}
    for p in policies:
        ms = [r["measured"] for r in by_policy[p]]
        kinds = {m.get("peak_memory_kind") for m in ms if m.get("peak_memory_kind")}
        out[p] = {
            "runs_ok": len(ms),
            "runs_failed": sum(1 for r in runs if r.get("policy") == p and not r.get("ok")),
            "seconds_per_epoch": spread(m["seconds_per_epoch"] for m in ms),
            "samples_per_second": spread(m["samples_per_second"] for m in ms),
            "peak_memory": dict(spread(m["peak_memory_bytes"] for m in ms),
                                kind=(kinds.pop() if len(kinds) == 1 else ("mixed" if kinds else None)),
                                unit="bytes"),
            "val_accuracy": spread(m["val_accuracy"] for m in ms),
            "loss_scale": spread(m["loss_scale"] for m in ms),
            "skipped_steps": spread(m["skipped_steps"] for m in ms),
            "nonfinite_loss": p in diverged,
        }

    base = out.get(BASELINE)
    base_by_repeat = {r["repeat"]: r["measured"] for r in by_policy.get(BASELINE, [])}
    for p in policies:
        s = out[p]
        ratios = []
        for r in by_policy[p]:
            b = base_by_repeat.get(r["repeat"])
            mine = r["measured"]["samples_per_second"]
            if b and _finite(b.get("samples_per_second")) and _finite(mine) and b["samples_per_second"] > 0:
                ratios.append(mine / b["samples_per_second"])
        s["speedup_vs_float32"] = spread(ratios)
        s["memory_ratio_vs_float32"] = _ratio(s["peak_memory"]["median"],
                                              base["peak_memory"]["median"] if base else None)
        acc, base_acc = s["val_accuracy"]["median"], (base["val_accuracy"]["median"] if base else None)
        s["accuracy_gap_points"] = (None if acc is None or base_acc is None
                                    else round((acc - base_acc) * 100.0, 4))
    return out


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    if a is None or b is None or b == 0:
        return None
    return a / b
