"""Plain-word reasons for what the benchmark measured, in the spirit of the guide's
troubleshooting table (no speed-up -> no Tensor Cores; NaN -> loss scaling; ...).

Pure: every rule reads the per-policy summary, the hardware description and the settings,
and returns ``Diagnosis`` records.  Nothing here imports TensorFlow.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence

from app.benchmark.stats import rate_text
from app.machine.hardware import HardwareInfo
from app.core.catalog import has_fast_path
from app.precision.policy import off_tensor_core_tiles

# A mixed policy "pays" from this median speed-up on; below it we look for a reason.
PAYS = 1.10
# Spread (max - min) / median of samples/s above which the numbers are called noisy.
NOISY = 0.25
# A step shorter than this on a GPU is dominated by kernel launches and Python overhead.
LAUNCH_BOUND_STEP_MS = 10.0
DEFAULT_MAX_ACCURACY_GAP = 1.0  # percentage points
# Training at this share of the input pipeline's own rate (or more) is input-bound.
INPUT_BOUND = 0.8
# Training this much faster than the pipeline alone: the pipeline's timing did not hold.
PIPELINE_MISTIMED = 1.25


@dataclass(frozen=True)
class Diagnosis:
    code: str
    severity: str        # "info", "warning" or "problem"
    policy: Optional[str]
    message: str

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


def _median(summary: Mapping[str, Any], key: str) -> Optional[float]:
    val = summary.get(key)
    if isinstance(val, Mapping):
        return val.get("median")
    return val


def _fmt_x(v: Optional[float]) -> str:
    return "n/a" if v is None else f"{v:.2f}x"


def diagnose(summary: Mapping[str, Mapping[str, Any]],
             hw: HardwareInfo,
             settings: Mapping[str, Any],
             layer_widths: Optional[Sequence[int]] = None,
             steps_per_epoch: Optional[int] = None,
             max_accuracy_gap: float = DEFAULT_MAX_ACCURACY_GAP,
             failed_runs: Sequence[Mapping[str, Any]] = (),
             max_load: Optional[float] = None, cpu_count: Optional[int] = None,
             input_rate: Optional[float] = None,
             layer_widths_note: Optional[str] = None) -> List[Diagnosis]:
    """All diagnoses, most important first.

    ``settings`` needs ``batch_size``, ``steps_per_execution`` and ``jit``;
    ``layer_widths`` are the model's Dense units / Conv filters when known (else
    ``layer_widths_note`` says why not); ``max_load`` is the highest 1-minute load average
    seen around the runs, ``cpu_count`` the CPUs; ``input_rate`` the samples/s of the input
    pipeline alone.
    """
    out: List[Diagnosis] = []
    out += _failures(failed_runs)
    out += _nonfinite(summary)
    out += _accuracy_gap(summary, max_accuracy_gap)
    out += input_bound(summary, input_rate, settings)
    out += _hardware_without_fast_path(summary, hw)
    out += _launch_bound(summary, hw, settings, steps_per_epoch)
    out += _multiples_of_8(summary, settings, layer_widths)
    if layer_widths is None and layer_widths_note and any(
            p in summary for p in ("mixed_float16", "mixed_bfloat16")):
        out.append(Diagnosis("layer_widths_unknown", "info", None,
                             f"layer widths were not checked for multiples of 8: "
                             f"{layer_widths_note}."))
    out += _loss_scale(summary)
    out += _noise(summary, max_load, cpu_count)
    out += _pays(summary, hw)
    return out


def fastest(summary: Mapping[str, Mapping[str, Any]]):
    """(policy, median samples/s) of the fastest policy, or (None, None)."""
    best = (None, None)
    for p, s in summary.items():
        sps = _median(s, "samples_per_second")
        if sps is not None and (best[1] is None or sps > best[1]):
            best = (p, sps)
    return best


def pipeline_outrun(best: Optional[float], input_rate: Optional[float]) -> bool:
    """Training faster than its data can arrive, by more than PIPELINE_MISTIMED: the
    pipeline's own timing did not hold (the suite times it again; the verdict says so)."""
    return bool(input_rate and input_rate > 0 and best is not None
                and best > PIPELINE_MISTIMED * input_rate)


