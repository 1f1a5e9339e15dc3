"""Suite-wide test policy.

* ``gpu``-marked tests run only where TensorFlow sees a GPU (a user's GPU box,
  through the image's self-test); elsewhere they are skipped, with the reason.
* ``docker``-marked tests need a Docker engine.  On a developer machine without
  one they are skipped; under CI (``CI=true``) a missing engine is an error,
  never a silent skip, because CI is supposed to have started it (a usage error in one
  process; under pytest-xdist each Docker test fails with the reason).
* ``bf16_kernels(KIND, ...)``-marked tests need this TensorFlow to run those layer kinds
  (``app.machine.kernels.KINDS``) under mixed_bfloat16 here (TF 2.9 has no bfloat16 convolutions
  on a CPU without AVX-512); where ``app.machine.kernels`` says it cannot, they are skipped with a
  reason that starts with ``BF16_SKIP`` and names the kinds and the cause.
* ``--image-self-test`` (the image's ``self-test`` passes it): a skipped test fails the run
  unless it is ``gpu``-marked (no GPU here), ``host_only``-marked (it needs files the image
  does not ship; skipped there with the marker's reason) or skipped by the ``bf16_kernels``
  rule above (not any other skip of such a test).  A test that skips because the image
  lacks something it needs is a hole in the self-test, not a pass.
* Under pytest-xdist (pyproject's addopts: ``-n 2 --dist loadgroup``) the tests under
  tests/image are one ``xdist_group``, so one worker runs the one shared stack; a test there
  that marks a group of its own (the image's self-test: it needs the image, not the stack, and
  takes minutes) may run on the other worker, which then waits for the same image build
  (tests/image/conftest.py).  ``-n0`` runs everything in one process.
* ``image_self_tested(reason)``-marked tests (long end-to-end runs whose TF 2.9 run is the one
  that counts) run once a session: in the image's self-test when the session runs it
  (tests/image/test_run.py, with a Docker engine: CI), else on the host.
* ``in_containers(reason, twins=(...))``-marked tests (``host_only`` runs whose twins in
  tests/image drive the same runs in real containers) skip on the host when the session runs
  one of their twins: each a test file (``tests/image/test_x.py``) or one test in it
  (``tests/image/test_x.py::test_y``), from the repository root.  A twin that is not there
  fails the host test; with no twins named, any test of tests/image but the self-test skips it.
* ``TFMP_TEST_REVERSE=1`` runs the collected tests in reverse order: each test sets up what it
  needs (tests/image shares one image and one stack), so both orders must pass.
"""
from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

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
    """Why no GPU here (app/machine/gpu_problems.py, no TensorFlow import): the ids and the text."""
    try:
        from app.machine.gpu_problems import format_problems, problems_here
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


def pytest_addoption(parser):
    parser.addoption("--image-self-test", action="store_true", default=False,
                     help="the image's self-test: fail the run when a test other than the "
                          "gpu- or host_only-marked ones skips")


def _skip_allowed(item) -> bool:
    return item.get_closest_marker("gpu") is not None or \
        item.get_closest_marker("host_only") is not None or \
        getattr(item, "_tfmp_kernels_skip", False)


# The start of a bf16_kernels skip's reason (tests/image/test_run.py accepts exactly this).
BF16_SKIP = "this TensorFlow cannot run mixed_bfloat16 "


@functools.lru_cache(maxsize=None)
def _bf16_support():
    from app.machine import kernels  # imports TensorFlow: only when a marked test runs

    return kernels.support(kernels.PROBED_POLICY)


def bf16_missing(kinds) -> str | None:
    """The skip reason when mixed_bfloat16 cannot run one of ``kinds`` here, else None."""
    support = _bf16_support()
    bad = [k for k in kinds if not support.runs(k)]
    if not bad:
        return None
    cause = support.failing[bad[0]]
    return f"{BF16_SKIP}{', '.join(bad)} layers here: {cause.text(bad[0])}"


def pytest_runtest_setup(item):
    docker_fail = getattr(item, "_tfmp_docker_fail", None)
    if docker_fail:
        pytest.fail(docker_fail, pytrace=False)
    missing_twin = getattr(item, "_tfmp_missing_twin", None)
    if missing_twin:
        pytest.fail(missing_twin, pytrace=False)
    marker = item.get_closest_marker("bf16_kernels")
    if marker is not None:
        reason = bf16_missing(marker.args)
        if reason:
            item._tfmp_kernels_skip = True
            pytest.skip(reason)


IMAGE_TESTS = Path(__file__).resolve().parent / "image"
# The repository root, which in_containers twins are named from.
ROOT = IMAGE_TESTS.parents[1]


