"""Fixtures for the image tests: real containers driven from the host.

* ``image``: the project's real Dockerfile, built once per session through
  ``docker compose build`` (BuildKit, with the host's CA bundle as the ``pip_ca``
  build secret) FROM the local stand-in base (tests/image/make_standin_base.sh
  is run if the base is missing).
* ``stack``: one ``docker compose up`` (GPU reservation reset by
  docker-compose.cpu.yml) shared by the tests that only look at it, on free
  ports bound to 127.0.0.1, the workspace bind-mounted from a host folder owned
  by a non-root "host user" UID.
* ``own_stack``: the same settings for one test that takes its stack down and
  up again (volumes kept between), removed at the end.
* ``container``: per-test ``docker run`` containers, always removed.

Every subprocess runs under a timeout; waiting is done with ``wait_until``.
"""
from __future__ import annotations

import fcntl
import os
import re
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import pytest

from image_helpers import (HOST_CA_BUNDLE, HOST_GID, HOST_UID, PARITY_VALUES, REPO,
                           STANDIN_BASE, TEST_IMAGE, free_port, health, memlock_limit, run,
                           start_container, wait_until)

@pytest.fixture(scope="session")
def docker_ok():
    run(["docker", "info", "--format", "{{.ServerVersion}}"], timeout=30)


@pytest.fixture(scope="session")
def image(docker_ok) -> str:
    """Build the real Dockerfile FROM the stand-in base, once per session.

    Under pytest-xdist a second worker may need it too (the self-test's own group): a lock per
    image tag makes it wait for the first build, and its own build is then all cache hits."""
    lock = Path(tempfile.gettempdir()) / ("tfmp-image-build-" + re.sub(r"\W", "_", TEST_IMAGE)
                                          + ".lock")
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        if run(["docker", "image", "inspect", STANDIN_BASE], check=False).returncode != 0:
            run(["bash", str(REPO / "tests/image/make_standin_base.sh")], timeout=1800)
        env = dict(os.environ, BASE_IMAGE=STANDIN_BASE, IMAGE=TEST_IMAGE,
                   COMPOSE_PROJECT_NAME="tfmp-build")
        if Path(HOST_CA_BUNDLE).is_file():
            env["PIP_CA_FILE"] = HOST_CA_BUNDLE
        run(["docker", "compose", "-f", "docker-compose.yml", "-f", "docker-compose.cpu.yml",
             "build", "tfmp"], timeout=1800, env=env)
    return TEST_IMAGE


@dataclass
class Stack:
    project: str
    env: dict
    workspace: Path
    jupyter_port: int
    ssh_port: int
    private_key: Path
    public_key: str
    files: list = field(default_factory=list)

    @property
    def container(self) -> str:
        return f"{self.project}-tfmp-1"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.jupyter_port}"

    def compose(self, *args: str, timeout: float = 120, check: bool = True):
        cmd = ["docker", "compose"]
        for f in self.files:
            cmd += ["-f", str(f)]
        return run(cmd + list(args), timeout=timeout, check=check, env=self.env)

    def token(self) -> str:
        return run(["docker", "exec", self.container, "cat", "/home/tf/.jupyter/token"],
                   timeout=20).stdout.strip()

    def wait_healthy(self, timeout: float = 90) -> None:
        wait_until(lambda: health(self.container).startswith("healthy"), timeout,
                   what=f"{self.container} to become healthy")


@pytest.fixture(scope="session")
def ssh_keypair(tmp_path_factory) -> tuple[Path, str]:
    d = tmp_path_factory.mktemp("ssh")
    key = d / "id_ed25519"
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "tests@host", "-f", str(key)])
    return key, (d / "id_ed25519.pub").read_text().strip()


def new_stack(image: str, ssh_keypair: tuple[Path, str], folder: Path) -> Stack:
    """A stack's settings (not started): its own project name, free ports, the workspace a
    bind mount of a host folder owned by the "host user", files under ``folder``."""
    project = f"tfmptest{uuid.uuid4().hex[:8]}"
    workspace = folder / "workspace"
    workspace.mkdir()
    os.chown(workspace, HOST_UID, HOST_GID)
    override = folder / "workspace-bind.yml"
    # Same mount target as the named volume: Compose replaces it with this bind mount.
    override.write_text(
        "services:\n  tfmp:\n    volumes:\n"
        f"      - type: bind\n        source: {workspace}\n        target: /workspace\n"
    )
    key, pub = ssh_keypair
    st = Stack(project=project, env={}, workspace=workspace, jupyter_port=free_port(),
               ssh_port=free_port(), private_key=key, public_key=pub,
               files=[REPO / "docker-compose.yml", REPO / "docker-compose.cpu.yml", override])
    st.env = dict(os.environ, COMPOSE_PROJECT_NAME=project, IMAGE=image,
                  BASE_IMAGE=STANDIN_BASE, BIND_ADDRESS="127.0.0.1",
                  JUPYTER_HOST_PORT=str(st.jupyter_port), SSH_HOST_PORT=str(st.ssh_port),
                  NB_UID=str(HOST_UID), NB_GID=str(HOST_GID), PUBLIC_KEY=pub,
                  MEMLOCK_LIMIT=memlock_limit(), PIP_CA_FILE="/dev/null",
                  TFMP_TEST_USER_VAR="passed-with-dash-e", **PARITY_VALUES)
    for var in ("JUPYTER_TOKEN", "SSH_PASSWORD"):
        st.env.pop(var, None)
    # A user variable passed to the container, which SSH sessions must see too.
    override.write_text(override.read_text()
                        + "    environment:\n      TFMP_TEST_USER_VAR: ${TFMP_TEST_USER_VAR}\n"
                        + "".join(f"      {var}: ${{{var}}}\n" for var in PARITY_VALUES))
    return st


def stop_stack(st: Stack) -> None:
    """Print the last log lines (for a failure's report), then remove it with its volumes."""
    logs = st.compose("logs", "--no-color", "--tail", "60", check=False, timeout=60)
    print(logs.stdout[-4000:])
    st.compose("down", "-v", "--remove-orphans", "-t", "5", check=False, timeout=120)


@pytest.fixture(scope="session")
def stack(image, ssh_keypair, tmp_path_factory):
    """`docker compose up -d` with the CPU override; one stack for the whole session."""
    st = new_stack(image, ssh_keypair, tmp_path_factory.mktemp("stack"))
    try:
        st.compose("up", "-d", "--no-build", "tfmp", timeout=180)
        st.wait_healthy()
        yield st
    finally:
        stop_stack(st)


@pytest.fixture
def own_stack(image, ssh_keypair, tmp_path):
    """A stack of the test's own, not started: for tests that take it down and up again
    (the test runs `up`); removed with its volumes at the end."""
    st = new_stack(image, ssh_keypair, tmp_path)
    try:
        yield st
    finally:
        stop_stack(st)


@pytest.fixture
def container(image):
    """Factory for `docker run -d` containers that are always removed after the test."""
    names: list[str] = []

    def start(*args: str, command: Sequence[str] = (), name: str | None = None) -> str:
        name = name or f"tfmp-t-{uuid.uuid4().hex[:10]}"
        names.append(name)
        return start_container(name, image, *args, command=command)

    yield start
    for name in names:
        run(["docker", "rm", "-f", "-v", name], check=False, timeout=60)
