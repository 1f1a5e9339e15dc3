"""``tune()``: the whole tune, shared by ``tfmp tune`` and ``app.tune(...)``.

Order of work (nothing is written into ``output`` before the last trial has ended):
  1. check every input that can be checked without TensorFlow (precisions, budget, margin,
     cap, time budget, the specs' form, the output folder);
  2. ask a child process for the hardware and versions (``tfmp env --json``):
     ``auto`` precision and, on a GPU, the GPU's memory;
  3. per precision, ``search.find_max_batch`` with each trial a child process;
  4. the choice (the fastest precision at its own best batch) runs again in a fresh
     process for more steps; over the budget, the tuner steps down to the next size that
     fitted and says so;
  5. tune.json, tune.png and the trials' logs into ``output``; the table on the console.

One tune per folder, as one run per folder for train (``app.run_folder.lock``): the tune holds the
output folder's lock from the end of step 1 until it has written; a folder that holds a tune,
a training run or a tune's file names from something else is refused (one line, exit 2); the
tune deletes nothing it did not write, and a tune that ends without a result removes the
lock file and the folder if it made it.  A failed trial's tune keeps the trials' logs in the
folder, marked, so that the same command run again may use it (``app.tuner.output``).
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from datetime import datetime, timezone
from typing import Any, Dict, List, Optional

from app.core import catalog as registry
from app.core.errors import UsageError, unprefixed
from app.core.exit_codes import EXIT_SIGTERM
from app.run_folder.lock import TUNE, RunLock
from app.training.config import check_variables
from app.tuner.arguments import (check_margin, check_max_batch, check_reference_batch,
                                 check_time_budget, parse_precisions,
                                 resolve_trial_settings, spec_of)
from app.tuner import budget as budget_mod
from app.tuner import output as output_folder
from app.tuner import plan as plan_mod
from app.tuner import report, search
from app.tuner.progress import Progress
from app.core.launch import sigterm_as_exit
from app.tuner.runner import (PolicyLeftOut, TrialFailed, TrialRunner, collect_environment,
                              verification_batches)

DEFAULT_MARGIN = 0.1
DEFAULT_STEPS, DEFAULT_WARMUP, DEFAULT_MIN_SECONDS = 4, 2, 1.5
VERIFY_FACTOR = 2          # the verification runs this many times a trial's steps,
VERIFY_MIN_STEPS = 10      # and at least this many: a process's memory still grows over its
                           # first steps (on the host, 2 steps peaked ~170 MiB below 8 steps)


def verify_steps_for(steps: int) -> int:
    return max(steps * VERIFY_FACTOR, VERIFY_MIN_STEPS)
MAX_STEP_DOWNS = 3


class NothingFits(UsageError):
    """No size fitted under any precision: exit 2 with the smallest size tried and its peak."""


# ---- the tune ------------------------------------------------------------------------------

def tune(model: Any, data: Any = "synthetic", *, precision=None, memory_budget: str = "auto",
         margin: float = DEFAULT_MARGIN, max_batch: Optional[int] = None,
         time_budget: Optional[float] = None, output: Optional[str] = None,
         loss: Optional[str] = None, metrics: Optional[str] = None, input_shape=None,
         num_classes: Optional[int] = None, image_size: Optional[int] = None,
         data_dir: Optional[str] = None, image_dir: Optional[str] = None,
         max_train_samples: Optional[int] = None, offline: Optional[bool] = None,
         seed: Optional[int] = None, learning_rate: Optional[float] = None,
         jit: Optional[bool] = None, steps: int = DEFAULT_STEPS,
         warmup_steps: int = DEFAULT_WARMUP, min_seconds: float = DEFAULT_MIN_SECONDS,
         start: int = search.DEFAULT_START, workspace: Optional[str] = None,
         reference_batch_size: Optional[int] = None, float32_layers=None,
         global_batch: Optional[int] = None, progress: bool = True,
         stream=None) -> Dict[str, Any]:
    """Find, per precision, the largest batch that fits the memory budget and the fastest
    one; choose, verify, write ``output``/tune.json and tune.png; return tune.json's dict.

    What the trials train besides the model and the data (``loss`` ... ``jit``,
    ``float32_layers``, ``workspace``): each keyword not given (None) is its ``TFMP_``
    variable, else train's default, as ``tfmp train`` resolves it, so ``train --tuned`` in
    the same environment trains what was tuned (``arguments.resolve_trial_settings``).

    ``reference_batch_size``: the batch size ``learning_rate`` was set for (what
    ``train --tuned --scale-lr linear`` scales from); default the train batch size setting
    (TFMP_BATCH_SIZE), else train's default.

    Raises ``UsageError`` on bad input (nothing written) and ``NothingFits`` when no size
    fits under any precision.  ``global_batch``: also plan, per precision, the micro-batch
    and accumulation that reach it fastest (``app.tuner.plan``): the choice is that plan."""
    stream = stream or sys.stderr
    check_variables()   # each trial is a train: a bad TFMP_ variable is train's one line now
    model, dataset = spec_of(model, "model"), spec_of(data, "data")
    wanted = parse_precisions(precision)
    margin = check_margin(margin)
    cap = check_max_batch(max_batch)
    time_budget = check_time_budget(time_budget)
    reference_batch_size = check_reference_batch(reference_batch_size)
    global_batch = plan_mod.check_global_batch(global_batch)
    if memory_budget is not None and str(memory_budget).strip().lower() != "auto":
        budget_mod.parse_size(memory_budget)        # a bad size fails before any process
    for name, value in (("steps", steps), ("warmup_steps", warmup_steps)):
        if not isinstance(value, int) or value < (1 if name == "steps" else 0):
            raise UsageError(f"{name} must be a positive integer. Received: {name}={value!r}",
                             "an integer >= 1")
    if isinstance(input_shape, (list, tuple)):
        input_shape = ",".join(str(d) for d in input_shape)
    if isinstance(metrics, (list, tuple)):
        metrics = ",".join(str(m) for m in metrics)
    resolved = resolve_trial_settings(model, dataset, dict(
        loss=loss, metrics=metrics, input_shape=input_shape, num_classes=num_classes,
        float32_layers=float32_layers, image_size=image_size, data_dir=data_dir,
        image_dir=image_dir, max_train_samples=max_train_samples, offline=offline, seed=seed,
        learning_rate=learning_rate, jit=jit), workspace)
    workspace = resolved.pop("workspace")
    task = resolved   # the trial settings, and ``said``: those a TFMP_ variable gave
    if output:
        output_folder.check_output(output)
        created = not os.path.exists(output)
    else:   # every check is done: the folder is claimed, so the cleanup below is this tune's
        output, created = output_folder.claim_default(model, dataset, workspace), True
    lock = RunLock(output, kind=TUNE)
    try:
        lock.acquire()     # a live tune (or run) there: OutputInUse, one line
        output_folder.check_output(output)   # under the lock: a tune may have finished here meanwhile
        doc = _tune_locked(
            model, dataset, output, workspace, wanted, memory_budget, margin, cap, time_budget,
            reference_batch_size, steps, warmup_steps, min_seconds, start, progress, stream,
            dict(task, global_batch=global_batch))
    except BaseException as exc:
        # Nothing of this tune's is in the folder: leave it as it was found.  A lock file
        # still there is another run's (it holds the folder); rmdir leaves a folder that
        # something else has written into meanwhile.
        lock.release_and_remove()
        if created and not os.path.lexists(lock.path):
            try:
                os.rmdir(output)
            except OSError:
                pass
        if isinstance(exc, SystemExit) and exc.code == EXIT_SIGTERM:
            # docker stop during the trials (sigterm_as_exit): said as Ctrl-C's line is
            # (app/cli.py), once everything is cleaned up; the status stays 143.
            sys.stderr.write("\ninterrupted (SIGTERM): tfmp tune stopped\n")
            sys.stderr.flush()
        raise
    lock.release()
    if progress:
        # The result on stdout, the progress above on stderr, as benchmark's report:
        # `tfmp tune ... > tune.txt` keeps the table.
        out = sys.stdout if stream is sys.stderr else stream
        print(report.table(doc), file=out, flush=True)
        print(f"[tune] wrote {os.path.join(output, 'tune.json')} and tune.png; train with "
              f"`tfmp train --tuned {os.path.join(output, 'tune.json')} ...`",
              file=out, flush=True)
    return doc


def _tune_locked(model, dataset, output, workspace, wanted, memory_budget, margin, cap,
                 time_budget, reference_batch_size, steps, warmup_steps, min_seconds, start,
                 progress, stream, task) -> Dict[str, Any]:
    """Steps 2-5, with the output folder locked.  ``task``: what every trial trains besides
    the model and the dataset (loss, metrics, shapes, data, seed, learning rate, jit), as
    ``tune`` checked it."""
    global_batch = task.pop("global_batch", None)
    env = collect_environment()
    hardware = env.get("hardware") or {}
    gpus = hardware.get("gpus") or []
    policies, left_out, notes = _policies_here(model, wanted, env, gpus, bool(task.get("jit")))
    budget = budget_mod.resolve_with_gpu(memory_budget, gpus, notes)
    limit = search.memory_limit(budget.bytes, margin)
    memory_kind = "gpu" if gpus else "cpu_rss"

    base_request = {
        "model": model, "dataset": dataset, **task,
        # As train: the workspace's data folder unless one is named (then it must exist).
        "data_dir": task["data_dir"] or os.path.join(workspace, "data"),
        "data_dir_explicit": task["data_dir"] is not None,
        "steps": steps, "warmup_steps": warmup_steps, "min_seconds": min_seconds,
        # Explicit budget on a GPU: the allocator is limited to it (a smaller GPU).
        "limit_gpu_bytes": budget.bytes if gpus and budget.source == "--memory-budget" else None,
    }
    workdir = tempfile.mkdtemp(prefix="tfmp-tune-")
    runner = TrialRunner(base_request, workdir, kill_above=None if gpus else budget.bytes)
    per_policy = search.max_trials(cap) + (plan_mod.MAX_PLAN_TRIALS if global_batch else 0)
    bar = Progress(len(policies) * per_policy + 1, stream, enabled=progress)
    bar.say(f"[tune] {model} / {dataset}: precisions {', '.join(policies)}; budget "
            f"{budget_mod.format_size(budget.bytes)} ({budget.source}), margin {margin:.0%}; "
            f"batch sizes 8..{cap}" + (f"; time budget {time_budget:g} s" if time_budget else ""))
    for note in notes:
        # Said before the trials too: who holds the GPU's memory (the budget is short), a
        # budget bigger than the memory there (the largest trials may run out of memory).
        if note.startswith(("GPU ", "--memory-budget ")):
            bar.say(f"[tune] note: {note}")
    started, t0 = datetime.now(timezone.utc), time.monotonic()
    deadline = t0 + time_budget if time_budget else None
    try:
        with sigterm_as_exit():
            outcome = _search_and_verify(policies, runner, bar, budget.bytes, margin, cap,
                                         start, deadline, steps, min_seconds, notes,
                                         left_out, global_batch)
    except (UsageError, KeyboardInterrupt, SystemExit):
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    except TrialFailed as exc:
        exc.log = output_folder.keep_failed_logs(
            output, workdir, exc.log, f"{exc.what} failed: {exc.line_text}",
            lambda line: bar.say(f"[tune] {line}"))
        raise
    finally:
        bar.close()
    precisions = {p: report.precision_entry(outcome.results[p], outcome.verify_trials.get(p, []))
                  for p in policies if p in outcome.results}
    final = outcome.verified
    if final.get("fits") and any(not t.fits for t in
                                 outcome.verify_trials.get(final["precision"], [])):
        # The larger sizes did not hold in the longer run: the verified size is the largest.
        # (Only where a size of that precision failed: a fall to another precision verified
        # none of that one's larger sizes.)
        entry, final = precisions[outcome.choice["precision"]], outcome.verified
        entry.update(max_batch=final["batch_size"], best_batch=final["batch_size"],
                     best_samples_per_second=outcome.choice["samples_per_second"])
    doc = {
        "schema": report.SCHEMA,
        "task": {"model": model, "dataset": dataset,
                 **{k: task[k] for k in ("loss", "metrics", "input_shape", "num_classes",
                                         "image_size", "float32_layers")}},
        "budget_bytes": budget.bytes, "budget_source": budget.source, "margin": margin,
        "limit_bytes": limit, "memory_kind": memory_kind,
        "batch_sizes": {"start": start, "cap": cap, "multiple_of": search.STEP},
        "time_budget_seconds": time_budget,
        # The batch the learning rate was set for: train --tuned --scale-lr linear scales from it.
        "reference_batch_size": reference_batch_size,
        "learning_rate": task["learning_rate"],
        "trial_settings": {"steps": steps, "warmup_steps": warmup_steps,
                           "min_seconds": min_seconds, "verify_steps": verify_steps_for(steps),
                           "speed_tie": search.SPEED_TIE},
        "precisions": precisions,
        "left_out": [{"policy": p, "reason": unprefixed(e.line())}
                     for p, e in left_out.items()],
        "speedup_vs_float32": report.speedups(precisions),
        "choice": outcome.choice,
        "verified": outcome.verified,
        "global_batch": global_batch and {"requested": global_batch, "plans": outcome.plans},
        "notes": notes,
        "hardware": hardware, "environment": {k: v for k, v in env.items() if k != "hardware"},
        "started_utc": started.isoformat(timespec="seconds"),
        "seconds": round(time.monotonic() - t0, 1),
    }
    output_folder.write_outputs(output, doc, workdir, bar.say)
    doc["output"] = output
    return doc


def _policies_here(model, wanted, env, gpus, jit: bool):
    """(the precisions to tune, in order, ``auto`` resolved; those left out, with why; the
    notes so far).  UsageError when none is left, or --jit cannot compile here."""
    auto_policy = (env.get("auto_precision") or {}).get("policy", registry.BASELINE_POLICY)
    policies: List[str] = []
    for p in (wanted or [registry.BASELINE_POLICY, "auto"]):
        p = auto_policy if p == "auto" else p
        if p not in policies:
            policies.append(p)
    notes: List[str] = []
    # Policies this TensorFlow cannot run the model's layer types under here (app.machine.kernels):
    # a built-in's kinds are known now, a user's model tells in its first trial.
    from app.machine import kernels

    left_out = {p: e for p, e in kernels.builtin_refusals(model, env).items() if p in policies}
    policies = [p for p in policies if p not in left_out]
    if not policies:
        raise next(iter(left_out.values()))
    if "mixed_float16" in policies and not gpus:
        notes.append("mixed_float16 on a CPU is very slow (no float16 kernels): its speeds "
                     "are measured, not recommended")
    xla = env.get("xla_gpu") or {}
    if jit and xla:
        # The trials would each fail inside TensorFlow's first compiled step.
        from app.machine import xla_toolchain

        refusal = xla_toolchain.jit_refusal(xla_toolchain.from_report(xla), gpus)
        if refusal:
            raise UsageError(refusal, xla_toolchain.ALLOWED)
    return policies, left_out, notes


def _search_and_verify(policies, runner, bar, budget_bytes, margin, cap, start, deadline,
                       steps, min_seconds, notes, left_out,
                       global_batch: Optional[int] = None) -> "_Outcome":
    from app.core.errors import PrecisionUnsupported

    limit = search.memory_limit(budget_bytes, margin)
    results: Dict[str, search.SearchResult] = {}
    # The header said the sizes up to --max-batch; the training set's size is known only once
    # a trial has loaded it, and when it allows less, that is said then, once.
    data_told = {"said": False}
    for policy in policies:
        fitted = {"any": False}

        def run_trial(batch, policy=policy, fitted=fitted):
            bar.start(policy, batch)
            outcome = runner(policy, batch, any_fit=fitted["any"])
            if outcome.data_limit is not None and not data_told["said"]:
                allowed = search.updates_limit(outcome.data_limit)
                if allowed < search.round_down(cap):
                    data_told["said"] = True
                    bar.say(f"[tune] {data_limit_line(outcome.data_limit, allowed)}")
            return outcome

        def seen(trial, policy=policy, fitted=fitted):
            fitted["any"] = fitted["any"] or trial.fits
            bar.finish(policy, trial)

        try:
            results[policy] = search.find_max_batch(
                run_trial, budget_bytes=budget_bytes, margin=margin, cap=cap, start=start,
                deadline=deadline, on_trial=seen)
        except PolicyLeftOut as exc:
            # The first trial built the model: this TensorFlow cannot run its layer types
            # under the policy here.  The other policies go on.
            bar.say(f"[tune] {policy} left out: {exc.reason}")
            left_out[policy] = PrecisionUnsupported(policy, exc.reason, None)
            continue
        r = results[policy]
        if r.stopped == "time":
            notes.append(f"{policy}: the time budget ended the search"
                         + (f" with {r.max_batch} as the largest size that fitted"
                            if r.max_batch else " before any size fitted"))
        elif r.stopped == "cap":
            notes.append(f"{policy}: the cap {r.cap} fits; a larger --max-batch may fit too")
        elif r.stopped == "data":
            notes.append(data_note(policy, r.train_samples, r.cap))
    if not results:
        raise next(iter(left_out.values()))
    if all(r.max_batch is None for r in results.values()):
        tried = [(p, r.smallest_tried()) for p, r in results.items() if r.trials]
        if not tried:
            raise NothingFits("the time budget ended before any trial ran",
                              "a longer --time-budget")
        p, t = min(tried, key=lambda pt: pt[1].batch_size)
        peak = budget_mod.format_size(t.peak_memory_bytes) if t.peak_memory_bytes else "unknown"
        raise NothingFits(f"no batch size fits: the smallest tried, {t.batch_size} under {p}, "
                          f"peaked at {peak} ({t.reason}); the budget less the margin is "
                          f"{budget_mod.format_size(limit)}",
                          "a larger --memory-budget, a smaller --margin, or a smaller model")
    for p, r in results.items():
        if r.max_batch is None:
            notes.append(f"{p}: no size fitted")
    best = {p: r.best() for p, r in results.items()}
    out = _Outcome(results)
    if global_batch is not None:
        policy, by_policy = plan_mod.measure(results, runner, bar, limit, global_batch,
                                             out.plans, notes)
    else:
        policy, _ = search.choose(best)
        by_policy = {p: _sizes_that_fit(results[p], t) for p, t in best.items() if t}
    _verify(_step_downs(policy, by_policy), runner, bar, limit, verify_steps_for(steps), out,
            notes, planned=global_batch is not None)
    return out


def _sizes_that_fit(result: search.SearchResult, top: search.Trial) -> list:
    """(batch, 1, samples/s) in search.step_down_order."""
    return [(t.batch_size, 1, t.samples_per_second)
            for t in search.step_down_order(result.trials, top)]


def _step_downs(chosen: str, by_policy: dict) -> list:
    """What the verification tries, in turn, as (policy, batch, N, samples/s): the chosen
    precision's sizes, then each other precision's, the faster first.  A choice whose
    verification went over the budget at every size of its precision falls to another that
    fitted (a float32 search at the budget's edge, where mixed_bfloat16 had room), not to
    "no size held"."""
    others = sorted((p for p in by_policy if p != chosen and by_policy[p]),
                    key=lambda p: -by_policy[p][0][2])
    return [(p, *size) for p in [chosen, *others] for size in by_policy.get(p, [])]


def data_note(policy: str, train_samples: int, cap: int) -> str:
    """What a search the training set stopped says: the batch it allows, and, where even the
    smallest size tried leaves an epoch fewer updates than wanted, that too."""
    return f"{policy}: {data_limit_line(train_samples, cap)}"


def data_limit_line(train_samples: int, cap: int) -> str:
    said = f"the training set ({train_samples:,} samples) limits the batch to {cap}"
    updates = train_samples // cap if cap else 0
    if updates >= search.MIN_UPDATES_PER_EPOCH:
        return f"{said}, so that an epoch is at least {search.MIN_UPDATES_PER_EPOCH} updates"
    return (f"{said}, the smallest size tried, so an epoch is {updates} update(s) where "
            f"{search.MIN_UPDATES_PER_EPOCH} are wanted: more training samples give the "
            "search room")


def _verify(candidates, runner, bar, limit, verify_steps, out, notes,
            planned: bool = False) -> None:
    """Verify the candidates ((policy, batch, accumulate, searched samples/s), the choice
    first) in a real ``tfmp train``, one after another until one holds (at most
    MAX_STEP_DOWNS after the first)."""
    why = ("the fastest precision and micro-batch for the global batch" if planned
           else "the fastest precision at its own fastest batch size")
    first_policy, first_batch = candidates[0][0], candidates[0][1]
    for policy, batch, n, searched_sps in candidates[:MAX_STEP_DOWNS + 1]:
        bar.start(policy, batch, phase="verify")
        kw = {"accumulate": n} if n > 1 else {}
        outcome = runner.verify(policy, batch, steps=verify_steps, **kw)
        v = search.judge(batch, outcome, limit)
        ran = getattr(outcome, "ran", None) or {}
        v.phase = "verify"
        out.verify_trials.setdefault(policy, []).append(v)
        bar.finish(policy, v)
        if v.fits:
            extra = {"accumulate": n, "global_batch": batch * n} if planned else {}
            out.verified = {"fits": True, "precision": policy, "batch_size": batch,
                            "steps": verify_steps, **ran,
                            "peak_memory_bytes": v.peak_memory_bytes,
                            "samples_per_second": v.samples_per_second,
                            "stepped_down_from": first_batch if out.stepped_down else None,
                            **({"stepped_down_from_precision": first_policy}
                               if out.stepped_down and policy != first_policy else {}),
                            **extra}
            out.choice = {"precision": policy, "batch_size": batch,
                          "samples_per_second": searched_sps, **extra, "reason": why + (
                              " (stepped down in verification)" if out.stepped_down else "")}
            if out.stepped_down:
                bar.say(f"[tune] stepped down to {policy} at batch {batch}: the larger size "
                        "went over the budget in the longer verification run"
                        + (f" (every {first_policy} size that fitted did)"
                           if policy != first_policy else ""))
            return
        out.stepped_down = True
        what = report.ran_words(verify_steps, ran) if ran or n == 1 else (
            f"a run of {verification_batches(verify_steps, n)} micro-batches in groups of {n}")
        notes.append(f"verification: {policy} at batch {batch}"
                     + (f" x {n} accumulated" if n > 1 else "")
                     + f" did not hold over {what} ({v.reason}); stepping down")
    out.verified = {"fits": False, "precision": first_policy, "batch_size": None,
                    "reason": "no size passed verification"}


class _Outcome:
    """What the searches and the verification found."""

    def __init__(self, results: Dict[str, search.SearchResult]):
        self.results = results
        self.verify_trials: Dict[str, List[search.Trial]] = {}
        self.verified: Dict[str, Any] = {}
        self.choice: Optional[Dict[str, Any]] = None
        self.stepped_down = False
        self.plans: Dict[str, Any] = {}     # --global-batch: app.tuner.plan.entry per policy
