"""tests/conftest.py's ``in_containers`` rule: a host test whose twin in tests/image drives the
same run in real containers skips on the host only when the session runs that twin, not
whenever some image test is selected (a host test left to an image test that never ran is
coverage lost without a word).

Each case is a real pytest session in a subprocess, with a ``docker`` on PATH that answers
``docker info`` (the rule applies only where an engine could run the image tests), so the
answer does not depend on this machine's engine.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.paths import ROOT

pytestmark = pytest.mark.host_only(
    reason="host sessions' rule for tests/image, which the image does not ship (its "
           "self-test returns before the rule)")

HOST_TESTS = '''
import pytest

@pytest.mark.in_containers(reason="by test_twin", twins=("tests/image/test_twins.py::test_twin",))
def test_named_test():
    pass

@pytest.mark.in_containers(reason="by test_twins.py", twins=("tests/image/test_twins.py",))
def test_named_file():
    pass

@pytest.mark.in_containers(reason="by tests/image")
def test_no_twin_named():
    pass
'''

IMAGE_TESTS = {
    "test_twins.py": "def test_twin():\n    pass\n\n\ndef test_sibling():\n    pass\n",
    "test_other.py": "def test_other():\n    pass\n",
}

FAKE_DOCKER = "#!/bin/sh\necho 99.0.0\n"


def _fake_docker(folder: Path) -> Path:
    bin_dir = folder / "bin"
    bin_dir.mkdir(parents=True)
    docker = bin_dir / "docker"
    docker.write_text(FAKE_DOCKER)
    docker.chmod(0o755)
    return bin_dir


def _env(bin_dir: Path, pythonpath: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_ADDOPTS")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = pythonpath
    return env


@pytest.fixture
def tree(tmp_path):
    """A copy of the suite's conftest over tiny host and image tests, and a fake docker."""
    (tmp_path / "tests" / "image").mkdir(parents=True)
    (tmp_path / "tests" / "unit").mkdir()
    shutil.copy(ROOT / "tests" / "conftest.py", tmp_path / "tests" / "conftest.py")
    for name, text in IMAGE_TESTS.items():
        (tmp_path / "tests" / "image" / name).write_text(text)
    (tmp_path / "tests" / "unit" / "test_host.py").write_text(HOST_TESTS)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    _fake_docker(tmp_path)
    return tmp_path


def _run(tree: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
         "-p", "no:warnings", "-o", "addopts=", *args],
        cwd=tree, capture_output=True, text=True, timeout=120,
        env=_env(tree / "bin", str(ROOT)))


def _outcomes(tree: Path, *selection: str) -> dict:
    """Each host test's outcome (passed, skipped, failed) in a session that selects these."""
    report = tree / "report.xml"
    proc = _run(tree, f"--junitxml={report}", *selection)
    assert proc.returncode in (0, 1), proc.stdout[-3000:] + proc.stderr[-3000:]
    outcomes = {}
    for case in ET.parse(report).iter("testcase"):
        if not case.get("classname", "").endswith("test_host"):
            continue
        kinds = {child.tag for child in case}
        outcomes[case.get("name")] = ("skipped" if "skipped" in kinds else
                                      "failed" if kinds & {"failure", "error"} else "passed")
    return outcomes


HOST = "tests/unit/test_host.py"


def test_an_image_test_that_is_no_twin_leaves_the_named_twins_hosts_running(tree):
    assert _outcomes(tree, HOST, "tests/image/test_other.py") == {
        "test_named_test": "passed", "test_named_file": "passed",
        # no twins named: any image test takes it, as before twins could be named
        "test_no_twin_named": "skipped"}


def test_a_selected_twin_skips_its_host_test(tree):
    assert _outcomes(tree, HOST, "tests/image/test_twins.py::test_twin") == {
        "test_named_test": "skipped", "test_named_file": "skipped",
        "test_no_twin_named": "skipped"}