def input_bound(summary: Mapping[str, Mapping[str, Any]], input_rate: Optional[float],
                settings: Mapping[str, Any], threshold: float = INPUT_BOUND) -> List[Diagnosis]:
    """Training (the fastest policy) at ``threshold`` of the input pipeline's own rate or
    more: the data, not the arithmetic, sets the pace, and no policy can go faster."""
    policy, best = fastest(summary)
    if not input_rate or input_rate <= 0 or best is None or best < threshold * input_rate:
        return []
    if pipeline_outrun(best, input_rate):
        # No model trains faster than its data arrives: the pipeline's own epochs were too
        # short to time (an iterator's start, the shuffle buffer's fill), not the job slow.
        return [Diagnosis(
            "input_rate_mistimed", "info", policy,
            f"the input pipeline alone measured {rate_text(input_rate)} samples/s, slower than "
            f"training with {policy} ({rate_text(best)}): its epochs were too short to time, or the "
            "machine was busier while they ran, so whether the job is input-bound is not "
            "known; more training samples (or --epochs) on a quiet machine measure it")]
    return [Diagnosis(
        "input_bound", "warning", policy,
        f"this job is input-bound: the input pipeline alone delivers {rate_text(input_rate)} "
        f"samples/s and training with {policy} reached {rate_text(best)} samples/s "
        f"({best / input_rate * 100:.0f}% of it). Mixed precision speeds up the model's "
        "arithmetic, not the data, so it cannot train faster than the data arrives. Speed up "
        "the pipeline first: cache() the data after the expensive loading and decoding steps "
        "(in memory, or cache(filename) on a local disk); map(..., "
        "num_parallel_calls=tf.data.AUTOTUNE) so preprocessing uses every core; "
        "prefetch(tf.data.AUTOTUNE) after slow reads in your own pipeline (the app already "
        "prefetches the batches it makes); and a larger --batch-size than "
        f"{settings.get('batch_size')} (fewer, bigger batches cost less per sample). Then "
        "compare the policies again.")]


def _failures(failed_runs):
    out = []
    for r in failed_runs:
        out.append(Diagnosis(
            "run_failed", "problem", r.get("policy"),
            f"run {r.get('order')} ({r.get('policy')}, repeat {r.get('repeat')}) failed "
            f"with exit status {r.get('returncode')}: {r.get('error') or 'see its log'}"))
    return out


def _nonfinite(summary):
    out = []
    for p, s in summary.items():
        if s.get("nonfinite_loss"):
            fix = ("loss scaling is on for mixed_float16; lower the learning rate, keep the "
                   "output softmax in float32, and check the data for NaN"
                   if p == "mixed_float16" else
                   "lower the learning rate and check the data for NaN or Inf")
            out.append(Diagnosis("nonfinite_loss", "problem", p,
                                 f"{p}: the loss became NaN or Inf during training; {fix}."))
    return out


def _accuracy_gap(summary, threshold):
    out = []
    for p, s in summary.items():
        gap = s.get("accuracy_gap_points")
        if p == "float32" or gap is None or abs(gap) <= threshold:
            continue
        if gap < 0:
            msg = (f"{p}: final validation accuracy is {-gap:.2f} points below float32 "
                   f"(threshold {threshold:g}). Keep the last layer and normalisation in float32, "
                   "check the loss scale and skipped steps, and train longer before concluding.")
        else:
            msg = (f"{p}: final validation accuracy is {gap:.2f} points above float32 "
                   f"(threshold {threshold:g}); with so few epochs this is run-to-run noise, "
                   "not a gain from lower precision: train longer to compare accuracy.")
        out.append(Diagnosis("accuracy_gap", "warning", p, msg))
    return out


