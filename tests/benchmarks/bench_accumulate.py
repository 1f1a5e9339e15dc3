"""What does ``--accumulate N`` cost per sample, against the plain batch of the same size?

For each built-in model, loop and policy asked for, ``tfmp train`` set-ups are built through
the seams ``train`` uses (``app.training.job.prepare``/``build_parts``/``make_monitor``): the
plain global batch B (``--batch-size B``) and, for each N asked for, ``--batch-size B/N
--accumulate N`` (the same global batch per update), on the same samples, each in
``--copies`` processes of its own.  After a warm-up epoch, every process makes a block of
``--block`` optimizer updates in turn each round (shuffled; an update is N micro-batch steps,
taken as the loop takes them: in fit, one call of Keras' train function per group).  The
cost is the median over the rounds of (accumulated / plain - 1), wall time; interleave.py
says why processes and blocks.  Target: at most 5% for N = 2 and 4; the exit status is 1
when a configuration misses it.  ``--split`` adds, for each N, the plain micro-batch B/N as a
side: (accumulated / N plain micro-batch updates - 1) is what the accumulation itself adds,
and (N plain micro-batch updates / the plain batch - 1) the smaller batch's own cost.

    python3 tests/benchmarks/bench_accumulate.py --split
    python3 tests/benchmarks/bench_accumulate.py --models mlp --split --global-batch 8192 --rounds 25 --block 3

Prints a table and writes bench_accumulate.json into --output (default a temp folder).

Measured on 2 shared cores (host, TF 2.21/Keras 3, float32, --split, fused adds), cost
against the plain batch [the accumulation's own part; the micro-batch's own part]:
    cnn  fit     B=2048   N=2  +0.6% [-3.3%; +4.4%]    N=4  -1.8% [-6.9%; +7.6%]
    cnn  custom  B=2048   N=2  +2.5% [+0.5%; +2.6%]    N=4  +3.0% [-2.8%; +3.2%]
    mlp  fit     B=16384  N=2  +0.3% [-5.6%; +5.8%]    N=4  +1.0% [-8.9%; +10.5%]
    mlp  custom  B=16384  N=2  +2.6% [+0.5%; +2.4%]    N=4  +4.1% [-1.5%; +7.7%]
    mlp  fit     B=8192   N=2  +1.5% [-2.2%; +0.8%]    N=4  +4.9% [-6.9%; +16.2%]
    mlp  custom  B=8192   N=2  +2.0% [-0.6%; +1.3%]    N=4  +6.6% [-0.9%; +7.4%]
and an earlier session's mlp at B=2048: N=4 +18.7% (fit), +28.7% (custom), the micro-batch
of 512 costing +38-44% per sample against 2048.  The accumulation itself costs about
nothing (it replaces N-1 optimizer updates with adds); what is left is the micro-batch's own
cost per sample: accumulate with the largest micro-batch that fits, as ``tfmp tune
--global-batch`` picks.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: paths.py
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # interleave.py beside it
from paths import root_on_path  # noqa: E402  the repository root (tests/paths.py)
import interleave  # noqa: E402
from train_setup import TrainSetup  # noqa: E402
ROOT = str(root_on_path())  # this checkout's app

TARGET = 0.05
# Each model's global batch B: one whose micro-batch B/4 is large enough that the smaller
# batch's own cost per sample (slower matrix products, an update and a call per micro-batch
# in the plain micro-batch run) does not swamp what is measured.  The mlp's dense layers on
# this project's 2-core CPU cost 38-44% more per sample at 512 rows than at 2048, a cost of
# the micro-batch itself that accumulation neither adds nor can remove (the figures at
# B=2048 and 8192 are in the docstring); --accumulate is for a global batch larger than
# fits, where the micro-batch is the largest that fits.
GLOBAL_BATCH = {"mlp": 16384, "cnn": 2048}


class Side(TrainSetup):
    """The plain batch (``n`` 1), ``--accumulate n``, or (``accumulate`` False) the plain
    micro-batch B/n; what is timed is one optimizer update."""

    def __init__(self, model, loop, policy, n: int, args, work: str, accumulate: bool = True):
        from app.training.config import TrainConfig

        super().__init__(TrainConfig(
            model=model, dataset="synthetic", precision=policy, loop=loop, epochs=1,
            batch_size=args.global_batch // n, accumulate=n if accumulate else 1,
            max_train_samples=args.samples, max_val_samples=64, offline=True,
            progress="bar", save_model=False, log_every=args.log_every,
            output=os.path.join(work, f"n{n}{'' if accumulate else 'p'}")))
        self.per_update = n if accumulate else 1

    def unit(self):
        """One optimizer update: its micro-batch steps (the epoch's samples a multiple of
        every batch: groups stay aligned)."""
        self.steps(self.per_update)

    def report(self) -> dict:
        return {"updates": self.updates()}


def built_side(model, loop, policy, n: int, accumulate: bool, args, work: str) -> Side:
    """One side in its own process (``interleave``), warmed up: every trace made."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.path.insert(0, ROOT)
    os.makedirs(work, exist_ok=True)
    work = tempfile.mkdtemp(prefix="copy-", dir=work)   # each of a side's copies its own run folder
    with contextlib.redirect_stdout(sys.stderr):
        side = Side(model, loop, policy, n, args, work, accumulate=accumulate)
        for _ in range(args.warmup):
            side.epoch()
        side.unit()
    return side


