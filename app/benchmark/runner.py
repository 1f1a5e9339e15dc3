"""Run ``tfmp train`` once per (repeat, policy), each in a fresh process.

A fresh process per run means a policy's peak memory (GPU allocator peak, or the resident
memory of the CPU process) is its own: nothing allocated by an earlier run is still held,
and nothing compiled by an earlier run is reused.  This parent process never imports
TensorFlow, so it holds no GPU memory either.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from app.core import settings as settings_table
from app.benchmark import stats
from app.core.exit_codes import EXIT_FAILED, EXIT_USAGE  # train rejected its input
from app.core import launch
from app.core.errors import USER_CODE_RAISED, unprefixed
from app.core.launch import ChildFailed, environment_report, log_tail, module_command, sigterm_as_exit
from app.core.files import utc_now_iso
from app.core.progress import Bar

# Flags of ``tfmp train`` that the benchmark passes through unchanged when set (the
# ``passed`` column of app.core.settings): (setting, flag) pairs, values and switches apart.
PASS_THROUGH = tuple((s.name, s.flag) for s in settings_table.PASSED if not s.switch)
BOOL_PASS_THROUGH = tuple((s.name, s.flag) for s in settings_table.PASSED if s.switch)
# Always: no model file (its saving time and disk are not what is measured), and plain
# progress lines in the run's log instead of a progress bar.
FIXED_FLAGS = ("--no-save-model", "--progress", "lines")
# benchmark --profile: the steps of its short profiled run per policy (after the first two,
# which trace and compile).
PROFILE_STEPS = "3-5"



class TrainRejectedInput(Exception):
    """A run exited with status 2: the settings are wrong (e.g. dataset files missing offline).

    Every other run would fail the same way, so the benchmark stops at once.
    """

    def __init__(self, line: str):
        self.line = line
        super().__init__(line)


class TrainCodeFailed(Exception):
    """A run's own code raised (the user's model, dataset or loss function, as train says:
    ``your code raised ...``, exit status 1).  Every other run would raise it too, so the
    benchmark stops at once and shows it; ``log``: the run's log, which holds the traceback."""

    def __init__(self, line: str, log: str):
        self.line, self.log = line, log
        super().__init__(line)


def _stop_on_users_code(rc: int, log_path: str) -> None:
    """Raise TrainCodeFailed when a child ended on the user's code raising."""
    line = _error_line(log_path) if rc == EXIT_FAILED else ""
    if line.startswith(USER_CODE_RAISED):
        raise TrainCodeFailed(line, log_path)


# (cmd, log_path, timeout_seconds, env) -> return code
Launcher = Callable[[List[str], str, Optional[float], Mapping[str, str]], int]


def _setting_flags(settings: Mapping[str, Any]) -> List[str]:
    return settings_table.passed_flags(dict(settings))


def train_command(settings: Mapping[str, Any], policy: str, run_dir: str,
                  extra_flags: Sequence[str] = ()) -> List[str]:
    """The exact ``tfmp train`` command line of one run."""
    cmd = module_command("app", "train", "--precision", policy, "--output", run_dir)
    return cmd + _setting_flags(settings) + list(FIXED_FLAGS) + list(extra_flags)


def input_rate_command(settings: Mapping[str, Any], warmup_epochs: int,
                       check_dir: str) -> List[str]:
    """``python -m app.benchmark.input_rate``: the runs' data settings, no model."""
    return (module_command("app.benchmark.input_rate", "--output", check_dir,
                           "--warmup-epochs", str(warmup_epochs)) + _setting_flags(settings))


def subprocess_launcher(cmd: List[str], log_path: str, timeout: Optional[float],
                        env: Mapping[str, str]) -> int:
    with open(log_path, "w", encoding="utf-8") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(env))
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            return -9
        except BaseException:
            # Ctrl-C in the parent: do not leave a training process behind.
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
            raise


