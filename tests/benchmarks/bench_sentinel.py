"""What does the numerics sentinel cost per step, and how long does its diagnosis take?

Step cost: for each built-in model, loop and policy asked for, ``tfmp train`` set-ups are
built through the seams ``train`` uses (``app.training.job.prepare``/``build_parts``/
``make_monitor``): the sentinel on (the default) and off (``--no-sentinel``), each in
``--copies`` processes of its own, on the same batches.  Each round, every process takes a
block of ``--block`` training steps in turn (shuffled; the fit loop through Keras' own
``train_function``, the custom loop through its step and the monitor's tick); the cost is
the median over the rounds of (on / off - 1), from wall time.  ``interleave.py`` says why
processes and blocks: in one process, the set-up built first ran 4-7% faster, and an
in-process comparison credited that to whichever side it built first.  ``--control`` adds
a second 'off' side: its A/A difference is the noise floor of the figures.  Each
configuration also prints its cost copy by copy (copy i of 'on' against copy i of 'off',
and of the A/A control): their spread is what a process's placement gives it, on a shared
2-core machine several percent either way, so raise ``--copies`` before reading a figure
near the target.  Target: at most 3%; the exit status is 1 when a configuration misses it,
and the verdict says whether its copies' mean is over the target by more than two standard
errors or cannot be told apart from it.

Diagnosis time: each built-in model under mixed_float16 gets a batch whose inputs are 1e6
(its first layers overflow float16), and the sentinel's replay (``app.numerics.replay``:
forward and backward under the policy, then in float32) is timed.  Target: under 30 s.

    python3 tests/benchmarks/bench_sentinel.py --control
    python3 tests/benchmarks/bench_sentinel.py --models mlp --loops fit --policies float32 --rounds 120
    git worktree add /tmp/base HEAD~1 && python3 tests/benchmarks/bench_sentinel.py \
        --models mlp --loops custom --policies float32 --copies 6 --against /tmp/base

``--jit`` compiles every side's step with XLA, as ``tfmp train --jit`` does (the guard's
``tf.cond`` then compiles with the step, as ``select``s after a copy of each optimizer slot:
docs/numerics.md, "Under XLA"); such runs pool apart from the runs without it.

``--pool JSON...`` times nothing: it pools the process pairs of earlier runs' JSON files
per configuration (the figure is then the median of the pairs), which is what a cost near
the target needs; runs made with ``--against`` also give that side's difference from 'on',
copy by copy, pooled (a change to the guard is adopted on that, never on one run).

``--against DIR`` adds a side running the sentinel of another checkout: a change to the
guard measured against the version before it, in the same rounds (one run is not a
verdict: the one-test bound of 2026-12-04 was within the noise in one run and 2 points
slower pooled over five).

Prints a table and writes bench_sentinel.json into --output (default a temp folder).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: paths.py
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # interleave.py beside it
from paths import root_on_path  # noqa: E402  the repository root (tests/paths.py)
import interleave  # noqa: E402
from train_setup import TrainSetup  # noqa: E402
ROOT = str(root_on_path())  # this checkout's app

TARGET = 0.03
DIAGNOSIS_TARGET_SECONDS = 30.0


class Side(TrainSetup):
    """The sentinel on or off (``--no-sentinel``); what is timed is one training step."""

    def __init__(self, model, loop, policy, sentinel: bool, args, work: str):
        from app.training.config import TrainConfig

        super().__init__(TrainConfig(
            model=model, dataset="synthetic", precision=policy, loop=loop, epochs=1,
            batch_size=args.batch_size, max_train_samples=args.samples, max_val_samples=64,
            offline=True, progress="bar", save_model=False, sentinel=sentinel, jit=args.jit,
            log_every=args.log_every, numerics_every=args.numerics_every,
            output=os.path.join(work, f"{'on' if sentinel else 'off'}")))

    def report(self) -> dict:
        watch = self.monitor.watch
        return {"probe_seconds": watch.probe_seconds if watch else None}

    def unit(self):
        self.steps(1)


def built_side(model, loop, policy, sentinel: bool, args, work: str, tree: str = ROOT) -> Side:
    """One side in its own process (``interleave``), warmed up: every trace made, and the
    sentinel's layer probe traced once (it is not what is timed).  ``tree``: the checkout
    whose ``app`` it runs (``--against``: another version of the code)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if "app" in sys.modules and tree != ROOT:
        raise SystemExit(f"this process imported app before it could take it from {tree}")
    sys.path.insert(0, tree)
    os.makedirs(work, exist_ok=True)
    work = tempfile.mkdtemp(prefix="copy-", dir=work)   # each of a side's copies its own run folder
    with contextlib.redirect_stdout(sys.stderr):
        side = Side(model, loop, policy, sentinel, args, work)
        for _ in range(args.warmup):
            side.epoch()
        if side.monitor.watch is not None:
            side.monitor.watch.probe_if_due(10 ** 9)
        side.unit()
    return side


