"""What does an open TensorBoard cost a running training?  Measured inside the image.

One container of the image in `serve` mode (JupyterLab, no SSH).  The same short
``python -m app train`` (synthetic data, MLP, float32) runs again and again with ``docker exec``,
its run folder in /workspace/runs, which is what TensorBoard watches.  Trials alternate
(without, with; with, without; ...) so drift on a noisy machine hits both sides alike:

* without: no TensorBoard process in the container;
* with: TensorBoard started exactly as the JupyterLab tile starts it (``tfmp-tensorboard``,
  127.0.0.1 only) before the training starts, and a client polling it through Jupyter's proxy
  (with the token) for the run list, the scalar tags and the live run's ``step/loss`` series,
  every ``--poll-interval`` seconds: a browser tab that never stops refreshing (TensorBoard's
  own page reloads every 30 s, so this is harsher than a real one).

Throughput: training samples/s of the epochs after the first (the first includes tracing),
from the run's metrics.json.  Per pair, with/without; the median of those paired ratios is
the figure.  Target: an open TensorBoard slows training by at most 5%; the exit status is 1
when it is missed, so a run can be used as a check.

    python tests/benchmarks/bench_tensorboard_overhead.py --image tfmp/train:test-tb --pairs 4

Prints a table and writes bench_tensorboard_overhead.json into --output (default a temp folder).
"""
from __future__ import annotations

import argparse
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

TB_PORT = 6006  # inside the container only; reached through Jupyter's /proxy/6006/


def sh(*cmd: str, timeout: float = 600, check: bool = True) -> str:
    proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} -> exit {proc.returncode}\n{proc.stderr[-2000:]}")
    return proc.stdout


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Jupyter:
    def __init__(self, port: int, token: str):
        self.base = f"http://127.0.0.1:{port}"
        self.token = token

    def get(self, path: str, timeout: float = 10):
        req = urllib.request.Request(self.base + path,
                                     headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()

    def wait(self, path: str, timeout: float) -> float:
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            try:
                if self.get(path)[0] == 200:
                    return time.monotonic() - start
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.2)
        raise SystemExit(f"{path} did not answer within {timeout} s")


class Poller(threading.Thread):
    """A client that keeps TensorBoard busy: runs, tags, and the newest run's loss series."""

    def __init__(self, jupyter: Jupyter, interval: float):
        super().__init__(daemon=True)
        self.jupyter, self.interval = jupyter, interval
        self.stop = threading.Event()
        self.requests = self.errors = 0

    def run(self) -> None:
        prefix = f"/proxy/{TB_PORT}"
        while not self.stop.is_set():
            try:
                self.jupyter.get(prefix + "/data/runs")
                _, body = self.jupyter.get(prefix + "/data/plugin/scalars/tags")
                self.requests += 2
                # The newest run that has a loss series yet (names start with the pair number).
                runs = sorted(r for r, tags in json.loads(body).items() if "step/loss" in tags)
                if runs:
                    query = urllib.request.quote(runs[-1], safe="")
                    self.jupyter.get(f"{prefix}/data/plugin/scalars/scalars?run={query}"
                                     "&tag=step%2Floss")
                    self.requests += 1
            except (OSError, urllib.error.URLError, ValueError):
                self.errors += 1
            self.stop.wait(self.interval)


def train(container: str, args, name: str) -> list[float]:
    out = f"/workspace/runs/{name}"
    sh("docker", "exec", "-u", "tf", container, "python", "-m", "app", "train",
       "--dataset", "synthetic", "--model", "mlp", "--precision", "float32",
       "--epochs", str(args.epochs), "--batch-size", str(args.batch_size),
       "--max-train-samples", str(args.samples), "--max-val-samples", "1000",
       "--log-every", str(args.log_every), "--no-save-model", "--progress", "lines",
       "--output", out, timeout=1200)
    metrics = json.loads(sh("docker", "exec", container, "cat", f"{out}/metrics.json"))
    return [row["samples_per_second"] for row in metrics["epochs"][1:]]


def start_tensorboard(container: str, jupyter: Jupyter) -> float:
    sh("docker", "exec", "-d", "-u", "tf", container, "bash", "-c",
       f"echo $$ > /tmp/bench-tb.pid; exec /usr/local/bin/tfmp-tensorboard --port {TB_PORT}")
    return jupyter.wait(f"/proxy/{TB_PORT}/data/runs", timeout=120)


