"""Helpers shared by the image tests (imported by conftest.py and the test modules)."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Callable, Sequence

from tests.paths import ROOT as REPO
STANDIN_BASE = os.environ.get("STANDIN_IMAGE", "tfmp/standin-base:2.9.3")
TEST_IMAGE = os.environ.get("TFMP_TEST_IMAGE", "tfmp/train:test")
HOST_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
# The "host user" whose files the workspace must hold (the tests run as root).
HOST_UID = 4321
HOST_GID = 4321
# Passed to the shared stack; SSH sessions must see them unchanged (sshd's
# SetEnv quoting rules; see entrypoint.sh, save_environment).
PARITY_VALUES = {
    "TFMP_TEST_SPACES": "a value  with spaces",
    "TFMP_TEST_QUOTES": "it's 'single-quoted'",
    "TFMP_TEST_EQUALS": "key=value=more",
    "TFMP_TEST_DQUOTES": 'say "hi" # not a comment',
}


def run(cmd: Sequence[str], *, timeout: float = 60, check: bool = True, env: dict | None = None,
        input: str | None = None, cwd: Path | None = REPO) -> subprocess.CompletedProcess:
    """subprocess.run with a timeout always, text output, and a readable failure."""
    proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout,
                          env=env, input=input, cwd=cwd)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} -> exit {proc.returncode}\n"
                             f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}")
    return proc


def wait_until(predicate: Callable[[], object], timeout: float, interval: float = 0.25,
               what: str = "condition"):
    """Poll ``predicate`` until it returns a truthy value (returned) or time runs out."""
    deadline = time.monotonic() + timeout
    last_exc: Exception | None = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except Exception as exc:  # the predicate may fail while a service starts
            last_exc = exc
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}"
                                 + (f" (last error: {last_exc!r})" if last_exc else ""))
        time.sleep(interval)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def memlock_limit() -> str:
    """-1 (unlimited) as NVIDIA recommends, unless this engine may not raise it.

    Sandboxed engines (like the development machines here) have a hard
    RLIMIT_MEMLOCK they cannot exceed; the compose file takes MEMLOCK_LIMIT.
    """
    try:
        pid = run(["pgrep", "-o", "-x", "dockerd"], check=False).stdout.strip()
        for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
            if line.startswith("Max locked memory"):
                hard = line.split()[4]
                return "-1" if hard == "unlimited" else hard
    except (OSError, ValueError, IndexError):
        pass
    return "-1"


# Test containers have Docker run the image's own healthcheck every second, not every 5 (its
# HEALTHCHECK's interval): a test waiting for 'healthy' after a start or a restart then waits
# for the services, not for Docker's next check.  The check and its other settings are the
# image's.
FAST_HEALTH = "--health-interval=1s"


def health(container: str) -> str:
    out = run(["docker", "inspect", "-f",
               "{{if .State.Health}}{{.State.Health.Status}}{{else}}none{{end}}|{{.State.Status}}",
               container], check=False).stdout.strip()
    return out


def exec_in(container: str, *cmd: str, user: str | None = None, timeout: float = 60,
            check: bool = True) -> subprocess.CompletedProcess:
    args = ["docker", "exec"]
    if user:
        args += ["-u", user]
    return run(args + [container, *cmd], timeout=timeout, check=check)


def docker_run(image: str, *args: str, command: Sequence[str] = (), timeout: float = 180,
               check: bool = False) -> subprocess.CompletedProcess:
    """`docker run --rm` (a batch job) with a timeout."""
    return run(["docker", "run", "--rm", *args, image, *command], timeout=timeout, check=check)


def start_container(name: str, image: str, *args: str, command: Sequence[str] = ()) -> str:
    """`docker run -d` (a long-lived service container) named ``name``, its healthcheck run
    every second (FAST_HEALTH); returns the name.  The caller removes it."""
    run(["docker", "run", "-d", "--name", name, FAST_HEALTH, *args, image, *command], timeout=60)
    return name


def container_env(container: str) -> dict:
    out = exec_in(container, "env", "-0", user="tf").stdout
    return dict(item.split("=", 1) for item in out.split("\0") if "=" in item)


def json_of(proc: subprocess.CompletedProcess):
    return json.loads(proc.stdout)


def have(tool: str) -> bool:
    return shutil.which(tool) is not None


def websocket_url(base_url: str) -> str:
    """http://... -> ws://..., https://... -> wss://..."""
    assert base_url.startswith(("http://", "https://")), base_url
    return "ws" + base_url[len("http"):]


