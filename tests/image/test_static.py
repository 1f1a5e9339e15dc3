"""Lint and consistency checks of the image's files (no container needed, but
they belong to the image suite and run wherever it runs)."""
from __future__ import annotations

import os
import re
import shutil
import sys

import pytest

from image_helpers import REPO, run

pytestmark = pytest.mark.docker

SHELL_SCRIPTS = sorted(
    {REPO / "entrypoint.sh", REPO / ".ci/run", REPO / "docker/profile-container-env.sh"}
    | set((REPO / "docker").glob("*.sh"))
    | set((REPO / "docker/entrypoint.d").glob("*.sh"))
    | set((REPO / "tests/image").glob("*.sh"))
    | set((REPO / "tests/benchmarks").glob("*.sh"))
)


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed (.ci/run installs it)")
    return path


def test_hadolint_dockerfile():
    proc = run([_tool("hadolint"), "--failure-threshold", "info", "Dockerfile"], check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("script", SHELL_SCRIPTS, ids=lambda p: str(p.relative_to(REPO)))
def test_shellcheck(script):
    proc = run([_tool("shellcheck"), "--external-sources", str(script)], check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _requirement_names(lines) -> set[str]:
    names = set()
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if line:
            names.add(re.split(r"[<>=!~\[; ]", line, maxsplit=1)[0].lower().replace("_", "-"))
    return names


def test_image_requirements_cover_the_package_dependencies():
    """The image installs `app` without resolving its dependencies (fast rebuilds),
    so docker/requirements.txt must list every runtime dependency of pyproject.toml."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # the test extra installs tomli (the same parser) on older Pythons
        import tomli as tomllib

    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    image_reqs = _requirement_names((REPO / "docker/requirements.txt").read_text().splitlines())
    missing = _requirement_names(deps) - image_reqs
    assert not missing, f"add to docker/requirements.txt: {sorted(missing)}"


def test_constraints_pin_what_tf_2_9_needs():
    text = (REPO / "docker/constraints.txt").read_text()
    assert re.search(r"^numpy[^\n]*<2\b", text, re.M)
    assert re.search(r"^protobuf[^\n]*<3\.20\b", text, re.M)
    assert re.search(r"^tensorflow==2\.9\.3$", text, re.M)


@pytest.mark.parametrize("files", [["docker-compose.yml"],
                                   ["docker-compose.yml", "docker-compose.cpu.yml"]])
def test_compose_files_are_valid(files):
    args = ["docker", "compose"]
    for f in files:
        args += ["-f", f]
    proc = run(args + ["--profile", "batch", "config", "--format", "json"], timeout=60)
    import json

    cfg = json.loads(proc.stdout)
    jupyter = cfg["services"]["tfmp"]
    has_gpu = "deploy" in jupyter
    assert has_gpu == (len(files) == 1)
    assert {p["target"] for p in jupyter["ports"]} == {8888, 22}
    assert all(p["host_ip"] == "127.0.0.1" for p in jupyter["ports"])
    assert jupyter["shm_size"] and jupyter["ulimits"]["stack"] == 67108864
    assert jupyter["environment"]["JUPYTER_UI"] == os.environ.get("JUPYTER_UI", "lab")
    assert cfg["services"]["train"]["command"] == ["tfmp", "train"]
    # The home is one named volume, shared by the service and batch jobs (docs/image.md,
    # "What persists"); Docker seeds an empty named volume from the image, never a bind mount.
    for service in ("tfmp", "train"):
        mounts = {v["target"]: v for v in cfg["services"][service]["volumes"]}
        assert mounts["/home/tf"]["type"] == "volume" and mounts["/home/tf"]["source"] == "home"
        assert mounts["/workspace"]["source"] == "workspace"
    assert "home" in cfg["volumes"]