def stop_tensorboard(container: str) -> None:
    sh("docker", "exec", container, "bash", "-c",
       "pid=$(cat /tmp/bench-tb.pid); kill \"$pid\"; "
       "for _ in $(seq 100); do kill -0 \"$pid\" 2>/dev/null || exit 0; sleep 0.1; done; exit 1")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--image", default=os.environ.get("TFMP_TEST_IMAGE", "tfmp/train:test-tb"))
    p.add_argument("--pairs", type=int, default=4)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--samples", type=int, default=40000)
    p.add_argument("--log-every", type=int, default=20,
                   help="step scalars every N steps: more events for TensorBoard to read")
    p.add_argument("--poll-interval", type=float, default=1.0)
    p.add_argument("--output", default=None)
    args = p.parse_args(argv)
    if args.epochs < 2:
        p.error("--epochs must be at least 2 (the first epoch is warm-up)")
    if args.pairs < 1:
        p.error("--pairs must be at least 1")
    work = args.output or tempfile.mkdtemp(prefix="bench-tensorboard-")
    os.makedirs(work, exist_ok=True)

    token, port = secrets.token_hex(16), free_port()
    container = f"tfmp-bench-tb-{secrets.token_hex(4)}"
    sh("docker", "run", "-d", "--name", container, "-e", f"JUPYTER_TOKEN={token}",
       "-e", "ENABLE_SSH=0", "-e", "TF_CPP_MIN_LOG_LEVEL=2", "-p", f"127.0.0.1:{port}:8888",
       "--shm-size=1g", args.image)
    jupyter = Jupyter(port, token)
    sides = {"without": [], "with": []}
    ratios, trials, start_seconds = [], [], []
    try:
        jupyter.wait("/api/status", timeout=120)
        for i in range(args.pairs):
            order = ["without", "with"] if i % 2 == 0 else ["with", "without"]
            pair = {}
            for side in order:
                poller = None
                if side == "with":
                    start_seconds.append(start_tensorboard(container, jupyter))
                    poller = Poller(jupyter, args.poll_interval)
                    poller.start()
                try:
                    sps = train(container, args, f"bench-{i}-{side}")
                finally:
                    if poller:
                        poller.stop.set()
                        poller.join(timeout=30)
                        stop_tensorboard(container)
                pair[side] = statistics.median(sps)
                sides[side].extend(sps)
                trials.append({"pair": i, "side": side, "samples_per_second": sps,
                               "poll_requests": poller.requests if poller else 0,
                               "poll_errors": poller.errors if poller else 0})
                note = f", {poller.requests} polls ({poller.errors} failed)" if poller else ""
                print(f"pair {i + 1}/{args.pairs} {side:7s}: {pair[side]:9.0f} samples/s{note}",
                      flush=True)
            ratios.append(pair["with"] / pair["without"])
    finally:
        sh("docker", "rm", "-f", container, check=False, timeout=120)

    slowdown = 1.0 - statistics.median(ratios)
    result = {
        "image": args.image, "model": "mlp", "policy": "float32", "batch_size": args.batch_size,
        "train_samples": args.samples, "epochs": args.epochs, "pairs": args.pairs,
        "poll_interval_s": args.poll_interval, "log_every": args.log_every,
        "unit": "samples/s (training part of each epoch after the first)",
        "median_without": statistics.median(sides["without"]),
        "median_with": statistics.median(sides["with"]),
        "paired_ratios_with_over_without": ratios, "paired_slowdown_fraction": slowdown,
        "tensorboard_start_seconds": start_seconds, "target_fraction": 0.05, "trials": trials,
    }
    result["target_met"] = met = slowdown <= result["target_fraction"]
    path = os.path.join(work, "bench_tensorboard_overhead.json")
    with open(path, "w") as fh:
        json.dump(result, fh, indent=2)
    print()
    print("| side                                   | median samples/s | n  |")
    print("|----------------------------------------|-----------------:|---:|")
    print(f"| training alone                         | {result['median_without']:16.0f} "
          f"| {len(sides['without']):2d} |")
    print(f"| training + TensorBoard polled every {args.poll_interval:g}s | "
          f"{result['median_with']:16.0f} | {len(sides['with']):2d} |")
    print(f"\npaired with/without ratios: {', '.join(f'{r:.3f}' for r in ratios)}")
    print(f"slowdown from an open TensorBoard: {slowdown * 100:+.1f}% (median of paired ratios); "
          f"target <= 5%  [mlp float32, batch {args.batch_size}, {args.samples} samples]")
    print(f"JSON: {path}")
    print("target: met" if met else f"target MISSED: slowdown {slowdown * 100:+.1f}% > 5%")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
