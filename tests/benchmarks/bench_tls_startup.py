#!/usr/bin/env python3
"""What JupyterLab over TLS costs: start-up and the first page, against plain HTTP.

    python3 tests/benchmarks/bench_tls_startup.py [--image IMAGE] [--rounds N] [--json FILE]

Not a test: figures for docs/image.md ("Exposing Jupyter").  Each round starts three serve
containers on the built image (JupyterLab only, ENABLE_SSH=0), in an order that rotates from
round to round so drift on a shared machine spreads evenly:

  plain     no TLS
  tls-new   JUPYTER_TLS=self-signed on an empty volume: the certificate is made
  tls-kept  the same volume again: the kept certificate is checked and reused

Measured from `docker run` on the host:
  ready     until GET /api/status with the token answers 200 (what the healthcheck asks), polled
            every 50 ms from the host; `docker inspect`'s "healthy" is also recorded, but it
            moves in the healthcheck's 5 s steps, so the ratios use "ready"
  page      then a cold headless Chromium (fresh profile) opens /lab?token=...: seconds from
            navigation to JupyterLab's launcher on screen.  Chromium trusts the container's
            certificate by its key (SPKI allow-list), as a user who imported it.
  connect   median of 20 new connections from the host: TCP connect, plus for TLS the full
            handshake, verified against the container's certificate (what every new browser
            connection pays; Chromium's Navigation Timing cannot show it, because Jupyter
            redirects /lab?token=... and the page then reuses the connection)

One plain start before the rounds warms the engine's and the page cache's first-start costs.

Prints a table of medians and the paired ratios (each TLS start over the plain start of the
same round), and writes the raw figures as JSON with --json.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import ssl
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import requests
import urllib3

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: paths.py
from paths import ROOT, root_on_path  # noqa: E402  the repository root (tests/paths.py)
root_on_path()  # image_helpers imports tests.paths
sys.path.insert(0, str(ROOT / "tests" / "image"))

from image_helpers import TEST_IMAGE, free_port, health, run  # noqa: E402
from test_tensorboard import DevTools  # noqa: E402  (the image tests' DevTools client)
from test_tls import spki_hash  # noqa: E402

TOKEN = "bench-" + uuid.uuid4().hex
VARIANTS = ("plain", "tls-new", "tls-kept")
LAUNCHER = "!!document.querySelector('.jp-Launcher')"

urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)


def start(image: str, variant: str, volume: str) -> dict:
    name = f"tfmp-bench-tls-{uuid.uuid4().hex[:8]}"
    port = free_port()
    args = ["-p", f"127.0.0.1:{port}:8888", "-e", "ENABLE_SSH=0", "-e", f"JUPYTER_TOKEN={TOKEN}"]
    if variant != "plain":
        args += ["-e", "JUPYTER_TLS=self-signed", "-v", f"{volume}:/etc/tfmp/tls"]
    scheme = "http" if variant == "plain" else "https"
    url = f"{scheme}://127.0.0.1:{port}/api/status"
    t0 = time.monotonic()
    run(["docker", "run", "-d", "--name", name, *args, image], timeout=120)
    ready = healthy = None
    deadline = t0 + 180
    while time.monotonic() < deadline and (ready is None or healthy is None):
        now = time.monotonic()
        if ready is None:
            try:
                # verify=False only while polling for readiness: the page load below verifies.
                if requests.get(url, headers={"Authorization": f"token {TOKEN}"}, timeout=2,
                                verify=False).status_code == 200:
                    ready = now - t0
            except requests.RequestException:
                pass
        if ready is not None and healthy is None and health(name).startswith("healthy"):
            healthy = time.monotonic() - t0
        time.sleep(0.05)
    if ready is None or healthy is None:
        logs = run(["docker", "logs", name], check=False).stderr[-2000:]
        run(["docker", "rm", "-f", name], check=False)
        raise SystemExit(f"{variant}: not ready/healthy within 180 s\n{logs}")
    return {"name": name, "port": port, "scheme": scheme, "ready_s": ready, "healthy_s": healthy}


def connect_ms(port: int, cert: Path | None, n: int = 20) -> float:
    """Median milliseconds for a new connection (and its TLS handshake when ``cert``)."""
    ctx = None
    if cert:
        ctx = ssl.create_default_context(cafile=str(cert))
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            if ctx:
                with ctx.wrap_socket(sock, server_hostname="127.0.0.1"):
                    times.append(time.perf_counter() - t0)
            else:
                times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def first_page(box: dict, workdir: Path) -> dict:
    flags, cert = [], None
    if box["scheme"] == "https":
        cert = workdir / f"{box['name']}.crt"
        cert.write_text(run(["docker", "exec", box["name"], "cat", "/run/tfmp/tls/jupyter.crt"]).stdout)
        flags = [f"--ignore-certificate-errors-spki-list={spki_hash(cert)}"]
    connect = connect_ms(box["port"], cert)
    profile = workdir / f"profile-{box['name']}"
    browser = DevTools(profile, workdir / f"{box['name']}-chromium.log", extra_flags=tuple(flags))
    try:
        t0 = time.monotonic()
        browser.call("Page.navigate",
                     url=f"{box['scheme']}://127.0.0.1:{box['port']}/lab?token={TOKEN}")
        while not browser.eval(LAUNCHER):
            if time.monotonic() - t0 > 120:
                raise SystemExit(f"{box['name']}: no launcher after 120 s")
            time.sleep(0.05)
        seconds = time.monotonic() - t0
    finally:
        browser.close()
    return {"page_s": seconds, "connect_ms": connect}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--image", default=TEST_IMAGE)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1. Received: {args.rounds}")
    workdir = Path(f"/tmp/bench-tls-{os.getpid()}")
    workdir.mkdir()
    rows: list[dict] = []
    try:
        run(["docker", "rm", "-f", start(args.image, "plain", "")["name"]], timeout=60)
        for rnd in range(args.rounds):
            volume = f"tfmp-bench-tls-{uuid.uuid4().hex[:8]}"
            # tls-kept must follow tls-new (it reuses its volume): rotate plain around them.
            order = [["plain", "tls-new", "tls-kept"], ["tls-new", "plain", "tls-kept"],
                     ["tls-new", "tls-kept", "plain"]][rnd % 3]
            try:
                for variant in order:
                    box = start(args.image, variant, volume)
                    try:
                        row = {"round": rnd, "variant": variant, **box,
                               **first_page(box, workdir)}
                    finally:
                        run(["docker", "rm", "-f", box["name"]], check=False, timeout=60)
                    rows.append(row)
                    print(f"round {rnd} {variant:9s} ready {row['ready_s']:6.2f} s  healthy "
                          f"{row['healthy_s']:6.2f} s  first page {row['page_s']:6.2f} s  "
                          f"connect {row['connect_ms']:.2f} ms", flush=True)
            finally:
                run(["docker", "volume", "rm", "-f", volume], check=False, timeout=60)
    finally:
        subprocess.run(["rm", "-rf", str(workdir)], check=False)

    def med(variant: str, key: str) -> float:
        return statistics.median(r[key] for r in rows if r["variant"] == variant)

    def paired(variant: str, key: str) -> float:
        plain = {r["round"]: r[key] for r in rows if r["variant"] == "plain"}
        return statistics.median(r[key] / plain[r["round"]] for r in rows
                                 if r["variant"] == variant)

    summary = {"rounds": args.rounds, "image": args.image}
    print(f"\nmedians of {args.rounds} rounds ({args.image}):")
    print(f"{'variant':10s} {'ready s':>8s} {'x plain':>8s} {'healthy s':>10s} {'page s':>8s} "
          f"{'x plain':>8s} {'connect ms':>11s}")
    for variant in VARIANTS:
        summary[variant] = {
            "ready_s": med(variant, "ready_s"), "healthy_s": med(variant, "healthy_s"),
            "page_s": med(variant, "page_s"), "connect_ms": med(variant, "connect_ms"),
            "ready_ratio": paired(variant, "ready_s"), "page_ratio": paired(variant, "page_s")}
        s = summary[variant]
        print(f"{variant:10s} {s['ready_s']:8.2f} {s['ready_ratio']:8.3f} {s['healthy_s']:10.2f} "
              f"{s['page_s']:8.2f} {s['page_ratio']:8.3f} {s['connect_ms']:11.2f}")
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