def one(model, loop, policy, args) -> dict:
    """The sentinel on and off (and with ``--control`` a second 'off') for one configuration."""
    work = tempfile.mkdtemp(prefix="bench-sentinel-")
    sides = {"on": (model, loop, policy, True, args, os.path.join(work, "on")),
             "off": (model, loop, policy, False, args, os.path.join(work, "off"))}
    if args.control:
        sides["off'"] = (model, loop, policy, False, args, os.path.join(work, "off2"))
    if args.against:
        sides["against"] = (model, loop, policy, True, args, os.path.join(work, "against"),
                            os.path.abspath(args.against))
    per_copy, reports = interleave.compare_copies(built_side, sides, args.rounds, args.block,
                                                  args.copies)
    times = interleave.averaged(per_copy)
    out = {"model": model, "loop": loop, "policy": policy, "jit": args.jit, "rounds": args.rounds,
           "block": args.block, "copies": args.copies,
           "probe_seconds": reports["on"].get("probe_seconds"),
           "median_cost_wall": interleave.median_cost(times, "on", "off"),
           "median_step_ms_off": 1e3 * statistics.median(times["off"]),
           "median_step_ms_on": 1e3 * statistics.median(times["on"]),
           "pair_costs": interleave.copy_costs(per_copy, "on", "off")}
    if args.control:
        out["control_a_a"] = interleave.median_cost(times, "off'", "off")
        out["pair_controls"] = interleave.copy_costs(per_copy, "off'", "off")
    if args.against:
        out["against_cost_wall"] = interleave.median_cost(times, "against", "off")
        out["against_vs_on"] = interleave.median_cost(times, "against", "on")
        out["pair_against"] = interleave.copy_costs(per_copy, "against", "off")
    return out


