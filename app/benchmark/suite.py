"""The whole benchmark: environment, plan, interleaved runs, summary, diagnoses, files."""
from __future__ import annotations

import math
import os
import shutil
import sys
from typing import Any, Callable, Dict, Mapping, Optional, Sequence

from app.benchmark import baseline, chart, diagnose, layout, plan, report, runner, stats
from app.core import folders
from app.core.errors import ReportedError, UsageError, unprefixed
from app.core.launch import log_traceback
from app.machine.hardware import HardwareInfo, read_cpu_flags
from app.core.files import utc_now_iso

OUTPUT_FILES = ("benchmark.json", "benchmark.md", "benchmark.png", "env.json", "env.txt")
# The pipeline's second timing, when training outran its first (_retime_if_contradicted).
RETIMED_LOG = "input_pipeline_again.log"


def hardware_from_env(env: Mapping[str, Any]) -> HardwareInfo:
    """Rebuild the HardwareInfo that ``tfmp env --json`` reported.

    Falls back to this machine's /proc/cpuinfo (no GPU) when the report failed.
    """
    hw = env.get("hardware") if isinstance(env, Mapping) else None
    if not isinstance(hw, Mapping):
        return HardwareInfo(cpu_flags=read_cpu_flags())
    return HardwareInfo.from_dict(hw)


def _steps_per_epoch(runs: Sequence[Mapping[str, Any]],
                     settings: Mapping[str, Any]) -> Optional[int]:
    for r in runs:
        m = r.get("metrics_summary") or {}
        if m.get("train_samples"):
            return math.ceil(m["train_samples"] / settings["batch_size"])
    return None


def run_benchmark(settings: Dict[str, Any], requested: Optional[Sequence[str]], output: str, *,
                  repeats: int, warmup_epochs: int, max_accuracy_gap: float,
                  timeout: Optional[float] = None, argv: Sequence[str] = (),
                  launcher: runner.Launcher = runner.subprocess_launcher,
                  environment: Optional[Mapping[str, Any]] = None,
                  echo: Callable[[str], None] = print, measure_input: bool = True,
                  best_batches: Optional[Mapping[str, int]] = None,
                  best_batch_source: Optional[str] = None,
                  fp32_baseline: str = baseline.DEFAULT, profile: bool = False,
                  output_made: bool = False) -> int:
    """Run, write every file into ``output``, print the table; 0 if every run succeeded.

    ``output_made``: the command made ``output`` for this benchmark (its default folder,
    claimed): a rejected setting removes it, as a folder the benchmark makes itself.

    ``best_batches`` ({policy: batch}, from a tune): after the equal-batch runs, each
    policy runs again at its own best batch (the guide's real comparison).  ``fp32_baseline``:
    which float32 the relative columns compare with (app.benchmark.baseline); ``profile``: one
    short, untimed run per policy with a profile."""
    env = dict(environment) if environment is not None else runner.collect_environment()
    hw = hardware_from_env(env)
    # A built-in model's layer kinds are known: a policy this TensorFlow cannot run them
    # under here is left out now; a user's model tells in its first run (``left_out``).
    from app.machine import kernels

    cannot_run = {p: unprefixed(e.line())
                  for p, e in kernels.builtin_refusals(settings["model"], env).items()}
    the_plan = plan.plan_policies(requested, hw, cannot_run)
    fp32 = baseline.plan(fp32_baseline, hw)
    schedule = _schedule(the_plan, repeats, fp32)
    left_out: Dict[str, str] = {}

    best_schedule = plan.best_batch_schedule(best_batches or {}, the_plan.run, repeats,
                                             len(schedule))
    profile_schedule = ([{"order": len(schedule) + len(best_schedule) + i, "repeat": 1,
                          "policy": p, "series": "profile"}
                         for i, p in enumerate(the_plan.run)] if profile else [])
    pipeline, all_records = _run_all(
        schedule + best_schedule + profile_schedule, settings, output, warmup_epochs,
        launcher=launcher, timeout=timeout, left_out=left_out, measure_input=measure_input,
        output_made=output_made)

    if left_out:
        the_plan = plan.Plan(run=tuple(p for p in the_plan.run if p not in left_out),
                             skipped={**the_plan.skipped, **left_out},
                             baseline_added=the_plan.baseline_added)
    records = [r for r in all_records if r["series"] == "equal_batch"]
    results = stats.summarize(records, the_plan.run)
    at_best = _best_batch_results(best_batches, all_records, the_plan.run,
                                  best_batch_source)
    widths, widths_note = _layer_widths(settings["model"], pipeline)
    pipeline = _retime_if_contradicted(pipeline, results, settings, warmup_epochs, output,
                                       launcher=launcher, timeout=timeout)
    input_rate = (pipeline or {}).get("samples_per_second")
    if pipeline is not None:
        best = diagnose.fastest(results)[1]
        pipeline["training_share"] = (round(best / input_rate, 4)
                                      if best is not None and input_rate else None)
    fp32_doc = _fp32_doc(fp32, results, all_records)
    profiles = {r["policy"]: os.path.join(r["output_dir"], "tensorboard")
                for r in all_records if r["series"] == "profile" and r["ok"]}
    failed = [r for r in all_records if not r["ok"]]
    loads = [v for r in all_records for v in (r.get("load_average") or []) if v is not None]
    diags = diagnose.diagnose(results, hw, settings, layer_widths=widths,
                              steps_per_epoch=_steps_per_epoch(records, settings),
                              max_accuracy_gap=max_accuracy_gap, failed_runs=failed,
                              max_load=max(loads) if loads else None,
                              cpu_count=os.cpu_count(), input_rate=input_rate,
                              layer_widths_note=widths_note)
    status = "ok" if not failed else ("failed" if len(failed) == len(all_records) else "partial")
    doc: Dict[str, Any] = {
        "schema": report.SCHEMA,
        "created_utc": utc_now_iso(),
        "command": ["python", "-m", "app", "benchmark", *argv],
        "status": status,
        "settings": dict(settings, repeats=repeats, warmup_epochs=warmup_epochs,
                         jit=bool(settings.get("jit")),
                         steps_per_execution=settings.get("steps_per_execution") or 1,
                         max_accuracy_gap_points=max_accuracy_gap),
        **_method(warmup_epochs, schedule + best_schedule),
        # Per run: whether float32 ran on TF32 Tensor Cores (its metrics.json's environment).
        "tf32_by_run": {f"{r['policy']}#{r['repeat']}" + ("-strict" if r["series"]
                                                         == baseline.STRICT_SERIES else ""):
                        r.get("tf32") for r in all_records},
        "hardware": dict(hw.to_dict(), description=plan.describe(hw), cpu_count=os.cpu_count()),
        "load_average_max": max(loads) if loads else None,
        "environment": env,
        "policies_requested": list(requested) if requested else "default",
        "policies_run": list(the_plan.run),
        "baseline_added": the_plan.baseline_added,
        "skipped": [{"policy": p, "reason": r} for p, r in the_plan.skipped.items()],
        "units": report.UNITS,
        "results": results,
        "results_best_batch": at_best,
        # Which float32 the relative columns compare with, and TF32's part in it.
        "fp32_baseline": fp32_doc,
        "profiles": profiles or None,
        "input_pipeline": pipeline,
        "layer_widths": {"widths": widths, "note": widths_note},
        "diagnoses": [d.to_dict() for d in diags],
        "runs": all_records,
    }
    _write_files(output, doc, env, echo)
    return 0 if status == "ok" else 1


