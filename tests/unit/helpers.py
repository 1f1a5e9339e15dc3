"""What the unit tests import: ``python -m app`` as a user runs it, and its error lines."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from tests.paths import ROOT

# End-to-end runs of the app's own processes (signals, workers, the benchmark's children, the
# CLI's exits), whose outcome does not hang on the Keras version, run once a session: in the
# image's self-test, on the TF 2.9 the image ships (tests/conftest.py).  Each such process
# imports TensorFlow: 5 s for TF 2.21 on the host against 1.5 s in the image (2-core AMD EPYC
# without AVX-512), and CI on such a machine took 44 minutes with them run on both.  The
# Keras 3 paths they reach are tested in process, by the tests beside them.
ONCE_IN_THE_IMAGE = pytest.mark.image_self_tested(
    reason="an end-to-end run of the app's processes, the same under either Keras")


def app_env(env=None) -> dict:
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = str(ROOT) + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    for k in list(full_env):
        if k.startswith("TFMP_"):
            del full_env[k]
    full_env.update(env or {})
    return full_env


def run_app(*args, env=None, timeout=180, cwd=None):
    """Run ``python -m app ...`` in a subprocess, as a user would."""
    return subprocess.run([sys.executable, "-m", "app", *args], capture_output=True, text=True,
                          timeout=timeout, env=app_env(env), cwd=cwd or ROOT)


def start_app(*args, env=None, cwd=None) -> subprocess.Popen:
    """``run_app`` without waiting: several runs side by side (``communicate()`` each)."""
    return subprocess.Popen([sys.executable, "-m", "app", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=app_env(env),
                            cwd=cwd or ROOT)


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