def child_env(base: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    # Every run is a fresh one into its own folder, whatever the user's shell says, and
    # trains exactly the precision and batch size it is given (no tune.json), with the
    # float32 of --fp32-baseline (TF32 as given per run) and no profile it was not given.
    return launch.child_env(base, without=("resume", "tuned", "scale_lr", "tf32",
                                           "profile_steps"))


def _load_average() -> Optional[float]:
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def _error_line(path: str) -> str:
    """The trainer's one-line ``error: ...`` message from a run's log, without the prefix."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            lines = [ln.strip() for ln in fh if ln.startswith("error:")]
    except OSError:
        return ""
    return unprefixed(lines[-1]) if lines else ""


def read_metrics(run_dir: str) -> Tuple[Optional[Dict[str, Any]], Optional[str]]:
    """(a run's metrics.json, None), (None, None) if it wrote none, or (None, why unreadable)."""
    path = os.path.join(run_dir, "metrics.json")
    if not os.path.exists(path):
        return None, None
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh), None
    except (OSError, ValueError) as exc:
        return None, f"metrics.json unreadable: {exc}"


def metrics_summary(m: Mapping[str, Any]) -> Dict[str, Any]:
    """The few facts of a run's metrics.json that the report keeps beside the run."""
    data = m.get("data") if isinstance(m.get("data"), Mapping) else {}
    cfg = m.get("config") if isinstance(m.get("config"), Mapping) else {}
    return {
        "status": m.get("status"),
        "train_samples": m.get("train_samples") or data.get("train_samples"),
        "val_samples": m.get("val_samples") or data.get("val_samples"),
        "steps_per_execution": cfg.get("steps_per_execution"),
        "jit": cfg.get("jit"),
    }


def used_policy(metrics: Mapping[str, Any]) -> Optional[str]:
    """The policy a run actually trained with, as its metrics.json records it."""
    prec = metrics.get("precision")
    if isinstance(prec, Mapping):
        return prec.get("policy")
    if isinstance(prec, str):
        return prec
    cfg = metrics.get("config") or {}
    return cfg.get("precision")


def run_schedule(schedule: Sequence[Mapping[str, Any]], settings: Mapping[str, Any],
                 runs_dir: str, warmup_epochs: int, *,
                 launcher: Launcher = subprocess_launcher,
                 timeout: Optional[float] = None,
                 extra_flags: Sequence[str] = (),
                 progress: Optional[Callable[[str], None]] = None,
                 left_out: Optional[Dict[str, str]] = None,
                 ) -> List[Dict[str, Any]]:
    """Run every entry of ``schedule`` in order; one record per run, failures included.

    A run that ``train`` refuses because this TensorFlow cannot run the model's layer types
    under its policy here (``app.machine.kernels``) leaves that policy out: its reason goes into
    ``left_out`` (policy -> reason), its later runs are not started, and no record is kept."""
    with sigterm_as_exit():
        return _run_schedule(schedule, settings, runs_dir, warmup_epochs, launcher, timeout,
                             extra_flags, progress,
                             left_out if left_out is not None else {})


def _run_schedule(schedule, settings, runs_dir, warmup_epochs, launcher, timeout, extra_flags,
                  progress, left_out) -> List[Dict[str, Any]]:
    from app.machine import kernels

    env = child_env()
    records: List[Dict[str, Any]] = []
    total = len(schedule)
    # tqdm: a bar on a terminal, a widget in a notebook, the lines alone in a log.
    bar = Bar(total, "run", sys.stderr, enabled=progress is None, desc="benchmark")
    say = progress or bar.line
    for entry in schedule:
        policy, repeat, order = entry["policy"], entry["repeat"], entry["order"]
        if policy in left_out:
            bar.advance()
            continue
        # An entry with its own batch size: a policy at its best batch (benchmark --tuned).
        batch = entry.get("batch_size")
        run_settings = dict(settings, batch_size=batch) if batch else settings
        series = entry.get("series", "equal_batch")
        flags = list(extra_flags)
        if entry.get("tf32"):
            flags += ["--tf32", entry["tf32"]]       # --fp32-baseline strict|both
        if series == "profile":   # one short untimed run with a profile (benchmark --profile)
            run_settings = dict(run_settings, epochs=1)
            flags += ["--profile-steps", PROFILE_STEPS]
        tag = {"fp32_strict": "-strict", "profile": "-profile"}.get(series, "")
        run_dir = os.path.join(runs_dir, f"{order:02d}-{policy}-r{repeat}"
                               + (f"-b{batch}" if batch else "") + tag)
        os.makedirs(run_dir, exist_ok=True)
        log_path = os.path.join(run_dir, "train.log")
        cmd = train_command(run_settings, policy, run_dir, flags)
        bar.label(f"{policy} #{repeat}")
        say(f"[benchmark] run {order + 1}/{total}: {policy}, repeat {repeat}"
            + (f", its best batch {batch}" if batch else "")
            + {"fp32_strict": ", strict float32 (TF32 off)",
               "profile": f", profile of steps {PROFILE_STEPS} (not timed)"}.get(series, "")
            + " ...")
        started = utc_now_iso()
        load_before = _load_average()
        t0 = time.monotonic()
        rc = launcher(cmd, log_path, timeout, env)
        wall = time.monotonic() - t0
        rec: Dict[str, Any] = {
            "order": order, "repeat": repeat, "policy": policy,
            "started_utc": started,
            "wall_seconds": round(wall, 3), "returncode": rc,
            # 1-minute load average before and after: other work competing for the CPUs.
            "load_average": [load_before, _load_average()],
            "command": cmd, "output_dir": run_dir, "log": log_path,
            "ok": False, "error": None, "measured": None, "policy_used": None,
            "batch_size": run_settings.get("batch_size"),
            "series": series,
            "tf32": None,
        }
        _stop_on_users_code(rc, log_path)
        metrics, rec["error"] = read_metrics(run_dir)
        rec["metrics_summary"] = metrics_summary(metrics or {})
        if metrics is not None:
            rec["policy_used"] = used_policy(metrics)
            rec["metrics_status"] = metrics.get("status")
            rec["measured"] = stats.measure_run(metrics, warmup_epochs)
            rec["tf32"] = ((metrics.get("environment") or {}).get("tf32") or {}).get("on")
        if rc == EXIT_USAGE:
            line = _error_line(log_path)
            if kernels.refused_policy(line) == policy:
                left_out[policy] = line
                say(f"[benchmark]   left out: {left_out[policy]}")
                bar.advance()
                continue
            raise TrainRejectedInput(line or "train rejected its arguments")
        if rc == -9:
            rec["error"] = f"timed out after {timeout:g} s"
        elif rc != 0:
            rec["error"] = rec["error"] or log_tail(log_path, 1) or f"exit status {rc}"
        elif metrics is None:
            rec["error"] = rec["error"] or "no metrics.json written"
        elif rec["policy_used"] not in (None, policy):
            rec["error"] = f"train used {rec['policy_used']} instead of {policy}"
        elif rec["measured"]["epochs_timed"] < 1:
            rec["error"] = "no epoch left after warm-up"
        else:
            rec["ok"] = True
        if rec["ok"]:
            m = rec["measured"]
            sps = m["samples_per_second"]
            say(f"[benchmark]   {wall:.1f} s wall, "
                     f"{m['seconds_per_epoch'] or float('nan'):.3g} s/epoch, "
                     f"{stats.rate_text(sps)} samples/s")
        else:
            say(f"[benchmark]   FAILED: {rec['error']}")
        records.append(rec)
        bar.advance()
    bar.close()
    return records


def collect_environment(timeout: float = 300.0) -> Dict[str, Any]:
    """``tfmp env --json`` from a child; ``{"error": ...}`` in benchmark.json when it failed."""
    try:
        return environment_report(timeout)
    except ChildFailed as exc:
        return {"error": str(exc)}


def measure_input_rate(settings: Mapping[str, Any], warmup_epochs: int, output: str, *,
                       launcher: Launcher = subprocess_launcher,
                       timeout: Optional[float] = None,
                       progress: Callable[[str], None] = lambda s: print(s, file=sys.stderr,
                                                                         flush=True),
                       log_name: str = "input_pipeline.log",
                       why: str = "same batches, no model",
                       ) -> Dict[str, Any]:
    """The input pipeline's own rate, from a child process (this one never imports TF).

    Returns its JSON report plus ``command`` and ``log`` (``output``/``log_name``), or
    ``{"error": ...}`` when it failed; raises TrainRejectedInput on exit status 2 (the
    settings are wrong)."""
    log_path = os.path.join(output, log_name)
    # Never created: the child checks the path as train checks --output, and writes nothing.
    cmd = input_rate_command(settings, warmup_epochs, os.path.join(output, "input_pipeline"))
    progress(f"[benchmark] input pipeline alone ({why}) ...")
    with sigterm_as_exit():
        rc = launcher(cmd, log_path, timeout, child_env())
    if rc == EXIT_USAGE:
        raise TrainRejectedInput(_error_line(log_path) or "the settings were rejected")
    _stop_on_users_code(rc, log_path)
    report: Optional[Dict[str, Any]] = None
    try:
        with open(log_path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("{"):
                    report = json.loads(line)
    except (OSError, ValueError):
        report = None
    if rc != 0 or not isinstance(report, dict):
        why = "timed out" if rc == -9 else (log_tail(log_path, 1) or f"exit status {rc}")
        progress(f"[benchmark]   input pipeline not measured: {why}")
        return {"error": why, "samples_per_second": None, "command": cmd, "log": log_path}
    sps = report.get("samples_per_second")
    progress(f"[benchmark]   {stats.rate_text(sps)} samples/s")
    return dict(report, command=cmd, log=log_path)
