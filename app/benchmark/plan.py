"""Which policies to run on this hardware, and in which order.

Pure functions over a small description of the hardware, so every rule is unit-tested with
fake machines (a T4, a P100, a CPU with and without bfloat16 instructions).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from app.machine.hardware import HardwareInfo
from app.core.catalog import BASELINE_POLICY as BASELINE, POLICIES, has_fast_path


def describe(hw: HardwareInfo) -> str:
    """``GPU Tesla T4, compute capability 7.5`` or ``CPU only (AVX512_BF16)``."""
    if hw.gpus:
        g = hw.gpus[0]
        more = f" (+{len(hw.gpus) - 1} more)" if len(hw.gpus) > 1 else ""
        cc = (f", compute capability {g.compute_capability[0]}.{g.compute_capability[1]}"
              if g.compute_capability else "")
        return f"GPU {g.name}{cc}{more}"
    if hw.cpu_amx:
        return "CPU only (AMX)"
    return "CPU only (AVX512_BF16)" if hw.cpu_bf16 else "CPU only (no bfloat16 instructions)"


@dataclass(frozen=True)
class Plan:
    run: Tuple[str, ...]
    skipped: Dict[str, str]
    baseline_added: bool = False


def skip_reason(policy: str, hw: HardwareInfo) -> Optional[str]:
    """Why ``policy`` is left out of a default benchmark on ``hw``, or None if it runs.

    "Cannot run" here means "cannot give a meaningful number": TensorFlow will execute every
    policy everywhere, but float16 on a CPU is emulated (tens of times slower), and bfloat16
    without hardware support is emulated too.  Asking for a policy by name with
    ``--policies`` runs it anyway; the diagnoses then explain the result.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}")
    if has_fast_path(policy, hw) is not False:
        return None
    if policy == "mixed_float16":
        # A GPU without Tensor Cores still runs: "no speed-up, no Tensor Cores" is exactly
        # what users need to see measured (the diagnoses explain it).
        if not hw.gpus:
            return ("no GPU: float16 arithmetic on a CPU is emulated and runs tens of times slower "
                    "than float32 (on the development CPU with TF 2.9.3: about 0.4k against 27k "
                    "samples/s), so the comparison says nothing; name it in --policies to "
                    "measure it anyway")
        return None
    if hw.gpus:
        return (f"{describe(hw)}: bfloat16 Tensor Cores start with Ampere (compute "
                "capability 8.0), so bfloat16 has no fast path here (slower than float32, or "
                "unsupported by some kernels); name it in --policies to measure it anyway")
    return ("the CPU has no bfloat16 instructions (AVX512_BF16 or AMX-BF16): bfloat16 is "
            "emulated and slower than float32; name it in --policies to measure it anyway")


def plan_policies(requested: Optional[Sequence[str]], hw: HardwareInfo,
                  cannot_run: Optional[Mapping[str, str]] = None) -> Plan:
    """Policies to run, in order, and the ones left out with their reasons.

    ``requested`` is None for the default (all three, minus those without a meaningful
    number here).  Named policies run, unless this TensorFlow cannot run the model's layer
    types under them here (``cannot_run``: policy -> reason, from ``app.machine.kernels``).  float32
    is the reference of every relative column, so it is added first when missing
    (``baseline_added``).
    """
    cannot_run = dict(cannot_run or {})
    if requested is None:
        skipped = {p: r for p in POLICIES if (r := cannot_run.get(p) or skip_reason(p, hw))
                   is not None}
        return Plan(run=tuple(p for p in POLICIES if p not in skipped), skipped=skipped)
    ordered: List[str] = []
    for p in requested:
        if p not in POLICIES:
            raise ValueError(f"unknown policy {p!r}")
        if p not in ordered:
            ordered.append(p)
    added = BASELINE not in ordered
    if added:
        ordered.insert(0, BASELINE)
    skipped = {p: cannot_run[p] for p in ordered if p in cannot_run}
    return Plan(run=tuple(p for p in ordered if p not in skipped), skipped=skipped,
                baseline_added=added)


def interleaved_schedule(policies: Sequence[str], repeats: int) -> List[Dict[str, object]]:
    """Round-robin order A, B, C, A, B, C, ...: one run of each policy per repeat.

    Drift on a noisy machine (thermal throttling, a neighbour's job) then hits every policy
    alike instead of all the runs of one policy.  ``order`` counts from 0, ``repeat`` from 1.
    """
    if repeats < 1:
        raise ValueError("repeats must be at least 1")
    out: List[Dict[str, object]] = []
    for r in range(1, repeats + 1):
        for p in policies:
            out.append({"order": len(out), "repeat": r, "policy": p})
    return out


def best_batch_schedule(best: Mapping[str, int], policies: Sequence[str], repeats: int,
                        first_order: int) -> List[Dict[str, object]]:
    """The "each at its own best batch" runs: the policies of ``policies`` that have a best
    batch in ``best``, interleaved like the equal-batch runs and numbered after them."""
    chosen = [p for p in policies if p in best]
    out = interleaved_schedule(chosen, repeats) if chosen else []
    for e in out:
        e.update(order=int(e["order"]) + first_order, batch_size=best[e["policy"]],
                 series="best_batch")
    return out