def _run_all(schedule, settings, output: str, warmup_epochs: int, *, launcher, timeout,
             left_out: Dict[str, str], measure_input: bool, output_made: bool = False):
    """(the input pipeline's measurement or None, every run's record): each run a child
    process, its folder under ``output``/runs.  Settings ``tfmp train`` rejects: UsageError,
    with nothing of ours left in ``output``."""
    existed = os.path.isdir(output) and not output_made
    folders.make_folder(output)
    try:
        # First: the cheapest child also checks the settings (a bad spec stops here).
        pipeline = (runner.measure_input_rate(settings, warmup_epochs, output,
                                              launcher=launcher, timeout=timeout)
                    if measure_input else None)
        records = runner.run_schedule(schedule, settings, os.path.join(output, "runs"),
                                      warmup_epochs, launcher=launcher, timeout=timeout,
                                      left_out=left_out)
    except runner.TrainRejectedInput as exc:
        _remove_what_we_wrote(output, existed)
        # The trainer's line already says what is allowed.
        raise UsageError(f"tfmp train rejected the settings: {exc.line}") from None
    except runner.TrainCodeFailed as exc:
        # The user's traceback from the run's log, then train's own line, as train shows
        # them (exit status 1); the folder goes with the rest of what was written.
        sys.stderr.write(log_traceback(exc.log))
        _remove_what_we_wrote(output, existed)
        raise ReportedError(exc.line) from None
    return pipeline, records


def _retime_if_contradicted(pipeline: Optional[Dict[str, Any]], results, settings,
                            warmup_epochs: int, output: str, *, launcher, timeout):
    """The pipeline timed once more, after the runs, when training beat it by more than
    ``diagnose.PIPELINE_MISTIMED``: no model trains faster than its data arrives, so its
    first timing was slowed by something else on the machine, and a second one at another
    moment decides.  Its rate is the faster of the two; both timings are kept."""
    rate = (pipeline or {}).get("samples_per_second")
    if not diagnose.pipeline_outrun(diagnose.fastest(results)[1], rate):
        return pipeline
    try:
        again = runner.measure_input_rate(
            settings, warmup_epochs, output, launcher=launcher, timeout=timeout,
            log_name=RETIMED_LOG, why="again: training ran faster than its first timing")
    except (runner.TrainRejectedInput, runner.TrainCodeFailed) as exc:
        again = {"error": exc.line, "samples_per_second": None}
    second = again.get("samples_per_second")
    retimed = {k: again.get(k) for k in ("samples_per_second", "epochs", "log", "error")
               if again.get(k) is not None}
    return dict(pipeline, samples_per_second=max(rate, second or 0), first_timing=rate,
                retimed=retimed)


