"""Which float32 mixed precision is compared with: ``--fp32-baseline tf32 | strict | both``.

On compute capability 8.0+ (Ampere and newer) TensorFlow 2.9's float32 already runs matmuls
and convolutions on TensorFloat-32 Tensor Cores (inputs rounded to 10 mantissa bits), so
"mixed precision gives little over float32" there is often a TF32 baseline, not a failure
(tensorflow/docs#2140).  ``tf32`` (the default) measures the float32 a user gets, ``strict``
float32 with TF32 off (``tfmp train --tf32 off``), ``both`` the first as the baseline of the
relative columns and the second reported beside it.  Without TF32 hardware both are the same
float32 and one is measured.  Pure functions over the hardware and the summaries.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence

from app.core.catalog import BASELINE_POLICY as BASELINE
from app.machine.hardware import HardwareInfo, tf32_capable

CHOICES = ("tf32", "strict", "both")
DEFAULT = "tf32"
STRICT_SERIES = "fp32_strict"


@dataclass(frozen=True)
class BaselinePlan:
    choice: str
    tf32_applies: bool     # a GPU of compute capability 8.0+
    primary: str           # what the table's float32 ran as: "tf32" or "strict"
    extra_strict: bool     # a strict float32 series measured beside it
    note: Optional[str] = None

    def to_dict(self) -> dict:
        return asdict(self)


def plan(choice: str, hw: HardwareInfo) -> BaselinePlan:
    if choice not in CHOICES:
        raise ValueError(choice)
    applies = tf32_capable(hw.gpus)
    if not applies:
        note = None if choice == DEFAULT else (
            "TF32 does not apply here (no GPU of compute capability 8.0+): float32 is strict "
            "float32 either way, so one float32 baseline was measured")
        return BaselinePlan(choice, False, "strict", False, note)
    if choice == "strict":
        return BaselinePlan(choice, True, "strict", False)
    return BaselinePlan(choice, True, "tf32", choice == "both")


def primary_tf32_flag(bp: BaselinePlan) -> Optional[str]:
    """``--tf32`` for the table's float32 runs: "off" for a strict baseline on TF32 hardware."""
    return "off" if bp.tf32_applies and bp.primary == "strict" else None


def with_strict_runs(schedule: Sequence[Mapping[str, Any]]) -> List[Dict[str, Any]]:
    """``schedule`` with a strict float32 run right after each float32 run (its neighbour in
    the interleaved order, as the other policies are), every entry renumbered."""
    out: List[Dict[str, Any]] = []
    for e in schedule:
        out.append(dict(e, order=len(out)))
        if e["policy"] == BASELINE and e.get("series", "equal_batch") == "equal_batch":
            out.append(dict(e, order=len(out), series=STRICT_SERIES, tf32="off"))
    return out


def _median(s: Mapping[str, Any], key: str) -> Optional[float]:
    v = (s or {}).get(key) or {}
    return v.get("median") if isinstance(v, Mapping) else None


def against_strict(results: Mapping[str, Mapping[str, Any]],
                   strict: Mapping[str, Any]) -> Dict[str, Optional[float]]:
    """Each policy's median samples/s over strict float32's."""
    base = _median(strict, "samples_per_second")
    out: Dict[str, Optional[float]] = {}
    for p, r in results.items():
        mine = _median(r, "samples_per_second")
        out[p] = round(mine / base, 4) if mine and base else None
    return out


def _x(v: Optional[float]) -> str:
    return "n/a" if v is None else f"{v:.2f}x"


def explanation(bp: BaselinePlan, results: Mapping[str, Mapping[str, Any]],
                strict: Optional[Mapping[str, Any]] = None) -> str:
    """The sentence the report prints under the table: which float32 the relative columns
    compare with, and why a speed-up against TF32 is smaller."""
    mixed = [p for p in results if p != BASELINE]
    speed = ", ".join(f"{p} {_x(_median(results[p], 'speedup_vs_float32'))}" for p in mixed)
    if not bp.tf32_applies:
        text = ("Baseline: strict float32. This hardware has no TF32 Tensor Cores (they start "
                "with compute capability 8.0), so float32 runs at full float32 precision and the "
                "speed-up columns measure everything mixed precision gains"
                + (f" ({speed})." if speed else "."))
        return text + (f" {bp.note}." if bp.note else "")
    if bp.primary == "strict":
        return ("Baseline: strict float32 (TF32 off, --fp32-baseline strict). This is not the "
                "float32 a user gets: TensorFlow's default float32 on this GPU already uses TF32 "
                "Tensor Cores for matmuls and convolutions, so against it mixed precision gains "
                "less than shown here" + (f" ({speed})" if speed else "")
                + "; --fp32-baseline both measures the two.")
    text = ("Baseline: float32 as TensorFlow runs it here by default, with TF32 on (compute "
            "capability 8.0+): its matmuls and convolutions already run on Tensor Cores with "
            "inputs rounded to 10 mantissa bits, so mixed precision's speed-up"
            + (f" ({speed})" if speed else "") + " is smaller than against strict float32; "
            "what is left is halved memory traffic and activation memory.")
    if strict is None:
        return text + " --fp32-baseline both also measures strict float32 (TF32 off)."
    rel = against_strict(results, strict)
    sps = _median(strict, "samples_per_second")
    parts = [f"{p} {_x(v)}" for p, v in rel.items() if p != BASELINE]
    if not sps:
        return text + " Strict float32 (TF32 off): not measured (its runs failed)."
    return (text + f" Strict float32 (TF32 off): {sps:,.0f} samples/s; against it: float32 "
            f"with TF32 {_x(rel.get(BASELINE))}" + "".join(f", {x}" for x in parts) + ".")
