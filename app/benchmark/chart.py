"""PNG chart: speed, peak memory and accuracy per policy, with min-max whiskers."""
from __future__ import annotations

import io
from typing import Any, Mapping

from app.benchmark.report import MIB, memory_label

COLOURS = {"float32": "#4c72b0", "mixed_float16": "#dd8452", "mixed_bfloat16": "#55a868"}


def render_png(doc: Mapping[str, Any]) -> bytes:
    """The chart as PNG bytes (the caller writes them atomically)."""
    import matplotlib

    matplotlib.use("Agg", force=True)  # no display in containers and batch jobs
    from matplotlib.figure import Figure

    results = {p: r for p, r in doc["results"].items() if r["runs_ok"] > 0}
    names = list(results) or ["(no successful run)"]
    fig = Figure(figsize=(12, 4), dpi=100)
    panels = [
        ("samples_per_second", "Training speed (samples/s)", 1.0),
        ("peak_memory", memory_label(doc["results"]) if results else "Peak memory (MiB)", 1.0 / MIB),
        ("val_accuracy", "Final validation accuracy (%)", 100.0),
    ]
    for i, (key, title, scale) in enumerate(panels):
        ax = fig.add_subplot(1, 3, i + 1)
        meds, los, his = [], [], []
        for p in results:
            s = results[p][key]
            m = s.get("median")
            meds.append(0.0 if m is None else m * scale)
            los.append(0.0 if m is None or s.get("min") is None else (m - s["min"]) * scale)
            his.append(0.0 if m is None or s.get("max") is None else (s["max"] - m) * scale)
        ticks = list(names)
        if results:
            ax.bar(range(len(meds)), meds, yerr=[los, his], capsize=4,
                   color=[COLOURS.get(p, "#8172b2") for p in results])
            # Values go under the policy name, where whiskers cannot hide them.
            for j, p in enumerate(results):
                value = f"{meds[j]:,.0f}" if key != "val_accuracy" else f"{meds[j]:.2f}"
                if key == "samples_per_second":
                    su = results[p]["speedup_vs_float32"].get("median")
                    value += f" ({su:.2f}x)" if su is not None else ""
                ticks[j] = f"{p}\n{value}"
        ax.set_xticks(range(len(ticks)))
        ax.set_xticklabels(ticks, fontsize=8)
        ax.set_title(title, fontsize=10)
        if key == "val_accuracy" and results:
            low = min(m - d for m, d in zip(meds, los)) if meds else 0.0
            high = max(m + d for m, d in zip(meds, his)) if meds else 100.0
            ax.set_ylim(max(0.0, low - 5.0), min(100.0, high) + 1.0)
    st = doc["settings"]
    fig.suptitle(f"{st['model']} / {st['dataset']}, batch {st['batch_size']}, "
                 f"{doc['hardware']['description']}: medians of {st['repeats']} repeat(s), "
                 f"warm-up excluded", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()
