"""``benchmark.json`` and the Markdown table; files written under a temporary name and renamed.

Units are explicit everywhere: seconds per epoch (s), samples per second, bytes in the JSON and
MiB in the table, accuracy as a fraction in the JSON and percent in the table, accuracy gap
in percentage points.
"""
from __future__ import annotations

import json
import math
from typing import Any, List, Mapping, Optional

from app.benchmark.stats import rate_text
from app.core.files import write_atomic  # noqa: F401  (re-exported for the suite)

SCHEMA = "tfmp.benchmark/1"
MIB = 1024.0 * 1024.0

UNITS = {
    "seconds_per_epoch": "s per whole epoch, training plus validation, as Keras reports it "
                         "(median over the post-warm-up epochs of a run; median/min/max over runs)",
    "samples_per_second": "training samples per second over the training part of an epoch "
                          "only, validation excluded (same statistics)",
    "speedup_vs_float32": "ratio of samples/s to the float32 run of the same repeat",
    "peak_memory": "bytes; kind 'gpu' = TensorFlow's peak GPU allocation, 'cpu_rss' = peak "
                   "resident memory of the training process",
    "memory_ratio_vs_float32": "median peak memory / float32 median peak memory",
    "val_accuracy": "fraction 0..1 after the final epoch",
    "accuracy_gap_points": "percentage points, policy minus float32 (median final val accuracy)",
    "loss_scale": "dynamic loss scale after the final epoch (1.0 for policies without loss "
                  "scaling: only mixed_float16 scales the loss)",
    "skipped_steps": "optimizer steps skipped for non-finite gradients, summed over the run",
    "input_pipeline": "samples/s of the training batches alone (no model; the fastest of "
                      "two or more epochs after warm-up, one child process; timed again "
                      "after the runs when they outran it by 25%: first_timing, retimed); "
                      "training_share = the fastest policy's median samples/s / this",
}

MEMORY_LABEL = {
    "gpu": "Peak GPU memory (MiB)",
    "cpu_rss": "Peak RSS of the CPU process (MiB)",
}


