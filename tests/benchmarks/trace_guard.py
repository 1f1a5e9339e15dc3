"""Where in a training step does the sentinel's time go?  TensorFlow's profiler, step by step.

``bench_sentinel.py`` gives the whole step's cost, whose A/A noise on a small shared CPU is as
large as the guard; ``bench_guard.py`` times the guard alone, apart from a real backward
pass.  This traces real ``tfmp train`` steps (the set-ups ``bench_sentinel`` builds, each in
a process of its own, the sentinel off, then on) and splits each step's graph at two points:

* the last gradient: the end of the last op under ``gradient_tape/`` (the backward pass);
* the first update: the start of the first op of the optimizer after it.

Per process, the median over the traced steps of: the graph up to the last gradient (forward
and backward: what the sentinel's sums running beside the backward slow down), from the last
gradient to the first update (the guard's own latency on the critical path: the last sum,
the test and the cond), and the updates themselves; per side, the median over its
``--pairs`` processes (one process alone is not a measure: the same set-up ran 10-40% apart
from one process to the next on a shared 2-core machine).  What the off side shows between
the last gradient and the first update is TensorFlow's own scheduling.

    python3 tests/benchmarks/trace_guard.py --models mlp,cnn --loops custom,fit

``--timeline`` also prints, from the first process of each side, what the split cannot
show: the ops only the sentinel's side runs (their number and op time a step), and the
ops around the last gradient, each at its median start relative to the end of the last
gradient op, with its median duration.  That is where to look before changing the guard:
the time of an op beside the backward pass's matmuls, and the tail before the first
update.

    python3 tests/benchmarks/trace_guard.py --models mlp --loops custom --timeline

``--tracer-level 3`` also traces the ops the executor runs inline (a lowered cond's Switch
and Identity ops, which level 2 leaves as a blank gap): that is how the cond around the
update was found to cost about 60 us after the test (docs/numerics-cost-record.md).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: paths.py
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from paths import root_on_path  # noqa: E402

ROOT = str(root_on_path())
UPDATE = re.compile(r"(?i)(adam|sgd|rmsprop).*(ResourceApply|Assign)")
PARTS = ("to last gradient", "last gradient to first update", "updates", "graph")
BRANCH = re.compile(r"^(cond(_\d+)?/(then|else)/_\d+/)+cond(_\d+)?/")


def traced_side(model: str, loop: str, sentinel: bool, args) -> dict:
    """In this process: one side, warmed up, ``--steps`` steps under the profiler; the
    median of each part, in microseconds."""
    import tensorflow as tf

    import bench_sentinel

    side = bench_sentinel.built_side(model, loop, "float32", sentinel, args, tempfile.mkdtemp())
    for _ in range(args.warm_steps):
        side.unit()
    logdir = tempfile.mkdtemp()
    tf.profiler.experimental.start(logdir, options=tf.profiler.experimental.ProfilerOptions(
        host_tracer_level=args.tracer_level))
    for _ in range(args.steps):
        with tf.profiler.experimental.Trace("tfmp_step"):
            side.unit()
    tf.profiler.experimental.stop()
    steps = list(_steps(logdir))
    spans = [_split(events) for events in steps]
    spans = [s for s in spans if s is not None]
    if not spans:
        raise SystemExit(f"{model}/{loop}: no step had both a gradient and an update op")
    out = {part: statistics.median(s[i] for s in spans) for i, part in enumerate(PARTS)}
    if args.timeline:
        out["ops"] = _op_medians(steps)
        out["steps"] = sum(_last_gradient_end(events) is not None for events in steps)
    return out


def _op_medians(steps) -> dict:
    """Per op name: its median start relative to the end of the step's last gradient op,
    its median duration (us), and in how many steps it ran."""
    seen: dict = {}
    for events in steps:
        last_grad = _last_gradient_end(events)
        if last_grad is None:
            continue
        for start, end, name in events:
            seen.setdefault(name, []).append((start - last_grad, end - start))
    return {name: [statistics.median(o for o, _ in v), statistics.median(d for _, d in v), len(v)]
            for name, v in seen.items()}


def _unbranched(name: str) -> str:
    """An op's name without the lowered cond's prefix (``cond_2/then/_16/cond_2/``), so the
    optimizer's ops behind the guard's cond match the same ops unguarded."""
    return BRANCH.sub("", name)


def _print_timeline(off: dict, on: dict, steps: int, window=(-100.0, 400.0)) -> None:
    """The ops only 'on' runs, and 'on''s ops around the last gradient (see the docstring);
    an op counts when it ran in at least half of the ``steps`` traced."""
    plain = {_unbranched(n) for n in off}
    extra = {n: v for n, v in on.items() if _unbranched(n) not in plain and v[2] >= steps // 2}
    print(f"{'':12s} ops only 'on' runs: {len(extra)} a step, "
          f"{sum(v[1] for v in extra.values()):.0f} us of op time a step (medians)")
    for name, (_, dur, _) in sorted(extra.items(), key=lambda kv: -kv[1][1])[:8]:
        print(f"{'':14s} {dur:7.1f} us  {name}")
    print(f"{'':12s} 'on' around the last gradient (start from its end, duration, op; "
          f"* only 'on'):")
    near = sorted((v[0], v[1], n) for n, v in on.items()
                  if window[0] <= v[0] <= window[1] and v[2] >= steps // 2)
    for offset, dur, name in near:
        print(f"{'':14s} {offset:+7.1f} {dur:7.1f}  {'*' if name in extra else ' '} {name[:90]}")


def _steps(logdir: str):
    """Each traced step's op events (start_us, end_us, name), from the profiler's xplane."""
    try:
        from tensorflow.tsl.profiler.protobuf import xplane_pb2
    except ImportError:   # TensorFlow 2.9 keeps it in core
        from tensorflow.core.profiler.protobuf import xplane_pb2
    space = xplane_pb2.XSpace()
    with open(glob.glob(f"{logdir}/plugins/profile/*/*.xplane.pb")[0], "rb") as fh:
        space.ParseFromString(fh.read())
    ops, marks = [], []
    for plane in space.planes:
        names = {k: v.name for k, v in plane.event_metadata.items()}
        for line in plane.lines:
            for ev in line.events:
                start = (line.timestamp_ns * 1000 + ev.offset_ps) / 1e6
                name = names.get(ev.metadata_id, "")
                if name == "tfmp_step":
                    marks.append((start, start + ev.duration_ps / 1e6))
                elif ":" in name and line.name.startswith("tf_"):   # an op: "name:Type"
                    ops.append((start, start + ev.duration_ps / 1e6, name))
    for begin, end in sorted(marks)[2:]:   # the first steps still settle
        yield [op for op in ops if begin <= op[0] < end]


def _last_gradient_end(events):
    """When the step's last gradient op (under ``gradient_tape/``) ended; None without one."""
    return max((e[1] for e in events if e[2].startswith("gradient_tape/")), default=None)