def _schedule(the_plan, repeats: int, fp32) -> list:
    """The equal-batch runs, interleaved; float32 with the TF32 setting of the baseline
    asked for, and a strict float32 run after each when both are asked for."""
    schedule = plan.interleaved_schedule(the_plan.run, repeats)
    primary_tf32 = baseline.primary_tf32_flag(fp32)
    if primary_tf32:
        schedule = [dict(e, tf32=primary_tf32) if e["policy"] == plan.BASELINE else e
                    for e in schedule]
    return baseline.with_strict_runs(schedule) if fp32.extra_strict else schedule


def _fp32_doc(fp32, results, all_records) -> Dict[str, Any]:
    """benchmark.json's ``fp32_baseline``: which float32 was compared with, and why."""
    strict = None
    if fp32.extra_strict:
        strict = stats.summarize([dict(r, series="equal_batch") for r in all_records
                                  if r["series"] == baseline.STRICT_SERIES],
                                 [plan.BASELINE])[plan.BASELINE]
    return dict(fp32.to_dict(), strict_float32=strict,
                speedup_vs_strict_float32=(baseline.against_strict(results, strict)
                                           if strict else None),
                explanation=baseline.explanation(fp32, results, strict))


def _remove_what_we_wrote(output: str, existed: bool) -> None:
    """A rejected input: the user's empty folder stays, what we put in it goes (the command
    checked that ``output`` was new or empty, so nothing of the user's goes with it)."""
    if existed:
        for name in os.listdir(output):
            path = os.path.join(output, name)
            shutil.rmtree(path) if os.path.isdir(path) else os.unlink(path)
    else:
        shutil.rmtree(output, ignore_errors=True)


def _method(warmup_epochs: int, order) -> Dict[str, Any]:
    """benchmark.json's account of how it measured: the warm-up left out, the interleaving."""
    return {
        "warmup": {
            "epochs_excluded": warmup_epochs,
            "how": (f"the first {warmup_epochs} epoch(s) of every run are left out of s/epoch "
                    "and samples/s (graph tracing, XLA compilation, autotuning); accuracy, loss "
                    "scale and skipped steps come from the whole run"),
        },
        "interleaving": {
            "how": "round-robin: one run of each policy per repeat, in the order listed; every "
                   "run is a fresh `tfmp train` process",
            "order": [f"{e['policy']}#{e['repeat']}" + (f"@b{e['batch_size']}"
                                                        if e.get("batch_size") else "")
                      for e in order],
        },
    }


def _write_files(output: str, doc: Dict[str, Any], env: Mapping[str, Any],
                 echo: Callable[[str], None]) -> None:
    """env.json, env.txt, benchmark.md, the chart, and benchmark.json last: its presence
    means the benchmark finished."""
    table = report.markdown(doc)
    report.write_atomic(os.path.join(output, "env.json"), report.to_json(env))
    report.write_atomic(os.path.join(output, "env.txt"), _env_text(env))
    report.write_atomic(os.path.join(output, "benchmark.md"), table)
    try:
        report.write_atomic(os.path.join(output, "benchmark.png"), chart.render_png(doc))
        doc["chart"] = "benchmark.png"
    except Exception as exc:  # the numbers matter more than the picture
        doc["chart"] = None
        doc["chart_error"] = f"{type(exc).__name__}: {exc}"
        print(f"[benchmark] chart not written: {doc['chart_error']}", file=sys.stderr)
    report.write_atomic(os.path.join(output, "benchmark.json"), report.to_json(doc))
    echo(table)
    echo(f"Wrote {', '.join(f for f in OUTPUT_FILES if os.path.exists(os.path.join(output, f)))} "
         f"and runs/ to {output}")


def _best_batch_results(best_batches, all_records, policies, source):
    """benchmark.json's ``results_best_batch``: each policy at its own best batch, speed-up
    over float32 at float32's own best (paired by repeat); None without a tune."""
    if best_batches is None:
        return None
    ran = [p for p in policies if p in best_batches]
    results = stats.summarize([r for r in all_records if r["series"] == "best_batch"], ran)
    for p in ran:
        results[p]["batch_size"] = best_batches[p]
    return {"source": source, "batch_sizes": dict(best_batches), "results": results,
            "not_run": {p: "the tune found no batch size that fits" for p in policies
                        if p not in best_batches}}


def _layer_widths(model: str, pipeline: Optional[Mapping[str, Any]]):
    """(widths, why not known): the built-ins from layout's table, a user's model from the
    input-rate child, which built it once."""
    widths = layout.layer_widths(model)
    if widths is not None:
        return widths, None
    pipeline = pipeline or {}
    if pipeline.get("layer_widths") is not None:
        return list(pipeline["layer_widths"]), None
    return None, (pipeline.get("layer_widths_note") or pipeline.get("error")
                  or "the model was not built outside the training runs")


def _env_text(env: Mapping[str, Any]) -> str:
    try:
        from app.machine import envreport

        return envreport.format_text(dict(env)) + "\n"
    except Exception:
        return report.to_json(env)
