"""The tuner's pure parts besides the search: memory budgets (sizes, cgroup v1/v2 limits,
MemAvailable), reading a tune.json for ``train --tuned`` (and rejecting a damaged one or one
from another model), merging it with explicit flags, the linear learning-rate rule, the
report's table, and bad input on the command line (one line, exit 2, nothing written)."""
from __future__ import annotations

import json
import os

import pytest

from app.core.errors import UsageError
from app.machine import memory
from app.tuner import budget, report, search
from app.training import tuned
from app.tuner.arguments import check_margin, check_max_batch, parse_precisions
from tests.unit.helpers import error_lines, run_app

GIB, MIB = 2**30, 2**20


# ---- sizes and budgets ---------------------------------------------------------------------

@pytest.mark.parametrize("text,expected", [
    ("2GiB", 2 * GIB), ("1500MiB", 1500 * MIB), ("2g", 2 * GIB), ("2GB", 2 * 10**9),
    ("1.5GiB", int(1.5 * GIB)), ("268435456", 256 * MIB), (" 512 mib ", 512 * MIB),
])
def test_sizes(text, expected):
    assert budget.parse_size(text) == expected


@pytest.mark.parametrize("text", ["lots", "2 parsecs", "-1GiB", "", "10MiB", "GiB"])
def test_bad_sizes(text):
    with pytest.raises(UsageError) as err:
        budget.parse_size(text)
    assert "allowed:" in err.value.line()


def _reader(files):
    return lambda path: files.get(path)


def test_cgroup_v2_limit_is_the_tightest_on_the_path():
    files = {"/sys/fs/cgroup/a/b/memory.max": "max\n", "/sys/fs/cgroup/a/memory.max": "4294967296\n",
             "/sys/fs/cgroup/memory.max": None}
    free = memory.cgroup_free("0::/a/b\n", _reader(files))
    assert (free.limit, free.path) == (4 * GIB, "/sys/fs/cgroup/a/memory.max")


def test_cgroup_v1_limit_and_its_unlimited_value():
    proc = "12:pids:/x\n4:memory:/docker/abc\n0::/\n"
    files = {"/sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes": "2147483648\n",
             "/sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n"}
    assert memory.cgroup_free(proc, _reader(files)).limit == 2 * GIB
    files["/sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes"] = "9223372036854771712"
    assert memory.cgroup_free(proc, _reader(files)) is None


def test_inside_a_container_the_mount_top_holds_the_limit():
    # /proc/self/cgroup names the host's path; the container sees its own cgroup at the top
    files = {"/sys/fs/cgroup/memory.max": "1073741824"}
    assert memory.cgroup_free("0::/docker/123\n", _reader(files)).limit == GIB


def test_cpu_auto_is_the_limit_else_mem_available():
    meminfo = "MemTotal: 24000000 kB\nMemAvailable:   20000000 kB\n"
    files = {"/proc/self/cgroup": "0::/\n", "/proc/meminfo": meminfo}
    b = budget.cpu_auto_budget(_reader(files))
    assert b.bytes == 20000000 * 1024 and "available" in b.source
    files["/sys/fs/cgroup/memory.max"] = "3221225472"
    b = budget.cpu_auto_budget(_reader(files))
    assert b.bytes == 3 * GIB and "container" in b.source


def test_resolve_explicit_wins_and_gpu_auto_is_the_gpu_memory():
    cpu = lambda: budget.Budget(7, "cpu")  # noqa: E731
    assert budget.resolve("2GiB", 16 * GIB, cpu).bytes == 2 * GIB
    assert budget.resolve("auto", 16 * GIB, cpu).bytes == 16 * GIB
    assert budget.resolve("auto", None, cpu).source == "cpu"
    assert budget.resolve(None, None, cpu).source == "cpu"


def test_a_budget_beyond_the_machine_is_honoured_and_said(monkeypatch):
    notes = []
    given = budget.resolve_with_gpu("10TiB", [], notes)   # this machine's memory, read
    assert given.bytes == 10 * 1024 * GIB and given.source == "--memory-budget"
    assert len(notes) == 1 and notes[0].startswith("--memory-budget 10240.00 GiB is more "
                                                    "than "), notes
    assert "GiB, the memory available when the tune started" in notes[0]
    assert "runs out of memory instead of being kept out by it" in notes[0]
    assert budget.resolve_with_gpu("1GiB", [], notes) and len(notes) == 1
    assert budget.resolve_with_gpu("auto", [], notes) and len(notes) == 1

    from app.machine import nvml

    monkeypatch.setattr(nvml, "tensorflow_gpu0", lambda: None)   # NVML not there
    gpu = [{"memory_bytes": 16 * GIB}]
    notes = []
    assert budget.resolve_with_gpu("24GiB", gpu, notes).bytes == 24 * GIB
    assert notes == ["--memory-budget 24.00 GiB is more than 16.00 GiB, the memory TensorFlow "
                     "can use on GPU 0: trials are planned up to the budget, so one that "
                     "outgrows 16.00 GiB runs out of memory instead of being kept out by it; "
                     "--memory-budget auto uses what is there"]
    assert budget.resolve_with_gpu("8GiB", gpu, []).bytes == 8 * GIB


