"""Running trials as child processes, and reading how they ended.

The parent (this process) never imports TensorFlow: it holds no GPU memory and its own
resident memory stays small, so a trial's peak is the trial's alone.

Children start through ``app.core.launch`` (the one launcher of this package's own processes):
a user's own ``app.py`` or ``app/`` folder in the current directory cannot stand in for
this package.  The user's ``MODULE:FUNCTION`` specs still import from the current directory
(``app.task.user_code`` adds it when it loads them, after this package is imported).

On a CPU the child runs under the budget: a watchdog thread reads the child's resident
memory (``/proc/<pid>/status``) every few milliseconds and kills it past the budget; the
kernel's OOM killer (a container limit) ends it the same way.  Either death is a size
that does not fit, never a crash of the tuner.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from app.core.errors import UsageError, unprefixed
from app.core.exit_codes import EXIT_FAILED
from app.core.launch import ChildFailed, child_env, environment_report, log_tail, module_command
from app.tuner.search import Outcome

WATCH_SECONDS = 0.01
DEFAULT_TRIAL_TIMEOUT = 900.0


class PolicyLeftOut(Exception):
    """This TensorFlow cannot run the model's layer types under the trial's policy here
    (``app.machine.kernels``): the tune leaves the policy out, with ``reason``, and goes on."""

    def __init__(self, reason: str):
        self.reason = unprefixed(reason)
        super().__init__(self.reason)


class TrialFailed(Exception):
    """A trial failed for a reason that is not memory (the user's code raised, say)."""

    def __init__(self, line: str, log: str, what: str = "a trial"):
        self.line_text, self.log, self.what = unprefixed(line), log, what
        super().__init__(line)

    def line(self) -> str:
        return f"error: {self.what} failed: {self.line_text} (log: {self.log})"


def child_command(module: str, args: List[str]) -> List[str]:
    """``python -m <module> <args>`` with this package's ``app`` (``app.core.launch``)."""
    return module_command(module, *args)


def rss_bytes(pid: int) -> Optional[int]:
    """Resident memory of a process now (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


class _Watchdog(threading.Thread):
    """Kills the child once its resident memory passes ``limit_bytes``."""

    def __init__(self, proc: subprocess.Popen, limit_bytes: int):
        super().__init__(name="tfmp-tune-watchdog", daemon=True)
        self.proc, self.limit = proc, limit_bytes
        self.highest = 0
        self.killed = False
        self.done = threading.Event()

    def run(self):
        while not self.done.is_set() and self.proc.poll() is None:
            rss = rss_bytes(self.proc.pid)
            if rss is not None:
                self.highest = max(self.highest, rss)
                if rss > self.limit:
                    self.killed = True
                    try:
                        os.kill(self.proc.pid, signal.SIGKILL)
                    except OSError:
                        pass
                    return
            self.done.wait(WATCH_SECONDS)


@dataclass
class ChildEnd:
    returncode: int
    result: Optional[Dict[str, Any]]
    watchdog_killed: bool
    highest_rss: int
    seconds: float
    log: str
    timed_out: bool = False


def run_child(module: str, args: List[str], log_path: str, *, kill_above: Optional[int],
              timeout: Optional[float], result_path: str,
              env: Optional[Dict[str, str]] = None) -> ChildEnd:
    """Run ``module.main(args)``; its output goes to ``log_path``."""
    cmd = child_command(module, args)
    t0 = time.monotonic()
    with open(log_path, "w", encoding="utf-8") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                env=env or child_env())
        dog = _Watchdog(proc, kill_above) if kill_above else None
        if dog:
            dog.start()
        timed_out = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            proc.kill()
            proc.wait()
        except BaseException:
            # Ctrl-C or SIGTERM in the parent: no trial is left behind.
            proc.kill()
            proc.wait()
            raise
        finally:
            if dog:
                dog.done.set()
                dog.join()
    result = None
    try:
        with open(result_path, encoding="utf-8") as fh:
            result = json.load(fh)
    except (OSError, ValueError):
        result = None
    return ChildEnd(proc.returncode, result, bool(dog and dog.killed),
                    dog.highest if dog else 0, time.monotonic() - t0, log_path, timed_out)


def _died_of(end: ChildEnd, kill_above: Optional[int]) -> str:
    rc = end.returncode
    if end.watchdog_killed:
        return (f"resident memory passed the budget ({kill_above / 2**20:,.0f} MiB); "
                "the tuner stopped the trial")
    if end.timed_out:
        return "timed out"
    if rc < 0:
        name = signal.Signals(-rc).name if -rc in signal.Signals._value2member_map_ else str(-rc)
        if -rc == signal.SIGKILL:
            return "killed by SIGKILL (the kernel's out-of-memory killer)"
        return f"died of {name}" + (" (an allocation failed)" if -rc == signal.SIGABRT else "")
    return f"exit status {rc} without a result"



def outcome_of(end: ChildEnd, kill_above: Optional[int], any_fit: bool) -> Outcome:
    """How a trial ended, as the search sees it.  Raises UsageError (the specs are wrong:
    every size would fail), PolicyLeftOut (the policy cannot run the model here) and
    TrialFailed (a non-memory failure before anything fitted)."""
    r = end.result or {}
    status = r.get("status")
    seconds = round(end.seconds, 2)
    if status == "unsupported":
        raise PolicyLeftOut(r.get("reason") or "the policy cannot run this model here")
    if status == "usage":
        line = r.get("reason") or "the trial rejected its input"
        raise UsageError(unprefixed(line))
    if status == "ok" and end.returncode == 0:
        return Outcome(True, r.get("peak_memory_bytes"), r.get("samples_per_second"), "",
                       seconds, r.get("train_samples"))
    if status == "data":
        return Outcome(False, None, None, r.get("reason", "too few samples"), seconds,
                       r.get("train_samples"))
    if status == "oom":
        return Outcome(False, r.get("peak_memory_bytes") or end.highest_rss or None, None,
                       r.get("reason", "out of memory"), seconds)
    if status == "error" or (end.returncode == EXIT_FAILED and not end.watchdog_killed):
        line = r.get("reason") or log_tail(end.log, 3) or "failed"
        if not any_fit:
            raise TrialFailed(line, end.log)
        return Outcome(False, None, None, f"failed: {line}", seconds)
    # Killed (watchdog, OOM killer, abort) or timed out: it did not fit.
    return Outcome(False, end.highest_rss or None, None, _died_of(end, kill_above), seconds)


class TrialRunner:
    """Runs trials for one tune: a folder for logs and results, the request template."""

    def __init__(self, base_request: Dict[str, Any], workdir: str, *,
                 kill_above: Optional[int], timeout: float = DEFAULT_TRIAL_TIMEOUT):
        self.base, self.workdir, self.kill_above, self.timeout = (base_request, workdir,
                                                                  kill_above, timeout)
        self.count = 0

    def __call__(self, policy: str, batch_size: int, any_fit: bool, phase: str = "search",
                 **overrides) -> Outcome:
        self.count += 1
        name = f"{self.count:02d}-{policy}-b{batch_size}" + ("-verify" if phase == "verify" else "")
        log = os.path.join(self.workdir, name + ".log")
        result = os.path.join(self.workdir, name + ".json")
        req = dict(self.base, policy=policy, batch_size=batch_size, **overrides)
        end = run_child("app.tuner.trial", ["--request", json.dumps(req), "--result", result],
                        log, kill_above=self.kill_above, timeout=self.timeout,
                        result_path=result)
        return outcome_of(end, self.kill_above, any_fit)

    def verify(self, policy: str, batch_size: int, steps: int, accumulate: int = 1) -> Outcome:
        """The choice trained by a real ``tfmp train`` in a fresh process (see
        ``verification_command``), under the same watchdog as the trials."""
        self.count += 1
        name = f"{self.count:02d}-{policy}-b{batch_size}-verify"
        output = os.path.join(self.workdir, name)
        req = dict(self.base, policy=policy, batch_size=batch_size, steps=steps,
                   accumulate=accumulate)
        end = run_child("app", verification_command(req, output),
                        os.path.join(self.workdir, name + ".log"), kill_above=self.kill_above,
                        timeout=self.timeout, result_path=os.path.join(output, "metrics.json"),
                        env=verification_env())
        return verification_outcome(end, self.kill_above)


# Besides the settings' TFMP_ variables, these make a `tfmp train` run something other than
# its flags say: TF_CONFIG a multi-worker job, TFMP_LOGICAL_CPUS a split CPU.
_JOB_VARIABLES = ("TF_CONFIG", "TFMP_LOGICAL_CPUS")


def verification_env(base: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """The verification's environment: no training setting inherited (every ``app.core.settings``
    variable removed, and TF_CONFIG), so it trains exactly what its flags, the trials'
    settings, say; anything else (PATH, CUDA's and TensorFlow's variables) as for a trial."""
    from app.core.settings import SETTINGS

    env = child_env(base, without=[s.name for s in SETTINGS])
    for name in _JOB_VARIABLES:
        env.pop(name, None)
    return env


def verification_batches(steps: int, accumulate: int = 1) -> int:
    """The whole batches a verification of ``steps`` steps trains (before its short last
    one): under accumulation at least two whole groups of ``accumulate``."""
    return max(steps, 2 * accumulate) if accumulate > 1 else steps


def verification_command(req: Dict[str, Any], output: str) -> List[str]:
    """``tfmp train`` arguments for one epoch of ``steps`` batches: the run a user will make
    with ``--tuned``, so its peak (Keras fit or the custom loop, validation, the recorder,
    checkpoints) is what a trial's bare training steps leave out."""
    batch, n = int(req["batch_size"]), int(req.get("accumulate") or 1)
    steps = verification_batches(int(req["steps"]), n)
    # A short last batch, as most real epochs end with: the step is traced again for that
    # shape, and that graph's buffers are part of a real run's peak.
    samples = batch * steps + max(batch // 2, 1)
    if req.get("max_train_samples"):
        samples = min(samples, int(req["max_train_samples"]))
    args = ["train", "--model", req["model"], "--dataset", req["dataset"],
            "--precision", req["policy"], "--batch-size", str(batch), "--epochs", "1",
            "--max-train-samples", str(samples), "--max-val-samples", str(batch + max(batch // 2, 1)),
            "--seed", str(req.get("seed") or 0),
            "--learning-rate", str(req.get("learning_rate") or 1e-3),
            "--image-size", str(req.get("image_size") or 32),
            # One device, as the trials train: never a mirrored or multi-worker job.
            "--strategy", "one",
            "--no-save-model", "--progress", "lines", "--log-every", "1000000",
            "--output", output]
    for key, flag in (("loss", "--loss"), ("metrics", "--metrics"),
                      ("input_shape", "--input-shape"), ("num_classes", "--num-classes"),
                      ("image_dir", "--image-dir"), ("float32_layers", "--float32-layers")):
        if req.get(key) is not None:
            args += [flag, str(req[key])]
    if req.get("data_dir_explicit"):
        args += ["--data-dir", req["data_dir"]]
    elif req.get("data_dir"):
        args += ["--workspace", os.path.dirname(req["data_dir"])]
    if req.get("offline"):
        args.append("--offline")
    if req.get("jit"):
        args.append("--jit")
    if n > 1:
        args += ["--accumulate", str(n)]
    return args


# What a train that ran out of memory says (TensorFlow's allocator, Python, the C++ runtime).
_OOM_WORDS = ("resourceexhaustederror", "out of memory", "memoryerror", "bad_alloc", "oom when")


def verification_ran(metrics: Dict[str, Any]) -> Optional[Dict[str, int]]:
    """What a verification run trained, from its metrics.json: ``samples``, ``micro_batches``
    (batches of ``--batch-size``, the short last one included) and ``updates`` (the
    optimizer's steps: under ``--accumulate N`` one a group of N, the epoch's last group
    perhaps short).  None when the metrics do not say."""
    samples = (metrics.get("data") or {}).get("train_samples")
    batch = (metrics.get("config") or {}).get("batch_size")
    updates = (metrics.get("epochs") or [{}])[-1].get("steps")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0
               for v in (samples, batch, updates)):
        return None
    return {"samples": samples, "micro_batches": -(-samples // batch), "updates": updates}


def verification_outcome(end: ChildEnd, kill_above: Optional[int]) -> Outcome:
    """A verification run as the search's Outcome: completed only when ``train`` did.  Killed
    (watchdog, OOM killer), timed out or out of memory: the size did not fit.  Any other
    failure raises ``TrialFailed`` with the child's last log lines: a size that does not fit
    is not the question there, and stepping down would only repeat it."""
    metrics = end.result or {}
    seconds = round(end.seconds, 2)
    if end.returncode == 0 and metrics.get("status") == "completed":
        peak = (metrics.get("peak_memory") or {}).get("bytes")
        epochs = metrics.get("epochs") or [{}]
        return Outcome(True, peak, epochs[-1].get("samples_per_second"), "", seconds,
                       ran=verification_ran(metrics))
    if end.watchdog_killed or end.timed_out or end.returncode < 0:
        return Outcome(False, end.highest_rss or None, None, _died_of(end, kill_above), seconds)
    said = metrics.get("diagnosis") or ""
    tail = log_tail(end.log, 3)
    if any(w in (said + " " + tail).lower() for w in _OOM_WORDS):
        return Outcome(False, end.highest_rss or None, None,
                       f"out of memory in tfmp train ({(said or tail)[:200]})", seconds)
    raise TrialFailed(f"exit status {end.returncode}: {tail or said or 'no output'}", end.log,
                      what="the verification run (tfmp train)")


def collect_environment(timeout: float = 300.0) -> Dict[str, Any]:
    """``tfmp env --json`` from a child; a failure ends the tune (``TrialFailed``)."""
    try:
        return environment_report(timeout)
    except ChildFailed as exc:
        raise TrialFailed(str(exc), "-") from None
