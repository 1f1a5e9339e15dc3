"""tune.json, the console table and the PNG chart.  Pure except ``render_png`` (matplotlib).

Scripts read tune.json, so these keys are kept (issue 16): ``budget_bytes``, ``margin``,
``precisions`` (by policy: ``max_batch``, ``best_batch``, ``best_samples_per_second``,
``trials``: ``batch_size``, ``fits``, ``peak_memory_bytes``, ``samples_per_second``,
``reason``), ``choice`` (``precision``, ``batch_size``, ``samples_per_second``),
``verified``; ``left_out`` lists the policies this TensorFlow cannot run the model under
here (``policy``, ``reason``).
"""
from __future__ import annotations

import io
from typing import Any, Dict, List, Mapping, Optional

from app.core.catalog import BASELINE_POLICY
from app.tuner import search
from app.machine.memory import format_size

from app.training.tuned import SCHEMA  # noqa: F401  (the tune.json format is training's)
COLOURS = {"float32": "#4c72b0", "mixed_float16": "#dd8452", "mixed_bfloat16": "#55a868"}


def ran_words(steps: int, ran: Optional[Dict[str, Any]]) -> str:
    """What a verification trained, in words: ``3 updates (257 micro-batches)`` under
    accumulation, ``11 steps`` without (the short last batch is one); ``steps`` (the steps
    asked for) when the run did not say."""
    if not ran or not ran.get("updates"):
        return f"{steps} steps"
    updates, micro = ran["updates"], ran.get("micro_batches")
    if micro and micro != updates:
        return f"{updates} update(s) ({micro} micro-batches)"
    return f"{updates} steps"


def precision_entry(result: search.SearchResult, verify_trials: List[search.Trial]) -> dict:
    """One policy's block of tune.json."""
    best = result.best()
    per_sample = search.memory_per_sample(result.trials)
    return {
        "max_batch": result.max_batch,
        "best_batch": best.batch_size if best else None,
        "best_samples_per_second": best.samples_per_second if best else None,
        "best_peak_memory_bytes": best.peak_memory_bytes if best else None,
        "memory_per_sample_bytes": round(per_sample) if per_sample is not None else None,
        "stopped": result.stopped,
        "cap": result.cap,
        "train_samples": result.train_samples,
        "trials": [t.to_dict() for t in result.trials + verify_trials],
    }


def speedups(precisions: Mapping[str, Mapping[str, Any]]) -> Dict[str, Optional[float]]:
    """Each policy's best samples/s over float32's at float32's own best batch."""
    base = (precisions.get(BASELINE_POLICY) or {}).get("best_samples_per_second")
    return {p: (round(e["best_samples_per_second"] / base, 3)
                if base and e.get("best_samples_per_second") else None)
            for p, e in precisions.items()}


def table(doc: Mapping[str, Any]) -> str:
    """The console summary: one row per precision, then the choice."""
    rows = [("precision", "largest batch", "memory/sample", "fastest batch", "samples/s",
             "vs float32")]
    ups = speedups(doc["precisions"])
    for policy, e in doc["precisions"].items():
        per = e.get("memory_per_sample_bytes")
        rows.append((policy,
                     str(e["max_batch"]) if e["max_batch"] else "none fits",
                     _per_sample(per),
                     str(e["best_batch"] or "-"),
                     f"{e['best_samples_per_second']:,.0f}" if e["best_samples_per_second"] else "-",
                     f"{ups[policy]:.2f}x" if ups.get(policy) else "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in
                       enumerate(zip(r, widths))) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    c, v = doc.get("choice"), doc.get("verified") or {}
    lines.append("")
    lines.append(f"budget {format_size(doc['budget_bytes'])} ({doc['budget_source']}), "
                 f"margin {doc['margin']:.0%}: trials may peak at "
                 f"{format_size(doc['limit_bytes'])} ({doc['memory_kind']})")
    if c:
        lines.append(f"choice: {c['precision']} at batch {c['batch_size']} "
                     f"({c['samples_per_second']:,.0f} samples/s)"
                     + (f", verified over {ran_words(v.get('steps'), v)} at "
                        f"{format_size(v.get('peak_memory_bytes'))}" if v.get("fits") else ""))
    for entry in doc.get("left_out", []):
        lines.append(f"left out: {entry['reason']}")
    for note in doc.get("notes", []):
        lines.append(f"note: {note}")
    return "\n".join(lines)


def render_png(doc: Mapping[str, Any]) -> bytes:
    """Samples/s and peak memory against batch size, one line per precision."""
    import matplotlib

    matplotlib.use("Agg", force=True)  # no display in containers and batch jobs
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4), dpi=100)
    speed, memory = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    for policy, e in doc["precisions"].items():
        colour = COLOURS.get(policy, "#8172b2")
        trials = sorted((t for t in e["trials"] if t.get("phase", "search") == "search"),
                        key=lambda t: t["batch_size"])
        fits = [t for t in trials if t["fits"]]
        if fits:
            speed.plot([t["batch_size"] for t in fits], [t["samples_per_second"] for t in fits],
                       "o-", color=colour, label=policy)
            if e.get("best_batch"):
                speed.plot([e["best_batch"]], [e["best_samples_per_second"]], "*",
                           color=colour, markersize=14)
        known = [t for t in trials if t["peak_memory_bytes"]]
        if known:
            memory.plot([t["batch_size"] for t in known],
                        [t["peak_memory_bytes"] / 2**20 for t in known], "-", color=colour,
                        label=policy)
            for t in known:
                memory.plot([t["batch_size"]], [t["peak_memory_bytes"] / 2**20],
                            "o" if t["fits"] else "x", color=colour)
        if e.get("max_batch"):
            memory.axvline(e["max_batch"], color=colour, linestyle=":", linewidth=1)
    memory.axhline(doc["budget_bytes"] / 2**20, color="#c44e52", linewidth=1, label="budget")
    memory.axhline(doc["limit_bytes"] / 2**20, color="#c44e52", linewidth=1, linestyle="--",
                   label=f"budget less {doc['margin']:.0%} margin")
    for ax, title in ((speed, "Training speed (samples/s); * fastest"),
                      (memory, f"Peak memory (MiB, {doc['memory_kind']}); x did not fit")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8)
        ax.grid(True, alpha=0.3)
    task = doc["task"]
    fig.suptitle(f"tfmp tune: {task['model']} / {task['dataset']}, "
                 f"budget {format_size(doc['budget_bytes'])}", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _per_sample(n) -> str:
    """Memory a sample: MiB, or KiB for a small model (0.00 MiB said nothing)."""
    if not n:
        return "-"
    return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"
