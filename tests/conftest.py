"""Suite-wide test policy.

* ``gpu``-marked tests run only where TensorFlow sees a GPU (a user's GPU box,
  through the image's self-test); elsewhere they are skipped, with the reason.
* ``docker``-marked tests need a Docker engine.  On a developer machine without
  one they are skipped; under CI (``CI=true``) a missing engine is an error,
  never a silent skip, because CI is supposed to have started it.
"""
from __future__ import annotations

import functools
import os
import shutil
import subprocess

import pytest


@functools.lru_cache(maxsize=None)
def _gpu_count() -> int:
    import tensorflow as tf  # imported lazily: only when a gpu test is collected

    return len(tf.config.list_physical_devices("GPU"))


@functools.lru_cache(maxsize=None)
def _docker_problem() -> str | None:
    if shutil.which("docker") is None:
        return "the docker CLI is not installed"
    try:
        proc = subprocess.run(
            ["docker", "info", "--format", "{{.ServerVersion}}"],
            capture_output=True, text=True, timeout=30,
        )
    except subprocess.TimeoutExpired:
        return "`docker info` timed out"
    if proc.returncode != 0:
        return "the Docker engine is not reachable: " + proc.stderr.strip().splitlines()[-1:][0] if proc.stderr.strip() else "the Docker engine is not reachable"
    return None


@functools.lru_cache(maxsize=None)
def _gpu_problem_lines() -> tuple:
    """Why no GPU here (app/gpu_problems.py, no TensorFlow import): the ids and the text."""
    try:
        from app.gpu_problems import format_problems, problems_here
    except ImportError:  # an app from before gpu_problems on the path
        return (), ()
    problems = problems_here()
    return tuple(p["id"] for p in problems), tuple(format_problems(problems))


def pytest_report_header(config):
    """The self-test's header says why a GPU box's GPU tests would skip."""
    ids, lines = _gpu_problem_lines()
    return ["GPU problems:" + ("" if ids else " none")] + list(lines)


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if gpu_items and _gpu_count() == 0:
        why = ", ".join(_gpu_problem_lines()[0])
        skip_gpu = pytest.mark.skip(reason="no GPU visible to TensorFlow on this machine"
                                    + (f" ({why}: see the header)" if why else ""))
        for item in gpu_items:
            item.add_marker(skip_gpu)

    docker_items = [item for item in items if item.get_closest_marker("docker")]
    if docker_items:
        problem = _docker_problem()
        if problem and _in_ci():
            raise pytest.UsageError(f"CI=true but Docker tests cannot run: {problem}")
        if problem:
            skip_docker = pytest.mark.skip(reason=problem)
            for item in docker_items:
                item.add_marker(skip_docker)