def _split(events):
    last_grad = _last_gradient_end(events)
    if last_grad is None:
        return None
    updates = [e for e in events if UPDATE.search(e[2]) and e[0] >= last_grad]
    if not updates:
        return None
    start = min(e[0] for e in events)
    first, done = min(e[0] for e in updates), max(e[1] for e in updates)
    return last_grad - start, first - last_grad, done - first, done - start


def _child(passed, model, loop, which) -> dict:
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), *passed,
                           "--side", f"{model},{loop},{which}"],
                          capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"{model}/{loop}/{which} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="mlp,cnn")
    p.add_argument("--loops", default="custom,fit")
    p.add_argument("--steps", type=int, default=60, help="steps traced per process")
    p.add_argument("--pairs", type=int, default=3,
                   help="processes per side, off and on in turn; the median over them")
    p.add_argument("--warm-steps", type=int, default=50)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--samples", type=int, default=4096)
    p.add_argument("--log-every", type=int, default=100)
    p.add_argument("--numerics-every", type=int, default=100)
    p.add_argument("--warmup", type=int, default=1, help="epochs before the warm steps")
    p.add_argument("--timeline", action="store_true",
                   help="also the ops only 'on' runs, and the ops around the last gradient")
    p.add_argument("--tracer-level", type=int, default=2, choices=(1, 2, 3),
                   help="the profiler's host tracer level: 3 also records the executor's "
                        "inline ops (Switch, Identity, Merge), and slows every op a little")
    p.add_argument("--jit", action="store_true",
                   help="each side's step compiled by XLA, as tfmp train --jit compiles it")
    p.add_argument("--side", default=None, help=argparse.SUPPRESS)   # MODEL,LOOP,on|off child
    args = p.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if args.side:
        model, loop, which = args.side.split(",")
        print(json.dumps(traced_side(model, loop, which == "on", args)))
        return 0
    passed = list(argv if argv is not None else sys.argv[1:])
    print(f"{'':12s} {'side':4s} " + " | ".join(f"{part} (us)" for part in PARTS))
    for model in filter(None, args.models.split(",")):
        for loop in filter(None, args.loops.split(",")):
            runs = {"off": [], "on": []}
            for _ in range(args.pairs):   # off and on in turn: a slower minute hits both
                for which in runs:
                    runs[which].append(_child(passed, model, loop, which))
            got = {which: {part: statistics.median(r[part] for r in rs) for part in PARTS}
                   for which, rs in runs.items()}
            for which in runs:
                print(f"{model + '/' + loop:12s} {which:4s} "
                      + " | ".join(f"{got[which][part]:8.0f}" for part in PARTS), flush=True)
            print(f"{'':12s} {'+':4s} " + " | ".join(
                f"{got['on'][part] - got['off'][part]:+8.0f}" for part in PARTS), flush=True)
            if args.timeline:
                on = runs["on"][0]
                _print_timeline(runs["off"][0]["ops"], on["ops"], on["steps"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