def one(model, loop, policy, args) -> dict:
    """Every side of one configuration: the plain global batch, each N, and with ``--split``
    the plain micro-batch of each N."""
    work = tempfile.mkdtemp(prefix="bench-accumulate-")
    ns = [int(n) for n in args.accumulate.split(",")]
    sides = {"1": (model, loop, policy, 1, True, args, os.path.join(work, "n1"))}
    for n in ns:
        sides[str(n)] = (model, loop, policy, n, True, args, os.path.join(work, f"n{n}"))
        if args.split:
            sides[f"p{n}"] = (model, loop, policy, n, False, args, os.path.join(work, f"p{n}"))
    times, reports = interleave.compare(built_side, sides, args.rounds, args.block, args.copies)
    # Every accumulating side made as many updates as the plain batch: the same global batch.
    assert len({reports[str(n)]["updates"] for n in [1] + ns}) == 1, reports
    out = {"model": model, "loop": loop, "policy": policy, "global_batch": args.global_batch,
           "rounds": args.rounds, "block": args.block, "copies": args.copies,
           "median_ms_per_update_plain": 1e3 * statistics.median(times["1"])}
    for n in ns:
        out[f"n{n}_median_cost"] = interleave.median_cost(times, str(n), "1")
        if args.split:   # the accumulation's own part: N plain micro-batch updates
            out[f"n{n}_vs_micro"] = interleave.median_cost(times, str(n), f"p{n}", scale=n)
            out[f"n{n}_micro_vs_plain"] = interleave.median_cost(times, f"p{n}", "1", scale=1 / n)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="mlp,cnn")
    p.add_argument("--loops", default="fit,custom")
    p.add_argument("--policies", default="float32")
    p.add_argument("--accumulate", default="2,4", help="the N compared with the plain batch")
    p.add_argument("--global-batch", type=int, default=None,
                   help="for every model (default: " + ", ".join(
                       f"{m} {b}" for m, b in GLOBAL_BATCH.items()) + ")")
    p.add_argument("--rounds", type=int, default=40, help="blocks of updates of each side, in turn")
    p.add_argument("--block", type=int, default=5, help="updates in a row per side and round")
    p.add_argument("--copies", type=int, default=2, help="processes per side")
    p.add_argument("--samples", type=int, default=None,
                   help="samples of the warm-up epoch (default: twice the global batch, at least 8192)")
    p.add_argument("--log-every", type=int, default=100)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--split", action="store_true",
                   help="also time the plain micro-batch: the accumulation's own cost")
    p.add_argument("--output", default=None)
    args = p.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    work = args.output or tempfile.mkdtemp(prefix="bench-accumulate-")
    os.makedirs(work, exist_ok=True)
    results = []
    ns = [int(n) for n in args.accumulate.split(",")]
    for model in filter(None, args.models.split(",")):
        batch = args.global_batch or GLOBAL_BATCH.get(model, 2048)
        margs = argparse.Namespace(**{**vars(args), "global_batch": batch,
                                      "samples": args.samples or max(8192, 2 * batch)})
        for loop in args.loops.split(","):
            for policy in args.policies.split(","):
                results.append(one(model, loop, policy, margs))
                r = results[-1]
                costs = "; ".join(
                    f"N={n}: {100 * r[f'n{n}_median_cost']:+5.1f}%" + (
                        f" (vs N updates of the micro-batch: {100 * r[f'n{n}_vs_micro']:+5.1f}%;"
                        f" the micro-batch's own: {100 * r[f'n{n}_micro_vs_plain']:+5.1f}%)"
                        if args.split else "") for n in ns)
                print(f"{model:6s} {loop:6s} {policy:14s} B={batch} plain update "
                      f"{r['median_ms_per_update_plain']:7.1f} ms; {costs}", flush=True)
    missed = [f"{r['model']}/{r['loop']}/{r['policy']} N={n} "
              f"{100 * r[f'n{n}_median_cost']:+.1f}%"
              for r in results for n in ns if r[f"n{n}_median_cost"] > TARGET]
    path = os.path.join(work, "bench_accumulate.json")
    with open(path, "w") as fh:
        json.dump({"results": results, "args": vars(args)}, fh, indent=2)
    print(f"JSON: {path}")
    print("targets: all met" if not missed else "targets MISSED: " + "; ".join(missed))
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
