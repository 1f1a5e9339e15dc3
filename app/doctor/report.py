"""Findings, the verdict and the two renderings of a check report (text and JSON)."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

from app.core.exit_codes import EXIT_FAILED, EXIT_OK
from app.task.data import several_inputs, shape_text
from app.task.float32_layers import FLAG as F32_FLAG

BLOCKER, WARNING, INFO = "blocker", "warning", "info"
SEVERITIES = (BLOCKER, WARNING, INFO)
READY, READY_WITH_WARNINGS, BLOCKED = "ready", "ready with warnings", "blocked"
EXIT_READY, EXIT_BLOCKED = EXIT_OK, EXIT_FAILED  # check: ready / a blocker found


@dataclass
class Finding:
    severity: str          # blocker | warning | info
    check: str             # which check found it (output_dtype, float32_layer, tensor_cores, ...)
    layer: Optional[str]   # the layer's name, or None for the model, the batch or the data
    what: str
    fix: Optional[str] = None

    def to_dict(self) -> dict:
        return asdict(self)


def verdict(findings) -> str:
    severities = {f.severity for f in findings}
    if BLOCKER in severities:
        return BLOCKED
    return READY_WITH_WARNINGS if WARNING in severities else READY


def exit_code(report: dict) -> int:
    return EXIT_BLOCKED if report["verdict"] == BLOCKED else EXIT_READY


def sort_findings(findings) -> list:
    return sorted(findings, key=lambda f: SEVERITIES.index(f.severity))


def counts(findings) -> dict:
    return {s: sum(1 for f in findings if f.severity == s) for s in SEVERITIES}


# ---- text ----------------------------------------------------------------------------------

def _table(rows, headers) -> list:
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) if rows else len(str(h))
              for i, h in enumerate(headers)]
    fmt = "  ".join("{:<%d}" % w for w in widths)
    lines = [fmt.format(*headers).rstrip()]
    lines += [fmt.format(*(str(c) for c in r)).rstrip() for r in rows]
    return lines


def _pct(v) -> str:
    return "n/a" if v is None else f"{100.0 * v:.2f}%"


def _num(v) -> str:
    return "nan/inf" if v is None else f"{v:.4g}"


def to_text(report: dict) -> str:
    out = []
    data = report.get("data") or {}
    shape = data.get("input_shape") or []
    out.append(f"check: model {report['model']!r} under {report['policy']}, batch "
               f"{report['batch_size']}, data {report['dataset']!r} ("
               f"{'inputs' if several_inputs(shape) else 'samples of shape'} "
               f"{shape_text(shape)}, "
               + (f"labels of {data.get('num_classes')} value(s))"
                  if data.get("label_kind") == "other" else
                  f"multi-hot labels of {data.get('num_classes')} classes)"
                  if data.get("label_kind") == "multilabel" else
                  f"{data.get('num_classes')} classes)"))
    decision = report.get("precision") or {}
    if decision.get("requested") == "auto":
        out.append(f"precision: auto chose {report['policy']} ({decision.get('reason')})")
    # The float32 layers have a line of their own below.
    out += [f"note: {note}" for note in report.get("notes") or []
            if not note.startswith(f"{F32_FLAG}:")]
    if report.get("float32_layers"):
        out.append(f"float32 layers (--float32-layers): {', '.join(report['float32_layers'])}")
    rows = [(r["name"], r["class"], r["compute_dtype"], r["variable_dtype"],
             r["output_dtype"] or "-") for r in report.get("layers") or []]
    if rows:
        out.append("")
        out += _table(rows, ("layer", "class", "compute", "variables", "output"))
    probe = report.get("probe") or {}
    if probe.get("ran"):
        out.append("")
        line = (f"one step on one batch: loss {_num(probe.get('loss'))}, gradients "
                f"{'finite' if probe.get('gradients_finite') else 'NOT finite'}")
        if probe.get("zero_share_unscaled") is not None:
            line += (f"; gradient elements that are zero: {_pct(probe['zero_share_unscaled'])} "
                     f"without loss scaling, {_pct(probe.get('zero_share_scaled'))} with it "
                     f"(scale {probe.get('loss_scale'):g})")
        out.append(line)
    comp = report.get("comparison") or {}
    if comp.get("stopped_at_step"):
        out.append(f"{report['policy']} over {comp['steps']} step(s): stopped at step "
                   f"{comp['stopped_at_step']} by the numerics sentinel (see the finding)")
    elif comp.get("ran") and not comp.get("compared"):
        out.append(f"{report['policy']} over {comp['steps']} step(s), watched: loss "
                   f"{_num(comp['policy_start'])} before, {_num(comp['policy_end'])} after")
    elif comp.get("ran"):
        out.append(f"float32 vs {report['policy']} over {comp['steps']} step(s) from the same "
                   f"weights: loss {_num(comp['float32_start'])} vs {_num(comp['policy_start'])} "
                   f"before, {_num(comp['float32_end'])} vs {_num(comp['policy_end'])} after "
                   f"(relative difference {_pct(comp.get('relative_difference_end'))})")
    findings = report.get("findings") or []
    out.append("")
    if findings:
        out.append("findings:")
        for f in findings:
            who = f"layer {f['layer']!r}: " if f.get("layer") else ""
            if who and f["what"].startswith(f"layer {f['layer']!r}"):
                who = ""  # the sentence names it already
            out.append(f"  {f['severity'].upper():<8} {who}{f['what']}")
            if f.get("fix"):
                out.append(f"           fix: {f['fix']}")
    else:
        out.append("findings: none")
    c = report["counts"]
    out.append("")
    out.append(f"verdict: {report['verdict']} ({c['blocker']} blocker(s), {c['warning']} "
               f"warning(s), {c['info']} info) in {report.get('seconds', 0):.1f} s")
    return "\n".join(out)
