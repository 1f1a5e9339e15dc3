"""What the unit tests import: ``python -m app`` as a user runs it, and its error lines."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

from tests.paths import ROOT


def run_app(*args, env=None, timeout=180, cwd=None):
    """Run ``python -m app ...`` in a subprocess, as a user would."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = str(ROOT) + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    for k in list(full_env):
        if k.startswith("TFMP_"):
            del full_env[k]
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "app", *args], capture_output=True, text=True,
                          timeout=timeout, env=full_env, cwd=cwd or ROOT)


def error_lines(stderr: str):
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def free_ports(n):
    """``n`` free localhost ports (for a multi-worker job's TF_CONFIG)."""
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def tf_config(ports, index):
    """TF_CONFIG of worker ``index`` in a cluster of localhost workers (no chief task)."""
    return json.dumps({"cluster": {"worker": [f"localhost:{p}" for p in ports]},
                       "task": {"type": "worker", "index": index}})


def user_module(path: str):
    """A user's file (tests/unit/user_models/...) imported by its path, as the app does."""
    import importlib.util

    name = os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
