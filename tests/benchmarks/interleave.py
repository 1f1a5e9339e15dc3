"""Set-ups timed side by side: each in a process of its own, a block of units each in turn.

Why processes, and why blocks.  Two identical ``tfmp train`` set-ups built in one process and
stepped in turn (one step each) do not run alike: on this project's 2-core machines the one
built first ran 4-7% faster than the others, run after run, and whichever side a benchmark
built first got that for free (an A/A comparison, the same set-up twice, says so; ``--control``
in the benchmarks that use this).  In processes of their own, each side owns its memory and
caches; a block of ``block`` units back to back is a training loop's steady state, and the
blocks of a round share the machine's state, so a slower minute slows every side of the round.
Several processes per side (``copies``) average out what one process's placement gives it.

Each side is built by ``build(*args)`` in its child (a module-level function, so that the
``spawn`` start method can find it), which returns an object with ``unit()`` (one step, one
update: what is timed) and optionally ``report()`` (a dict sent back at the end).  The
child warms the side up before the first round: ``build`` takes care of that.
"""
from __future__ import annotations

import multiprocessing
import random
import statistics
import time
from typing import Callable, Dict, List, Tuple


def _child(conn, build, args) -> None:
    try:
        side = build(*args)
    except BaseException as exc:   # the parent says which side failed, with what
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        raise
    conn.send(("ready", None))
    clock = time.perf_counter
    while True:
        block = conn.recv()
        if block is None:
            report = getattr(side, "report", None)
            conn.send(report() if report else {})
            return
        t0 = clock()
        for _ in range(block):
            side.unit()
        conn.send((clock() - t0) / block)


def compare(build: Callable, sides: Dict[str, Tuple], rounds: int, block: int,
            copies: int = 2, seed: int = 0) -> Tuple[Dict[str, List[float]], Dict[str, dict]]:
    """Time every side (name: the args of ``build``) ``rounds`` times, ``block`` units each,
    in ``copies`` processes per side, in a shuffled order each round.  Returns (per side,
    the seconds per unit of each round, averaged over its copies; per side, the first
    copy's ``report()``)."""
    per_copy, reports = compare_copies(build, sides, rounds, block, copies, seed)
    return averaged(per_copy), reports


def compare_copies(build: Callable, sides: Dict[str, Tuple], rounds: int, block: int,
                   copies: int = 2, seed: int = 0
                   ) -> Tuple[Dict[str, List[List[float]]], Dict[str, dict]]:
    """``compare``, each copy's times kept apart: (per side, per copy, the seconds per unit
    of each round; per side, the first copy's ``report()``)."""
    ctx = multiprocessing.get_context("spawn")
    procs = []
    # Copy by copy, every side in turn: a process started later finds the machine's memory
    # in another state, so no side may have all the early or all the late starts.
    for index in range(copies):
        for name, args in sides.items():
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_child, args=(child, build, args), daemon=True)
            proc.start()
            child.close()   # the parent's copy: a child that dies is then an EOFError here
            procs.append((name, index, parent, proc))
    try:
        for name, _, conn, proc in procs:
            try:
                kind, detail = conn.recv()
            except EOFError:
                kind, detail = "error", f"its process ended with exit status {proc.exitcode}"
            if kind != "ready":
                raise SystemExit(f"side {name!r} could not be built: {detail}")
        order = random.Random(seed)
        times: Dict[str, List[List[float]]] = {name: [[] for _ in range(copies)]
                                               for name in sides}
        for _ in range(rounds):
            for name, index, conn, _ in order.sample(procs, len(procs)):
                conn.send(block)
                times[name][index].append(conn.recv())
        reports: Dict[str, dict] = {}
        for name, _, conn, proc in procs:
            conn.send(None)
            reports.setdefault(name, conn.recv())
        return times, reports
    finally:   # a TensorFlow process can linger in its exit: nothing of it is needed now
        for _, _, _, proc in procs:
            proc.kill()
            proc.join()


def averaged(per_copy: Dict[str, List[List[float]]]) -> Dict[str, List[float]]:
    """Per side, each round's time averaged over the side's copies."""
    return {name: [statistics.fmean(r) for r in zip(*copies)]
            for name, copies in per_copy.items()}


def copy_costs(per_copy: Dict[str, List[List[float]]], side: str, base: str) -> List[float]:
    """The median cost of ``side`` over ``base`` pairing copy i of one with copy i of the
    other: one figure per pair of processes, whose spread is what a process's placement
    gives it (the A/A control's pairs show it without any change between the sides)."""
    return [statistics.median(a / b - 1.0 for a, b in zip(s, t))
            for s, t in zip(per_copy[side], per_copy[base])]


def median_cost(times: Dict[str, List[float]], side: str, base: str, scale: float = 1.0) -> float:
    """The median over the rounds of (``side`` / (``scale`` x ``base``) - 1)."""
    return statistics.median(a / (scale * b) - 1.0 for a, b in zip(times[side], times[base]))