def _slow(summary, p) -> bool:
    su = _median(summary.get(p, {}), "speedup_vs_float32")
    return su is not None and su < PAYS


def _hardware_without_fast_path(summary, hw: HardwareInfo):
    out = []
    if "mixed_float16" in summary:
        su = _fmt_x(_median(summary["mixed_float16"], "speedup_vs_float32"))
        if not hw.gpus:
            out.append(Diagnosis(
                "fp16_on_cpu", "problem", "mixed_float16",
                f"mixed_float16 ran on a CPU ({su} of float32): CPUs have no fast float16 "
                "arithmetic, every float16 operation is converted and emulated. Use "
                "mixed_bfloat16 on a CPU with AVX512_BF16 or AMX, or float32."))
        elif has_fast_path("mixed_float16", hw) is False:
            no_tc = [g for g in hw.gpus if not g.tensor_cores]
            if (_slow(summary, "mixed_float16")
                    or _median(summary["mixed_float16"], "speedup_vs_float32") is None):
                names = ", ".join(sorted({g.name for g in no_tc}))
                out.append(Diagnosis(
                    "no_tensor_cores", "problem", "mixed_float16",
                    f"no speed-up from mixed_float16 ({su}) because {names} has no Tensor Cores "
                    "(they need compute capability 7.0 or newer, and the GTX 16xx parts lack "
                    "them): float16 runs on the same units as float32. Train in float32 here; "
                    "mixed precision pays on V100, T4, RTX 20xx and newer, A100."))
    if "mixed_bfloat16" in summary:
        su = _fmt_x(_median(summary["mixed_bfloat16"], "speedup_vs_float32"))
        fast = has_fast_path("mixed_bfloat16", hw)
        if fast is False and hw.gpus:
            out.append(Diagnosis(
                "bf16_before_ampere", "problem", "mixed_bfloat16",
                f"mixed_bfloat16 on a GPU older than Ampere ({su}): bfloat16 Tensor Cores "
                "start with compute capability 8.0 (A100, RTX 30xx). Use mixed_float16 here."))
        elif fast is False:
            out.append(Diagnosis(
                "bf16_cpu_without_instructions", "problem", "mixed_bfloat16",
                f"mixed_bfloat16 on a CPU without AVX512_BF16 or AMX ({su}): bfloat16 is "
                "emulated with float32 arithmetic plus conversions. Use float32 here."))
    return out


def _capable(p: str, hw: HardwareInfo) -> bool:
    return has_fast_path(p, hw) is True


def _launch_bound(summary, hw, settings, steps_per_epoch):
    out = []
    base_spe = _median(summary.get("float32", {}), "seconds_per_epoch")
    step_ms = (base_spe / steps_per_epoch * 1000.0
               if base_spe and steps_per_epoch else None)
    for p in ("mixed_float16", "mixed_bfloat16"):
        if p not in summary or not _capable(p, hw) or not _slow(summary, p):
            continue
        su = _fmt_x(_median(summary[p], "speedup_vs_float32"))
        hints = []
        if int(settings.get("steps_per_execution") or 1) == 1:
            hints.append("--steps-per-execution 32 (runs many steps per call from Python)")
        if not settings.get("jit"):
            hints.append("--jit (XLA fuses the many small kernels)")
        hints.append(f"a bigger --batch-size than {settings.get('batch_size')}")
        hints.append("a bigger model")
        where = "GPU" if hw.gpus else "CPU"
        timing = f" A float32 step takes {step_ms:.2f} ms." if step_ms is not None else ""
        if hw.gpus and step_ms is not None and step_ms >= LAUNCH_BOUND_STEP_MS:
            # Long steps on capable hardware: not launch-bound; likely input-bound.
            out.append(Diagnosis(
                "no_speedup_input_bound", "warning", p,
                f"{p} runs at only {su} the speed of float32 on capable hardware although steps are long "
                f"({step_ms:.1f} ms): the input pipeline or non-matmul work likely dominates. "
                "Check the data pipeline (prefetch, cache) and that the heavy layers are Dense or "
                "Conv with sizes that are multiples of 8."))
            continue
        if hw.gpus:
            why = ("the model is too small to keep the GPU busy, so time goes to launching "
                   "operations and Python overhead, not to arithmetic that lower precision "
                   "speeds up.")
        else:
            why = ("on a CPU, bfloat16 speeds up only the matrix multiplications and "
                   "convolutions (oneDNN with AVX512_BF16/AMX); in a model this small, the "
                   "conversions, element-wise work and per-step Python overhead eat the gain.")
        out.append(Diagnosis(
            "launch_bound", "warning", p,
            f"{p} runs at only {su} the speed of float32 although this {where} supports it: "
            f"{why}{timing} Try {'; '.join(hints)}."))
    return out