# tryfirst: before pytest-xdist's own hook reads the xdist_group marks (--dist loadgroup).
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        if IMAGE_TESTS in Path(item.path).resolve().parents and \
                item.get_closest_marker("xdist_group") is None:
            # One pytest-xdist worker runs the image tests: one image build, one shared stack.
            # (An image test with a group of its own needs the image only, not the stack.)
            item.add_marker(pytest.mark.xdist_group("image"))
    # The longest test first: the image's self-test (about 20 minutes on 2 cores, one
    # process) is the session's critical path.  pytest-xdist hands out work in this order
    # (pyproject: --no-loadscope-reorder), so one worker starts it at once while the other
    # takes the image tests and then the unit tests; queued behind other work, it ended the
    # session minutes after everything else.
    items.sort(key=lambda item: item.name != SELF_TEST)
    if os.environ.get("TFMP_TEST_REVERSE") == "1":
        # Proof that no test leans on an earlier one's side effects (a file, a container, a
        # restarted stack): the same tests, last first.  Not for everyday runs.
        items.reverse()
    if config.getoption("--image-self-test"):
        for item in items:
            marker = item.get_closest_marker("host_only")
            if marker is not None:
                item.add_marker(pytest.mark.skip(
                    reason="host only: " + marker.kwargs.get("reason", "(no reason given)")))
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
            message = f"CI=true but Docker tests cannot run: {problem}"
            if not hasattr(config, "workerinput"):
                raise pytest.UsageError(message)
            # A pytest-xdist worker cannot end the session with a usage error (its controller
            # reports a crash without the reason): each Docker test fails with it instead.
            for item in docker_items:
                item._tfmp_docker_fail = message
        elif problem:
            skip_docker = pytest.mark.skip(reason=problem)
            for item in docker_items:
                item.add_marker(skip_docker)


# The image's self-test, as tests/image/test_run.py runs it (its node name).
SELF_TEST = "test_self_test_runs_the_apps_unit_tests_in_the_image"


def _twins(marker) -> list:
    """An ``in_containers`` marker's twins: (file, test name or None for the whole file)."""
    twins = []
    for twin in marker.kwargs.get("twins", ()):
        path, _, name = twin.partition("::")
        twins.append((ROOT / path, name or None))
    return twins


def _missing_twin(marker) -> str | None:
    """Why a twin the marker names is not there, else None: a renamed or moved image test
    would otherwise leave its host twin running beside it in every session, unnoticed."""
    for twin, (path, name) in zip(marker.kwargs.get("twins", ()), _twins(marker)):
        if not path.is_file() or (name and f"def {name}(" not in path.read_text(encoding="utf-8")):
            return f"in_containers names a twin that does not exist: {twin}"
    return None


def _is_twin(item, twins) -> bool:
    path = Path(item.path).resolve()
    return any(path == twin_path and name in (None, getattr(item, "originalname", item.name))
               for twin_path, name in twins)


def pytest_collection_finish(session):
    """``image_self_tested`` tests skip on the host when this session also runs the image's
    self-test (selected, and a Docker engine to run it): it runs them on the TF 2.9 the image
    ships.  ``in_containers`` tests (host-only runs whose twins in tests/image drive the same
    runs in real containers) skip on the host when this session runs one of their twins (any
    image test but the self-test when the marker names none).
    Decided here, on the final selection: a self-test or image test left out by ``-k`` or
    ``--deselect`` runs nothing, so they run here, as without the image tests or an engine;
    so does a host test whose twins are not selected, though other image tests are."""
    if session.config.getoption("--image-self-test"):
        return
    items = session.items
    for item in items:
        marker = item.get_closest_marker("in_containers")
        if marker is not None:
            item._tfmp_missing_twin = _missing_twin(marker)
    if not any(item.get_closest_marker(name) for item in items
               for name in ("image_self_tested", "in_containers")) or _docker_problem():
        return
    in_image = [item for item in items if IMAGE_TESTS in Path(item.path).resolve().parents]
    self_test_runs = any(SELF_TEST in item.name for item in in_image)
    image_tests_run = any(SELF_TEST not in item.name for item in in_image)
    for item in items:
        marker = item.get_closest_marker("image_self_tested")
        if marker is not None and self_test_runs:
            item.add_marker(pytest.mark.skip(
                reason="run by the image's self-test in this session, on TF 2.9: "
                       f"{marker.kwargs.get('reason', '')} (tests/unit alone runs it here)"))
        marker = item.get_closest_marker("in_containers")
        if marker is None or item._tfmp_missing_twin:
            continue
        twins = _twins(marker)
        twin_runs = any(_is_twin(other, twins) for other in in_image) if twins else image_tests_run
        if twin_runs:
            item.add_marker(pytest.mark.skip(
                reason=f"left to tests/image in this session: {marker.kwargs.get('reason', '')} "
                       "(tests/unit alone runs it here)"))


# --- the image's self-test: no hidden skips --------------------------------------------------

class _SkipWatch:
    """Collects skipped tests that may not skip (see the module docstring)."""

    def __init__(self):
        self.unexpected: list = []

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        report = outcome.get_result()
        if report.skipped and not hasattr(report, "wasxfail") and not _skip_allowed(item):
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
            self.unexpected.append((item.nodeid, str(reason)))

    def pytest_terminal_summary(self, terminalreporter):
        if self.unexpected:
            terminalreporter.section("skips that the image's self-test does not allow")
            for nodeid, reason in self.unexpected:
                terminalreporter.write_line(f"UNEXPECTED SKIP {nodeid}: {reason}")
            terminalreporter.write_line(
                f"error: {len(self.unexpected)} test(s) skipped in the image; allowed: "
                "gpu-marked tests without a GPU, host_only-marked tests")

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session, exitstatus):
        if self.unexpected and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_configure(config):
    if config.getoption("--image-self-test"):
        config.pluginmanager.register(_SkipWatch(), "tfmp-skip-watch")


# --- for the GPU tests -------------------------------------------------------------------------

@pytest.fixture
def tensor_core_gpu() -> bool:
    """Every visible GPU has Tensor Cores (app.machine.hardware's rule, itself checked against a table
    of real GPUs in tests/gpu/test_gpu_precision.py)."""
    from app.machine import hardware

    hw = hardware.detect()
    return bool(hw.gpus) and all(g.tensor_cores for g in hw.gpus)