def test_a_named_test_is_its_twin_not_the_rest_of_its_file(tree):
    assert _outcomes(tree, HOST, "tests/image/test_twins.py::test_sibling") == {
        "test_named_test": "passed", "test_named_file": "skipped",
        "test_no_twin_named": "skipped"}


def test_without_image_tests_every_host_test_runs(tree):
    assert set(_outcomes(tree, HOST).values()) == {"passed"}


def test_a_twin_that_does_not_exist_fails_its_host_test(tree):
    (tree / "tests" / "unit" / "test_stale.py").write_text(textwrap.dedent('''
        import pytest

        @pytest.mark.in_containers(reason="r", twins=("tests/image/test_twins.py::test_gone",))
        def test_host_gone_test():
            pass

        @pytest.mark.in_containers(reason="r", twins=("tests/image/test_gone.py",))
        def test_host_gone_file():
            pass
    '''))
    proc = _run(tree, "tests/unit/test_stale.py")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "2 errors" in proc.stdout, proc.stdout[-3000:]   # failed at setup
    for twin in ("tests/image/test_twins.py::test_gone", "tests/image/test_gone.py"):
        assert f"in_containers names a twin that does not exist: {twin}" in proc.stdout


# ---- the suite's own markers ----------------------------------------------------------------

REPORT_PLUGIN = '''
import pytest

@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session):
    for item in session.items:
        if item.get_closest_marker("in_containers") is None:
            continue
        skipped = any(True for _ in item.iter_markers("skip"))
        missing = getattr(item, "_tfmp_missing_twin", None)
        print(f"TWIN-RULE {item.nodeid} {'missing' if missing else 'skipped' if skipped else 'runs'}")
'''

MARKED = ["tests/unit/run_folder/test_run_lock.py", "tests/unit/commands/test_cli_outcomes.py",
          "tests/unit/benchmark/test_benchmark_cli.py", "tests/unit/tuner/test_tune_real.py"]


def _collected(tmp_path, *selection: str) -> dict:
    """What the suite's conftest decides for each in_containers test of this real selection."""
    (tmp_path / "twin_rule_report.py").write_text(REPORT_PLUGIN)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "-p", "no:xdist", "-p", "no:warnings", "-o", "addopts=", "-p", "twin_rule_report",
         *selection],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env=_env(_fake_docker(tmp_path), f"{tmp_path}{os.pathsep}{ROOT}"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [line.split()[1:] for line in proc.stdout.splitlines() if line.startswith("TWIN-RULE ")]
    return dict(lines)


def test_the_suites_host_tests_run_beside_an_image_test_that_is_no_twin(tmp_path):
    """The reviewer's case: test_static.py is no twin of any of them; and every twin named is there."""
    decided = _collected(tmp_path, *MARKED,
                         "tests/image/test_static.py::test_constraints_pin_what_tf_2_9_needs")
    assert len(decided) == 6 and set(decided.values()) == {"runs"}, decided


def test_the_suites_host_tests_skip_beside_their_twins(tmp_path):
    decided = _collected(
        tmp_path, "tests/unit/run_folder/test_run_lock.py", "tests/unit/commands/test_cli_outcomes.py",
        "tests/image/test_stack.py::test_one_run_per_output_folder_over_ssh",
        "tests/image/test_interrupt_image.py::test_sigint_to_a_training_container_exits_130")
    assert decided == {
        "tests/unit/run_folder/test_run_lock.py::"
        "test_second_train_into_a_live_runs_folder_exits_2_and_touches_nothing": "skipped",
        "tests/unit/run_folder/test_run_lock.py::"
        "test_a_run_killed_with_sigkill_leaves_the_folder_free_for_resume": "skipped",
        "tests/unit/commands/test_cli_outcomes.py::"
        "test_a_signal_stops_with_its_code_and_a_checkpoint_and_resume_finishes[SIGTERM]": "runs",
        "tests/unit/commands/test_cli_outcomes.py::"
        "test_a_signal_stops_with_its_code_and_a_checkpoint_and_resume_finishes[SIGINT]": "skipped",
    }, decided