def _multiples_of_8(summary, settings, layer_widths):
    if not any(p in summary for p in ("mixed_float16", "mixed_bfloat16")):
        return []
    bad = []
    bs = settings.get("batch_size")
    if isinstance(bs, int) and off_tensor_core_tiles(bs):
        bad.append(f"batch size {bs}")
    odd = sorted({int(w) for w in (layer_widths or ()) if off_tensor_core_tiles(w)})
    if odd:
        bad.append("layer widths " + ", ".join(str(w) for w in odd))
    if not bad:
        return []
    return [Diagnosis(
        "not_multiple_of_8", "warning", None,
        f"{' and '.join(bad)} not a multiple of 8: Tensor Cores work on tiles of 8 (float16) "
        "and fall back to slower kernels or pad otherwise. Round units, filters and batch size "
        "up to multiples of 8.")]


def _loss_scale(summary):
    out = []
    for p, s in summary.items():
        scale = _median(s, "loss_scale")
        skipped = (s.get("skipped_steps") or {}).get("max")
        if scale is not None and scale < 1.0:
            out.append(Diagnosis(
                "loss_scale_collapsed", "warning", p,
                f"{p}: the loss scale fell to {scale:g} ({int(skipped or 0)} steps skipped): "
                "gradients keep overflowing float16. Lower the learning rate or keep the "
                "overflowing layers in float32."))
    return out


def _noise(summary, max_load=None, cpu_count=None):
    out = []
    # One training process keeps the load near the CPU count; clearly more is other work.
    busy = (max_load is not None and cpu_count and max_load > cpu_count + 1.0)
    why = (f"other work competed for the CPUs (load average up to {max_load:.1f} on "
           f"{cpu_count} CPUs)" if busy else "the machine is busy or throttling")
    for p, s in summary.items():
        sps = s.get("samples_per_second") or {}
        med, lo, hi = sps.get("median"), sps.get("min"), sps.get("max")
        if med and lo is not None and hi is not None and sps.get("n", 0) > 1:
            rel = (hi - lo) / med
            if rel > NOISY:
                out.append(Diagnosis(
                    "noisy", "info", p,
                    f"{p}: samples/s varied by {rel * 100:.0f}% between repeats: {why}. Use more "
                    "--repeats, more epochs, or a quieter machine."))
    return out


def _pays(summary, hw):
    out = []
    for p in ("mixed_float16", "mixed_bfloat16"):
        su = _median(summary.get(p, {}), "speedup_vs_float32")
        if su is not None and su >= PAYS:
            mem = summary[p].get("memory_ratio_vs_float32")
            mem_txt = f", {mem:.2f}x the peak memory" if mem is not None else ""
            out.append(Diagnosis("pays", "info", p,
                                 f"{p} pays here: {su:.2f}x the speed of float32{mem_txt}."))
    return out
