#!/usr/bin/env python3
"""HEALTHCHECK: ask JupyterLab's API and sshd themselves.

Healthy when GET /api/status answers 200 with the token (so authentication
works too) and sshd on port 22 greets with an SSH banner.  Services the
entrypoint did not start (batch jobs, SSH disabled) are read from
/run/tfmp/services and skipped.
"""
import json
import socket
import sys
import urllib.request

STATE = "/run/tfmp/services"


def main() -> int:
    try:
        with open(STATE, encoding="utf-8") as fh:
            services = json.load(fh)
    except OSError:
        print("unhealthy: not in serve mode (no /run/tfmp/services)")
        return 1
    if "jupyter" in services:
        with open(services["jupyter"]["token_file"], encoding="utf-8") as fh:
            token = fh.read().strip()
        req = urllib.request.Request(
            "http://127.0.0.1:8888/api/status", headers={"Authorization": "token " + token}
        )
        try:
            with urllib.request.urlopen(req, timeout=3) as resp:
                if resp.status != 200:
                    print(f"unhealthy: jupyter /api/status answered {resp.status}")
                    return 1
        except Exception as exc:  # any failure is "unhealthy", with the reason
            print(f"unhealthy: jupyter /api/status: {exc}")
            return 1
    if "sshd" in services:
        try:
            with socket.create_connection(("127.0.0.1", 22), timeout=3) as sock:
                # Identify ourselves like a client: sshd then logs one
                # "[preauth]" line that entrypoint.sh filters from the logs.
                sock.sendall(b"SSH-2.0-tfmp-healthcheck\r\n")
                banner = sock.recv(64)
        except OSError as exc:
            print(f"unhealthy: sshd: {exc}")
            return 1
        if not banner.startswith(b"SSH-2.0-"):
            print(f"unhealthy: sshd greeted with {banner!r}")
            return 1
    print("healthy: " + ", ".join(sorted(services)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
