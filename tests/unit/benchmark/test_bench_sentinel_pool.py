"""``bench_sentinel.py --pool``: the verdict on the sentinel's step cost is read from pooled
runs, so its arithmetic and its exit status are tested on recorded runs (no TensorFlow)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.paths import ROOT

SCRIPT = ROOT / "tests" / "benchmarks" / "bench_sentinel.py"
pytestmark = pytest.mark.host_only(reason="tests/benchmarks/ is not shipped in the image "
                                          "(.dockerignore)")


def _run_file(tmp_path, name, pairs, controls=(), against=(), jit=None):
    row = {"model": "mlp", "loop": "custom", "policy": "float32", "pair_costs": list(pairs),
           "pair_controls": list(controls)}
    if jit is not None:
        row["jit"] = jit
    if against:
        row["pair_against"] = list(against)
    path = tmp_path / name
    path.write_text(json.dumps({"step_cost": [row], "diagnosis": [], "args": {}}))
    return str(path)


def _pool(*paths):
    return subprocess.run([sys.executable, str(SCRIPT), "--pool", *paths],
                          capture_output=True, text=True, timeout=60)


def test_pairs_of_several_runs_are_pooled_and_the_median_decides(tmp_path):
    # Run one alone is under the target (median 2%); pooled with run two, the median of the
    # six pairs is 3.5%: over it, exit 1.
    one = _run_file(tmp_path, "one.json", [0.01, 0.02, 0.03], controls=[0.0, 0.01, -0.01])
    two = _run_file(tmp_path, "two.json", [0.04, 0.05, 0.06])
    alone = _pool(one)
    assert alone.returncode == 0, alone.stdout + alone.stderr
    assert "1 run(s), 3 pairs: median +2.0%" in alone.stdout
    assert "A/A 3 pairs, median +0.0%" in alone.stdout
    assert "targets: all met" in alone.stdout
    both = _pool(one, two)
    assert both.returncode == 1
    assert "2 run(s), 6 pairs: median +3.5%" in both.stdout
    assert "targets MISSED: mlp/custom/float32 +3.5%" in both.stdout


def test_the_against_side_is_pooled_copy_by_copy_against_on(tmp_path):
    # Copy by copy the other checkout costs 1, 2 and 4 points more than 'on'.
    run = _run_file(tmp_path, "run.json", [0.01, 0.02, 0.02], against=[0.02, 0.04, 0.06])
    out = _pool(run)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "--against: 3 pairs, median +4.0%" in out.stdout
    assert "minus 'on' copy by copy: median +2.0 points" in out.stdout


def test_runs_made_with_jit_pool_apart_from_the_runs_without_it(tmp_path):
    # Files written before --jit existed have no "jit": they pool with jit=False.
    old = _run_file(tmp_path, "old.json", [0.01, 0.02, 0.03])
    plain = _run_file(tmp_path, "plain.json", [0.02, 0.03, 0.04], jit=False)
    xla = _run_file(tmp_path, "xla.json", [0.05, 0.06, 0.07], jit=True)
    out = _pool(old, plain, xla)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "float32        2 run(s), 6 pairs: median +2.5%" in out.stdout
    assert "float32 --jit  1 run(s), 3 pairs: median +6.0%" in out.stdout
    assert "targets MISSED: mlp/custom/float32 --jit +6.0%" in out.stdout
    assert "mlp/custom/float32 +" not in out.stdout


def test_a_file_that_is_not_a_benchmark_json_is_one_line_and_exit_1(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    out = _pool(str(bad), str(tmp_path / "missing.json"))
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: --pool {bad}: not a bench_sentinel")