def _finite_only(obj):
    """NaN/Inf become null: strict JSON, readable by every parser."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Mapping):
        return {k: _finite_only(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite_only(v) for v in obj]
    return obj


def to_json(doc: Mapping[str, Any]) -> str:
    return json.dumps(_finite_only(doc), indent=2, sort_keys=False, default=str,
                      allow_nan=False) + "\n"


# ---- Markdown ---------------------------------------------------------------------------------

def _num(v: Optional[float], fmt: str) -> str:
    return "–" if v is None else format(v, fmt)


def _spread(s: Mapping[str, Any], fmt: str, scale: float = 1.0, suffix: str = "") -> str:
    """``median`` or ``median (min–max)`` when runs differ at the shown precision."""
    med, lo, hi = s.get("median"), s.get("min"), s.get("max")
    if med is None:
        return "–"
    text = format(med * scale, fmt) + suffix
    if s.get("n", 0) > 1 and lo is not None and hi is not None:
        lo_t, hi_t = format(lo * scale, fmt), format(hi * scale, fmt)
        if lo_t != hi_t:
            text += f" ({lo_t}–{hi_t})"
    return text


def _seconds_format(s: Mapping[str, Any]) -> str:
    """Three significant digits of the median, no exponent: a 0.0345 s epoch showed as 0.03,
    and its neighbour at 0.0384 as the same."""
    med = s.get("median")
    if med is None or med >= 100:
        return ".0f"
    if med >= 1:
        return ".2f" if med < 10 else ".1f"
    return ".3g"


def memory_label(results: Mapping[str, Mapping[str, Any]]) -> str:
    kinds = {r["peak_memory"].get("kind") for r in results.values() if r["peak_memory"].get("kind")}
    if len(kinds) == 1:
        return MEMORY_LABEL.get(next(iter(kinds)), "Peak memory (MiB)")
    return "Peak memory (MiB)"


def markdown(doc: Mapping[str, Any]) -> str:
    st = doc["settings"]
    results = doc["results"]
    lines: List[str] = []
    lines.append(f"### Mixed precision benchmark: {st['model']} on {st['dataset']}, "
                 f"batch {st['batch_size']}, {doc['hardware']['description']}")
    lines.append("")
    header = ["Policy", "s/epoch", "samples/s", "Speed-up vs float32", memory_label(results),
              "Memory vs float32", "Val accuracy (%)", "Gap vs float32 (points)",
              "Final loss scale", "Skipped steps"]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|")
    for p, r in results.items():
        if r["runs_ok"] == 0:
            lines.append("| " + " | ".join([p, f"failed ({r['runs_failed']} runs)"] + ["–"] * (len(header) - 2)) + " |")
            continue
        su = r["speedup_vs_float32"]
        mem_ratio = r.get("memory_ratio_vs_float32")
        gap = r.get("accuracy_gap_points")
        row = [
            p,
            _spread(r["seconds_per_epoch"], _seconds_format(r["seconds_per_epoch"])),
            _spread(r["samples_per_second"], ",.0f"),
            _spread(su, ".2f", suffix="x"),
            _spread(r["peak_memory"], ",.0f", 1.0 / MIB),
            _num(mem_ratio, ".2f") + ("x" if mem_ratio is not None else ""),
            _spread(r["val_accuracy"], ".2f", 100.0),
            "–" if gap is None else f"{gap:+.2f}",
            _spread(r["loss_scale"], "g") if p == "mixed_float16" else "none",
            _spread(r["skipped_steps"], ".0f"),
        ]
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    lines += best_batch_table(doc.get("results_best_batch"))
    w = doc["warmup"]
    lines.append(
        f"Medians over {st['repeats']} interleaved repeat(s), (min–max) when more than one; each "
        f"run a fresh process. Timing excludes the first {w['epochs_excluded']} epoch(s) of every "
        f"run (warm-up); s/epoch and samples/s are the median of the remaining "
        f"{st['epochs'] - w['epochs_excluded']} epoch(s) of each run. "
        f"XLA (--jit): {'on' if st.get('jit') else 'not forced (Keras default)'}; steps_per_execution: "
        f"{st.get('steps_per_execution') or 1}; loop: {st.get('loop')}; "
        f"TensorFlow {doc['environment'].get('tensorflow', '?')}.")
    ip = doc.get("input_pipeline") or {}
    if ip.get("samples_per_second"):
        share = ip.get("training_share")
        lines.append(
            f"Input pipeline alone (the same batches, no model, warm-up excluded): "
            f"{rate_text(ip['samples_per_second'])} samples/s"
            + (f" (timed again after the runs, which outran its first timing of "
               f"{rate_text(ip['first_timing'])} samples/s)" if ip.get("retimed") else "")
            + (f"; the fastest policy trained at {share * 100:.0f}% of it." if share else "."))
    elif ip.get("error"):
        lines.append(f"Input pipeline alone: not measured ({ip['error']}).")
    fp32 = doc.get("fp32_baseline") or {}
    if fp32.get("explanation"):
        lines.append(fp32["explanation"])
    if doc.get("profiles"):
        lines.append("Profiles (one short untimed run per policy, TensorBoard's Profile tab): "
                     + "; ".join(f"{p}: {d}" for p, d in doc["profiles"].items()) + ".")
    if doc.get("baseline_added"):
        lines.append("float32 was added as the baseline of the relative columns.")
    if doc["skipped"]:
        lines.append("")
        lines.append("Skipped:")
        for s in doc["skipped"]:
            lines.append(f"- {s['policy']}: {s['reason']}")
    if doc["diagnoses"]:
        lines.append("")
        lines.append("Diagnoses:")
        for d in doc["diagnoses"]:
            lines.append(f"- [{d['severity']}] {d['message']}")
    lines.append("")
    return "\n".join(lines)


def best_batch_table(best: Optional[Mapping[str, Any]]) -> List[str]:
    """The guide's real comparison: each policy at its own best batch (from a tune), the
    speed-up over float32 at float32's own best batch."""
    if not best:
        return []
    results = best["results"]
    lines = [f"#### Each at its own best batch (from {best.get('source') or 'a tune'})", ""]
    header = ["Policy", "Batch", "samples/s", "Speed-up vs float32 at its own best",
              memory_label(results) if results else "Peak memory (MiB)"]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|")
    for p, r in results.items():
        if r["runs_ok"] == 0:
            lines.append("| " + " | ".join([p, str(r["batch_size"]),
                                            f"failed ({r['runs_failed']} runs)", "–", "–"]) + " |")
            continue
        lines.append("| " + " | ".join([
            p, str(r["batch_size"]), _spread(r["samples_per_second"], ",.0f"),
            _spread(r["speedup_vs_float32"], ".2f", suffix="x"),
            _spread(r["peak_memory"], ",.0f", 1.0 / MIB)]) + " |")
    for p, why in (best.get("not_run") or {}).items():
        lines.append(f"| {p} | – | not run: {why} | – | – |")
    lines.append("")
    return lines