def diagnosis_seconds(model: str) -> dict:
    """The replay of one overflowing batch for a built-in model under mixed_float16."""
    import tensorflow as tf

    from app.numerics import replay, rules
    from app.precision import policy as prec
    from app.task import model_layers
    from app.task.task import Task

    prec.apply_policy("mixed_float16")
    task = Task.from_specs(model, "synthetic", None, None, None, None)
    bundle = task.load_data(32, tempfile.mkdtemp(), max_train_samples=64, max_val_samples=32,
                            seed=0, offline=True, data_dir_explicit=False)
    built = task.build(bundle, bundle.sample_batch)
    x, y = next(iter(bundle.train))
    x = tf.ones_like(x) * 1e6
    failed = replay.FailedStep(rules.Fault("forward", 2, "the loss was not finite", 32768.0), 1,
                               32, "mixed_float16", "default")
    t0 = time.perf_counter()
    d = replay.diagnose(built.model, built.loss, model_layers.walk(built.model), (x, y), failed)
    seconds = time.perf_counter() - t0
    return {"model": model, "seconds": round(seconds, 2), "where": d.where.text(),
            "verdict": d.verdict}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="mlp,cnn")
    p.add_argument("--loops", default="fit,custom")
    p.add_argument("--policies", default="float32,mixed_float16")
    p.add_argument("--rounds", type=int, default=60, help="blocks of steps of each side, in turn")
    p.add_argument("--block", type=int, default=20, help="steps in a row per side and round")
    p.add_argument("--copies", type=int, default=2, help="processes per side")
    p.add_argument("--control", action="store_true",
                   help="also time a second 'off' side: the A/A difference, the noise floor")
    p.add_argument("--against", default=None, metavar="DIR",
                   help="also time the sentinel of another checkout of this repository "
                        "(e.g. git worktree add DIR HEAD~1): two versions side by side")
    p.add_argument("--jit", action="store_true",
                   help="every side's step compiled by XLA, as tfmp train --jit compiles it")
    p.add_argument("--samples", type=int, default=4096, help="samples in the epoch the blocks cycle")
    p.add_argument("--batch-size", type=int, default=128, help="tfmp train's default")
    p.add_argument("--log-every", type=int, default=100)
    p.add_argument("--numerics-every", type=int, default=100)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--diagnosis-models", default="mlp,cnn,resnet")
    p.add_argument("--output", default=None)
    p.add_argument("--pool", nargs="+", default=None, metavar="JSON",
                   help="time nothing: pool the process pairs of earlier runs' "
                        "bench_sentinel.json files, configuration by configuration")
    p.add_argument("--diagnose", default=None, help=argparse.SUPPRESS)   # MODEL child
    args = p.parse_args(argv)
    if args.pool:
        return pooled(args.pool)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if args.diagnose:
        print(json.dumps(diagnosis_seconds(args.diagnose)))
        return 0
    work = args.output or tempfile.mkdtemp(prefix="bench-sentinel-")
    os.makedirs(work, exist_ok=True)
    results, diagnoses = [], []
    for model in filter(None, args.models.split(",")):
        for loop in args.loops.split(","):
            for policy in args.policies.split(","):
                results.append(one(model, loop, policy, args))
                r = results[-1]
                control = (f" (A/A control {100 * r['control_a_a']:+.1f}%)" if args.control
                           else "")
                print(f"{model:6s} {loop:6s} {_policy(r):14s} step "
                      f"{r['median_step_ms_off']:7.2f} ms off, "
                      f"{r['median_step_ms_on']:7.2f} ms on; sentinel cost (median of "
                      f"rounds) {100 * r['median_cost_wall']:+5.1f}%{control}", flush=True)
                print(f"{'':6s} {'':6s} {'':14s} copy by copy: "
                      + _percents(r["pair_costs"]) + _spread(r["pair_costs"]) + (
                          f" (A/A {_percents(r['pair_controls'])})" if args.control else ""),
                      flush=True)
                if args.against:
                    print(f"{'':6s} {'':6s} {'':14s} --against {args.against}: "
                          f"{100 * r['against_cost_wall']:+.1f}% (against 'on' "
                          f"{100 * r['against_vs_on']:+.1f}%); copy by copy: "
                          + _percents(r["pair_against"]) + _spread(r["pair_against"]),
                          flush=True)
    for model in filter(None, args.diagnosis_models.split(",")):
        diagnoses.append(_child(["--diagnose", model]))
        d = diagnoses[-1]
        print(f"diagnosis {model:6s} mixed_float16: {d['seconds']:6.2f} s ({d['verdict']}: "
              f"{d['where']})", flush=True)
    missed = [f"{r['model']}/{r['loop']}/{_policy(r)} {100 * r['median_cost_wall']:+.1f}%"
              + _reading(r["pair_costs"]) for r in results if r["median_cost_wall"] > TARGET]
    missed += [f"diagnosis {d['model']} {d['seconds']} s" for d in diagnoses
               if d["seconds"] > DIAGNOSIS_TARGET_SECONDS]
    path = os.path.join(work, "bench_sentinel.json")
    with open(path, "w") as fh:
        json.dump({"step_cost": results, "diagnosis": diagnoses, "args": vars(args)}, fh, indent=2)
    print(f"JSON: {path}")
    print("targets: all met" if not missed else "targets MISSED: " + "; ".join(missed))
    return 1 if missed else 0