# ---- flags ------------------------------------------------------------------------------

def test_precision_margin_cap_checks():
    assert parse_precisions("float32,auto") == ["float32", "auto"]
    assert parse_precisions(None) is None
    assert parse_precisions("float32,") == ["float32"]
    for bad in ("fp8", ",", ["float32", "half"]):
        with pytest.raises(UsageError):
            parse_precisions(bad)
    assert check_margin(0) == 0.0 and check_margin("0.5") == 0.5
    for bad in (-0.1, 0.9, 1, "x", None):
        with pytest.raises(UsageError):
            check_margin(bad)
    assert check_max_batch(None) == search.DEFAULT_CAP and check_max_batch(8) == 8
    for bad in (7, 0, -8, 8.0, True):
        with pytest.raises(UsageError):
            check_max_batch(bad)


@pytest.mark.parametrize("flags,needle", [
    (["--precision", "fp8"], "precision must be a comma-separated list of"),
    (["--precision", "float32,,auto"], "precision must be a comma-separated list of"),
    (["--memory-budget", "lots"], "memory_budget is not a size"),
    (["--margin", "0.95"], "margin must be in [0, 0.9)"),
    (["--margin", "-0.1"], "margin must be in [0, 0.9)"),
    (["--max-batch", "4"], "max_batch must be an integer of at least 8"),
    (["--time-budget", "0"], "time_budget must be a positive"),
    # what the trials train: train's own rules (config.validate), before any trial
    (["--learning-rate", "-1"], "learning_rate must be a finite number > 0"),
    (["--image-size", "0"], "image_size must be at least 1"),
    (["--max-train-samples", "0"], "max_train_samples must be at least 1"),
    (["--num-classes", "0"], "num_classes must be at least 1"),
    (["--input-shape", "a,b"], "input_shape must be positive integers"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path, flags, needle):
    out = tmp_path / "tune"
    proc = run_app("tune", "--model", "mlp", "--dataset", "synthetic", "--output", str(out),
                   *flags, timeout=60)
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], lines
    assert not out.exists()


def test_bad_model_pairing_and_unknown_model_exit_2(tmp_path):
    for model, dataset in (("nosuchnet", "synthetic"), ("resnet", "mnist")):
        proc = run_app("tune", "--model", model, "--dataset", dataset,
                       "--output", str(tmp_path / "t"), timeout=60)
        assert proc.returncode == 2 and len(error_lines(proc.stderr)) == 1, proc.stderr
        assert not (tmp_path / "t").exists()


# ---- tune.json for train --tuned ---------------------------------------------------------

def _doc(**over):
    doc = {"schema": report.SCHEMA, "task": {"model": "resnet", "dataset": "cifar10"},
           "budget_bytes": 2 * GIB, "margin": 0.1,
           "precisions": {"float32": {"max_batch": 568, "best_batch": 128,
                                      "best_samples_per_second": 450.0, "trials": []}},
           "choice": {"precision": "mixed_bfloat16", "batch_size": 256,
                      "samples_per_second": 610.0},
           "verified": {"fits": True, "precision": "mixed_bfloat16", "batch_size": 256}}
    doc.update(over)
    return doc


def _write(tmp_path, doc, raw=None):
    path = tmp_path / "tune.json"
    path.write_text(raw if raw is not None else json.dumps(doc), encoding="utf-8")
    return str(path)


def test_read_tuned_returns_the_verified_choice(tmp_path):
    path = _write(tmp_path, _doc())
    t = tuned.read_tuned(path, "resnet", "cifar10")
    assert (t.precision, t.batch_size, t.budget_bytes) == ("mixed_bfloat16", 256, 2 * GIB)
    assert tuned.read_tuned(str(tmp_path), "resnet", "cifar10") == t   # the folder works too


@pytest.mark.parametrize("doc,raw,needle", [
    (None, "{not json", "not a usable tune file"),
    (None, "", "not a usable tune file"),
    ({"schema": "something/else"}, None, "not a usable tune file"),
    (_doc(choice=None), None, "no size fitted"),
    (_doc(choice={"precision": "fp8", "batch_size": 256}), None, "fp8"),
    (_doc(choice={"precision": "float32", "batch_size": "big"}), None, "batch_size"),
    (_doc(verified={"fits": False}), None, "not verified"),
    (_doc(verified={"fits": True, "precision": "mixed_bfloat16", "batch_size": 512}), None,
     "not verified"),
    (_doc(budget_bytes="2GiB"), None, "budget_bytes"),
    (_doc(task={"model": "mlp", "dataset": "cifar10"}), None, "another job"),
    (_doc(task={"model": "resnet", "dataset": "synthetic"}), None, "another job"),
])
def test_a_damaged_or_foreign_tune_json_is_one_usage_error(tmp_path, doc, raw, needle):
    path = _write(tmp_path, doc, raw)
    with pytest.raises(UsageError) as err:
        tuned.read_tuned(path, "resnet", "cifar10")
    assert needle in err.value.line() and "\n" not in err.value.line()


def test_best_batches_for_the_benchmark(tmp_path):
    doc = _doc()
    doc["precisions"]["mixed_bfloat16"] = {"max_batch": 744, "best_batch": 256}
    doc["precisions"]["mixed_float16"] = {"max_batch": None, "best_batch": None}
    path = _write(tmp_path, doc)
    assert tuned.best_batches(path, "resnet", "cifar10") == {"float32": 128,
                                                             "mixed_bfloat16": 256}
    with pytest.raises(UsageError, match="another job"):
        tuned.best_batches(path, "mlp", "cifar10")


def test_a_missing_tune_json(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        tuned.read_tuned(str(tmp_path / "nope.json"), "resnet", "cifar10")


def test_explicit_flags_win_over_the_tuned_values(tmp_path):
    t = tuned.read_tuned(_write(tmp_path, _doc()), "resnet", "cifar10")
    m = tuned.merge(t, None, None)
    assert (m.precision, m.batch_size, m.notes) == ("mixed_bfloat16", 256, [])
    m = tuned.merge(t, None, 64)
    assert (m.precision, m.batch_size) == ("mixed_bfloat16", 64) and "overrides" in m.notes[0]
    m = tuned.merge(t, "float32", None)
    assert (m.precision, m.batch_size) == ("float32", 256)
    assert any("may not fit" in n for n in m.notes)


def test_linear_learning_rate_scaling():
    assert tuned.scaled_learning_rate("none", 1e-3, 128, 512) == 1e-3
    assert tuned.scaled_learning_rate("linear", 1e-3, 128, 512) == pytest.approx(4e-3)
    assert tuned.scaled_learning_rate("linear", 1e-3, 128, 64) == pytest.approx(5e-4)
    with pytest.raises(UsageError):
        tuned.scaled_learning_rate("sqrt", 1e-3, 128, 512)
    assert tuned.optimization_note(128, 128, "none", 1e-3, 1e-3) is None
    assert "--scale-lr linear" in tuned.optimization_note(128, 512, "none", 1e-3, 1e-3)
    assert "0.004" in tuned.optimization_note(128, 512, "linear", 1e-3, 4e-3)
    assert "fewer, larger steps" in tuned.optimization_note(128, 512, "none", 1e-3, 1e-3)
    assert "more, smaller steps" in tuned.optimization_note(128, 120, "none", 1e-3, 1e-3)


# ---- the report ------------------------------------------------------------------------

def test_table_and_speedups():
    precisions = {
        "float32": {"max_batch": 568, "best_batch": 128, "best_samples_per_second": 400.0,
                    "memory_per_sample_bytes": int(2.1 * MIB), "trials": []},
        "mixed_bfloat16": {"max_batch": 744, "best_batch": 256, "best_samples_per_second": 600.0,
                           "memory_per_sample_bytes": int(1.6 * MIB), "trials": []},
    }
    assert report.speedups(precisions) == {"float32": 1.0, "mixed_bfloat16": 1.5}
    doc = {"precisions": precisions, "budget_bytes": 2 * GIB, "budget_source": "--memory-budget",
           "margin": 0.1, "limit_bytes": int(1.8 * GIB), "memory_kind": "cpu_rss",
           "choice": {"precision": "mixed_bfloat16", "batch_size": 256,
                      "samples_per_second": 600.0},
           "verified": {"fits": True, "steps": 12, "peak_memory_bytes": GIB}, "notes": []}
    text = report.table(doc)
    assert "744" in text and "1.50x" in text and "2.10 MiB" in text
    assert "choice: mixed_bfloat16 at batch 256" in text
    precisions["float32"]["memory_per_sample_bytes"] = 1536   # a small model's: not 0.00 MiB
    assert "1.5 KiB" in report.table(doc)


def test_children_cannot_be_hijacked_by_an_app_module_in_the_cwd(tmp_path):
    """A user's own app.py in the current directory must not replace this package."""
    import subprocess
    import sys

    from app.core import launch
    from app.tuner import runner

    (tmp_path / "app.py").write_text("raise SystemExit('hijacked')\n", encoding="utf-8")
    code = runner.child_command("app.tuner.trial", ["--help"])   # ours prints its usage
    proc = subprocess.run(code, capture_output=True, text=True, cwd=str(tmp_path),
                          env=runner.child_env(), timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "--request" in proc.stdout and "hijacked" not in proc.stderr
    assert runner.child_env()["PYTHONPATH"].split(os.pathsep)[0] == launch.PACKAGE_ROOT


# ---- auto in a container is what is free, not the bare limit (issue 24, item 8) -------------

MEMINFO_PLENTY = "MemTotal: 64000000 kB\nMemAvailable:   60000000 kB\n"


def test_cgroup_v2_auto_is_the_limit_less_what_the_container_uses():
    # A 4 GiB container where Jupyter and a kernel use 1.5 GiB, 0.5 GiB of it page cache.
    files = {"/proc/self/cgroup": "0::/\n", "/proc/meminfo": MEMINFO_PLENTY,
             "/sys/fs/cgroup/memory.max": str(4 * GIB),
             "/sys/fs/cgroup/memory.current": str(3 * GIB // 2),
             "/sys/fs/cgroup/memory.stat": f"anon {GIB}\nfile {GIB // 2}\nactive_file "
                                           f"{GIB // 8}\ninactive_file {3 * GIB // 8}\n"}
    b = budget.cpu_auto_budget(_reader(files))
    assert b.bytes == 3 * GIB
    assert b.source.startswith("container memory limit 4.00 GiB less 1.00 GiB in use")
    assert "/sys/fs/cgroup/memory.max" in b.source


def test_cgroup_v1_auto_is_the_limit_less_usage_at_the_tightest_level():
    proc = "4:memory:/docker/abc\n"
    base = "/sys/fs/cgroup/memory"
    files = {"/proc/self/cgroup": proc, "/proc/meminfo": MEMINFO_PLENTY,
             # the container: 3 GiB limit, 1 GiB used
             f"{base}/docker/abc/memory.limit_in_bytes": str(3 * GIB),
             f"{base}/docker/abc/memory.usage_in_bytes": str(GIB),
             f"{base}/docker/abc/memory.stat": "total_active_file 0\ntotal_inactive_file 0\n",
             # its parent: 8 GiB limit with 7.5 GiB used by its other containers
             f"{base}/docker/memory.limit_in_bytes": str(8 * GIB),
             f"{base}/docker/memory.usage_in_bytes": str(15 * GIB // 2),
             f"{base}/memory.limit_in_bytes": "9223372036854771712"}
    free = memory.cgroup_free(proc, _reader(files))
    assert (free.free, free.limit, free.path) == (GIB // 2, 8 * GIB,
                                                  f"{base}/docker/memory.limit_in_bytes")
    assert budget.cpu_auto_budget(_reader(files)).bytes == GIB // 2


def test_auto_never_exceeds_mem_available_and_says_so():
    files = {"/proc/self/cgroup": "0::/\n", "/proc/meminfo": "MemAvailable: 1048576 kB\n",
             "/sys/fs/cgroup/memory.max": str(16 * GIB), "/sys/fs/cgroup/memory.current": "0"}
    b = budget.cpu_auto_budget(_reader(files))
    assert b.bytes == GIB and b.source.startswith("memory available when the tune started")
    assert "container memory limit 16.00 GiB" in b.source


def test_a_container_with_almost_nothing_free_is_one_line():
    files = {"/proc/self/cgroup": "0::/\n", "/proc/meminfo": MEMINFO_PLENTY,
             "/sys/fs/cgroup/memory.max": str(GIB),
             "/sys/fs/cgroup/memory.current": str(GIB - 10 * 2**20)}
    with pytest.raises(UsageError) as err:
        budget.cpu_auto_budget(_reader(files))
    assert "10 MiB free" in err.value.line() and "--memory-budget SIZE" in err.value.line()