def websocket_tls(ca_file: str | Path | None) -> dict:
    """websocket-client's sslopt that trusts ``ca_file`` only (empty: its defaults)."""
    import ssl

    return {"ca_certs": str(ca_file), "cert_reqs": ssl.CERT_REQUIRED} if ca_file else {}


def run_on_kernel(base_url: str, token: str, kernel_id: str, code: str,
                  timeout: float = 120, ca_file: str | Path | None = None) -> list:
    """Run ``code`` on the running kernel ``kernel_id`` over its websocket channel; return the
    messages it sent for that request, up to its return to idle.  An https:// ``base_url``
    goes over wss://, trusting ``ca_file``."""
    import uuid

    import websocket

    messages: list = []
    ws = websocket.create_connection(
        websocket_url(base_url) + f"/api/kernels/{kernel_id}/channels",
        header=[f"Authorization: token {token}"], timeout=timeout,
        sslopt=websocket_tls(ca_file))
    try:
        msg_id = uuid.uuid4().hex
        ws.send(json.dumps({
            "header": {"msg_id": msg_id, "username": "test", "session": uuid.uuid4().hex,
                       "msg_type": "execute_request", "version": "5.3"},
            "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
            "content": {"code": code, "silent": False, "store_history": False,
                        "user_expressions": {}, "allow_stdin": False, "stop_on_error": True},
        }))

        def idle():
            msg = json.loads(ws.recv())
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                return False
            messages.append(msg)
            return msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle"

        wait_until(idle, timeout=timeout, interval=0, what="the kernel to finish")
    finally:
        ws.close()
    return messages


@contextlib.contextmanager
def kernel_session(base_url: str, token: str, code: str, timeout: float = 120,
                   ca_file: str | Path | None = None):
    """Start a kernel through Jupyter's REST API, run ``code`` over its websocket channel and
    yield the messages it sent for that request; the kernel (and anything it started, such
    as a TensorBoard) lives until the block ends, then it is deleted.

    An https:// ``base_url`` goes over TLS (the websocket over wss://); ``ca_file`` is then
    the certificate to trust, for requests and the websocket alike."""
    import requests

    headers = {"Authorization": f"token {token}"}
    verify = str(ca_file) if ca_file else True
    resp = requests.post(base_url + "/api/kernels", json={"name": "python3"}, headers=headers,
                         timeout=30, verify=verify)
    assert resp.status_code == 201, resp.text
    kernel_id = resp.json()["id"]
    try:
        yield run_on_kernel(base_url, token, kernel_id, code, timeout, ca_file)
    finally:
        requests.delete(f"{base_url}/api/kernels/{kernel_id}", headers=headers, timeout=30,
                        verify=verify)


def kernel_execute(base_url: str, token: str, code: str, timeout: float = 120,
                   ca_file: str | Path | None = None) -> tuple[str, list]:
    """Run ``code`` in a fresh kernel; return (its stdout text, the error tracebacks)."""
    with kernel_session(base_url, token, code, timeout, ca_file) as messages:
        out = "".join(m["content"]["text"] for m in messages
                      if m["msg_type"] == "stream" and m["content"]["name"] == "stdout")
        errors = ["\n".join(m["content"]["traceback"]) for m in messages
                  if m["msg_type"] == "error"]
    return out, errors