def pooled(paths) -> int:
    """Every process pair of the runs in ``paths`` (their JSON), pooled per configuration:
    one run's six pairs cannot tell a cost near the target from it, dozens can.  The
    figure is the median of the pairs (each a copy's median over its rounds); exit status
    1 when one is over the target.  Runs made with ``--against`` also pool that side: its
    pairs against 'off', and copy by copy its difference from 'on' (copy i of each side
    ran in the same rounds), which is what says whether a change to the guard helped."""
    groups: dict = {}
    for path in paths:
        try:
            with open(path) as fh:
                runs = json.load(fh)["step_cost"]
        except (OSError, ValueError, KeyError) as exc:
            raise SystemExit(f"error: --pool {path}: not a bench_sentinel.json ({exc})")
        for r in runs:
            g = groups.setdefault((r["model"], r["loop"], _policy(r)),
                                  {"runs": 0, "pairs": [], "controls": [], "against": [],
                                   "against_vs_on": []})
            g["runs"] += 1
            g["pairs"] += r.get("pair_costs", [])
            g["controls"] += r.get("pair_controls", [])
            against = r.get("pair_against", [])
            g["against"] += against
            g["against_vs_on"] += [a - o for a, o in zip(against, r.get("pair_costs", []))]
    missed = []
    for (model, loop, policy), g in groups.items():
        pairs, controls = g["pairs"], g["controls"]
        if not pairs:
            continue
        median = statistics.median(pairs)
        control = (f"; A/A {len(controls)} pairs, median {100 * statistics.median(controls):+.1f}%"
                   + _spread(controls) if controls else "")
        print(f"{model:6s} {loop:6s} {policy:14s} {g['runs']} run(s), {len(pairs)} pairs: "
              f"median {100 * median:+.1f}%{_spread(pairs)}{control}")
        if g["against"]:
            print(f"{'':6s} {'':6s} {'':14s} --against: {len(g['against'])} pairs, median "
                  f"{100 * statistics.median(g['against']):+.1f}%{_spread(g['against'])}; "
                  f"minus 'on' copy by copy: median "
                  f"{100 * statistics.median(g['against_vs_on']):+.1f} points"
                  f"{_spread(g['against_vs_on'], unit=' points')}")
        if median > TARGET:
            missed.append(f"{model}/{loop}/{policy} {100 * median:+.1f}%" + _reading(pairs))
    print("targets: all met" if not missed else "targets MISSED: " + "; ".join(missed))
    return 1 if missed else 0


def _policy(r) -> str:
    """The policy as the tables print it: 'float32 --jit' for a run made with ``--jit``,
    which pools apart from the runs without it."""
    return r["policy"] + (" --jit" if r.get("jit") else "")


def _mean_and_error(values):
    """The mean of the copies' costs and its standard error (None for one copy)."""
    if len(values) < 2:
        return None
    return statistics.fmean(values), statistics.stdev(values) / len(values) ** 0.5


def _mean_text(mean: float, error: float, unit: str = "%") -> str:
    return f"{100 * mean:+.1f}{unit} +- {100 * error:.1f}"


def _spread(values, unit: str = "%") -> str:
    got = _mean_and_error(values)
    return "" if got is None else f"; mean {_mean_text(*got, unit=unit)}"


def _reading(values) -> str:
    """What the copies say of a figure over the target: over it beyond two standard errors,
    or not told apart from it at this noise (pool more copies or runs)."""
    got = _mean_and_error(values)
    if got is None:
        return ""
    mean, error = got
    verdict = ("over it" if mean - 2 * error > TARGET
               else f"not told apart from {100 * TARGET:.0f}% at this noise")
    return f" (copies: {_mean_text(mean, error)}, {verdict})"


def _percents(values) -> str:
    return " ".join(f"{100 * v:+.1f}%" for v in values)


def _child(extra) -> dict:
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), *extra],
                          capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"child {extra} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    raise SystemExit(main())
