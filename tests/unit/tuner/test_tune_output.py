"""``tune()``'s output folder and what it records, on fake trials (no TensorFlow, no child
processes): one tune per folder under the run lock, nothing deleted that the tune did not
write, a folder holding a tune or anything else under a tune's names refused (issue 24, item
3); ``reference_batch_size`` written for ``train --tuned --scale-lr linear`` (item 11)."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from app import cli
from app.core.errors import UsageError
from app.run_folder.lock import LOCK_NAME, OutputInUse, RunLock
from app.tuner import arguments
from app.tuner import tuning as api
from app.training import tuned
from app.tuner.search import Outcome

MIB = 2**20


class FakeRunner:
    """Stands in for ``runner.TrialRunner``: writes a log per trial into the tune's own
    working folder, as the real one does; ``during`` runs inside the first trial."""
    instances: list = []
    fits_up_to = 16          # the fake memory boundary: 8 and 16 fit, 24 and up do not
    data_limit = None        # the training set's size a trial reports (None: generated data)
    during = None
    verify_outcome = None

    def __init__(self, base_request, workdir, *, kill_above, timeout=None):
        self.base, self.workdir = base_request, workdir
        self.calls = []
        FakeRunner.instances.append(self)

    def __call__(self, policy, batch_size, any_fit, phase="search", **overrides):
        self.calls.append((policy, batch_size))
        with open(os.path.join(self.workdir, f"{len(self.calls):02d}-{policy}-b{batch_size}.log"),
                  "w", encoding="utf-8") as fh:
            fh.write("fake trial\n")
        if FakeRunner.during is not None:
            during, FakeRunner.during = FakeRunner.during, None
            during()
        if batch_size <= FakeRunner.fits_up_to:
            return Outcome(True, 100 * MIB + batch_size * MIB, 100.0 * batch_size, "", 0.1,
                           FakeRunner.data_limit)
        return Outcome(False, None, None, "resident memory passed the budget", 0.1,
                       FakeRunner.data_limit)

    def verify(self, policy, batch_size, steps):
        self.calls.append((policy, batch_size, "verify"))
        if FakeRunner.verify_outcome is not None:
            return FakeRunner.verify_outcome
        return Outcome(True, 100 * MIB + batch_size * MIB, 100.0 * batch_size, "", 0.1)


@pytest.fixture
def fake(monkeypatch):
    FakeRunner.instances, FakeRunner.during, FakeRunner.verify_outcome = [], None, None
    FakeRunner.fits_up_to, FakeRunner.data_limit = 16, None
    monkeypatch.setattr(api, "TrialRunner", FakeRunner)
    monkeypatch.setattr(api, "collect_environment",
                        lambda: {"hardware": {"gpus": []},
                                 "auto_precision": {"policy": "float32"}})
    monkeypatch.delenv("TFMP_BATCH_SIZE", raising=False)
    return FakeRunner


def run_tune(output, **kw):
    args = dict(precision="float32", memory_budget="1GiB", max_batch=64, progress=False,
                output=None if output is None else str(output))
    args.update(kw)
    return api.tune("mlp", "synthetic", **args)


def _trials_ran(fake) -> int:
    return sum(len(r.calls) for r in fake.instances)


def test_a_tune_writes_beside_other_files_and_deletes_nothing(tmp_path, fake):
    out = tmp_path / "X"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    doc = run_tune(out)
    assert (doc["choice"]["precision"], doc["choice"]["batch_size"]) == ("float32", 16)
    assert (out / "notes.txt").read_text() == "mine"
    logs = os.listdir(out / "trials")
    assert len(logs) == _trials_ran(fake) - 1 and all(f.endswith(".log") for f in logs)
    assert json.loads((out / "tune.json").read_text())["choice"]["batch_size"] == 16


def test_a_folder_with_trials_of_its_own_is_refused_and_keeps_them(tmp_path, fake):
    out = tmp_path / "X"
    (out / "trials").mkdir(parents=True)
    (out / "trials" / "keep.csv").write_text("a,b\n1,2\n")
    with pytest.raises(UsageError) as err:
        run_tune(out)
    line = err.value.line()
    assert len(line.splitlines()) == 1 and "already holds trials/" in line and str(out) in line
    assert (out / "trials" / "keep.csv").read_text() == "a,b\n1,2\n"
    assert _trials_ran(fake) == 0 and sorted(os.listdir(out)) == ["trials"]


def test_a_second_tune_into_a_tunes_folder_is_refused(tmp_path, fake):
    out = tmp_path / "X"
    run_tune(out)
    before = (out / "tune.json").read_bytes()
    ran = _trials_ran(fake)
    with pytest.raises(UsageError, match="already holds a tune"):
        run_tune(out)
    assert (out / "tune.json").read_bytes() == before and _trials_ran(fake) == ran


def test_a_training_runs_folder_is_refused(tmp_path, fake):
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.json").write_text("{}")
    with pytest.raises(UsageError, match=r"holds a training run \(metrics.json\)"):
        run_tune(out)
    assert os.listdir(out) == ["metrics.json"]


def test_a_live_holder_of_the_lock_is_refused_before_any_trial(tmp_path, fake, capsys):
    out = tmp_path / "X"
    with RunLock(str(out), command="tfmp tune --output X"):
        with pytest.raises(OutputInUse, match="tfmp tune --output X"):
            run_tune(out)
        # through the command line: one line, exit 2
        rc = cli.main(["tune", "--model", "mlp", "--dataset", "synthetic", "--precision",
                       "float32", "--memory-budget", "1GiB", "--output", str(out), "--quiet"])
    assert rc == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("error: output directory") and "in use" in err[0]
    assert _trials_ran(fake) == 0 and os.listdir(out) == [LOCK_NAME]


def test_two_tunes_started_in_the_same_second_without_output_each_get_a_folder(tmp_path, fake,
                                                                               monkeypatch):
    """Two tunes with no --output started in the same second both named one folder; the
    second met the first's lock and exited 2.  The default folder is now claimed (made)
    once every check is done, and a name taken by then is passed by: here both tunes are
    held at the same point, past their choice of folder, until both have reached it."""
    import threading

    from app.training import config as train_config
    from app.tuner import output as output_folder

    monkeypatch.setattr(train_config, "utc_stamp", lambda now=None: "20261207T170000Z")
    both_chose = threading.Barrier(2, timeout=30)
    held = threading.local()
    check = output_folder.check_output

    one_at_a_time = threading.Lock()   # past that point (the chart is not thread-safe)

    def check_after_both_chose(path):
        if not getattr(held, "once", False):
            held.once = True
            both_chose.wait()
            one_at_a_time.acquire()
        check(path)
    monkeypatch.setattr(output_folder, "check_output", check_after_both_chose)
    results, errors = [], []

    def one_tune():
        try:
            results.append(run_tune(None, workspace=str(tmp_path))["output"])
        except Exception as exc:   # the failure this test is about: OutputInUse
            errors.append(exc)
        finally:
            if getattr(held, "once", False):
                one_at_a_time.release()
    tunes = [threading.Thread(target=one_tune) for _ in range(2)]
    for t in tunes:
        t.start()
    for t in tunes:
        t.join(60)
    base = str(tmp_path / "tune" / "20261207T170000Z-mlp-synthetic")
    assert not errors, errors
    assert sorted(results) == [base, f"{base}-2"]
    assert all(os.path.exists(os.path.join(r, "tune.json")) for r in results)


def test_the_tune_holds_the_lock_while_it_searches(tmp_path, fake):
    out = tmp_path / "X"
    seen = {}

    def second_tune_meanwhile():
        with pytest.raises(OutputInUse) as err:
            run_tune(out)
        seen["refused"] = err.value.line()
    fake.during = second_tune_meanwhile
    run_tune(out)
    assert "in use by a running tune" in seen["refused"]   # no word of checkpoints
    assert "resume" not in seen["refused"]
    assert (out / "tune.json").exists()
    RunLock(str(out)).check_free()     # released at the end


def test_a_tune_that_finds_nothing_leaves_the_folder_as_it_found_it(tmp_path, fake):
    fake.fits_up_to = 0
    with pytest.raises(api.NothingFits):
        run_tune(tmp_path / "new")
    assert not (tmp_path / "new").exists()
    (tmp_path / "old").mkdir()
    with pytest.raises(api.NothingFits):
        run_tune(tmp_path / "old")
    assert os.listdir(tmp_path / "old") == []


# ---- reference_batch_size (item 11) ---------------------------------------------------------

def test_reference_batch_size_default_env_and_flag(tmp_path, fake, monkeypatch):
    assert run_tune(tmp_path / "a")["reference_batch_size"] == 128
    monkeypatch.setenv("TFMP_BATCH_SIZE", "64")
    assert run_tune(tmp_path / "b")["reference_batch_size"] == 64
    rc = cli.main(["tune", "--model", "mlp", "--dataset", "synthetic", "--precision", "float32",
                   "--memory-budget", "1GiB", "--max-batch", "64", "--output",
                   str(tmp_path / "c"), "--quiet", "--reference-batch-size", "256"])
    assert rc == 0
    doc = json.loads((tmp_path / "c" / "tune.json").read_text())
    assert doc["reference_batch_size"] == 256
    # ...and train --tuned --scale-lr linear scales from it, not from 128.
    applied = tuned.apply(str(tmp_path / "c"), model="mlp", dataset="synthetic",
                          precision=None, batch_size=None, learning_rate=1e-3,
                          scale_lr="linear", default_batch=128)
    assert applied.batch_size == 16 and applied.learning_rate == pytest.approx(1e-3 * 16 / 256)
    assert applied.record["reference_batch_size"] == 256
    for bad in (0, -8, True, 2.5):
        with pytest.raises(UsageError, match="reference_batch_size must be a positive"):
            run_tune(tmp_path / "d", reference_batch_size=bad)
    assert not (tmp_path / "d").exists()


# ---- the verification run (item 5) ----------------------------------------------------------

def _hostile_environment():
    """Every training setting's variable set to something the trials did not train, and the
    multi-worker and CPU-split variables."""
    from app.core.settings import SETTINGS

    odd = {"int": "3", "float": "0.5", "text": "elsewhere"}
    env = {"PATH": os.environ.get("PATH", ""), "TF_CONFIG": '{"cluster": {"worker": '
           '["a:1", "b:1"]}, "task": {"type": "worker", "index": 0}}',
           "TFMP_LOGICAL_CPUS": "2"}
    for s in SETTINGS:
        if s.choices:
            value = s.choices[-1]
        elif s.switch:
            value = "1"
        else:
            value = odd["int" if s.parse is int else "float" if s.parse is float else "text"]
        env[s.env] = value
    env.update(TFMP_STRATEGY="mirrored", TFMP_LOOP="custom", TFMP_INPUT_SHAPE="9,9,1",
               TFMP_LOSS="mse", TFMP_PRECISION="mixed_float16")
    return env


def test_the_verification_trains_the_trials_settings_and_inherits_none(tmp_path):
    from app.training import config
    from app.tuner import runner

    env = runner.verification_env(_hostile_environment())
    assert env["PATH"] == os.environ.get("PATH", "")
    leaked = sorted(k for k in env if k.startswith("TFMP_") or k == "TF_CONFIG")
    assert leaked == [], leaked

    req = {"model": "mlp", "dataset": "synthetic", "policy": "float32", "batch_size": 16,
           "steps": 10, "loss": None, "metrics": None, "input_shape": None, "num_classes": None,
           "image_size": 32, "data_dir": str(tmp_path / "ws" / "data"),
           "data_dir_explicit": False, "image_dir": None, "max_train_samples": None,
           "offline": True, "seed": 3, "learning_rate": 0.002, "jit": False,
           "float32_layers": "dense_1"}
    args = cli.build_parser().parse_args(runner.verification_command(req, str(tmp_path / "v")))
    flags = {k: v for k, v in vars(args).items() if not k.startswith("_") and k != "command"}
    got = config.resolve_config(flags, environ=env)
    # what the trial trained, setting by setting
    for name in arguments.TRIAL_SETTINGS:
        if name != "max_train_samples":   # the verification's own: `steps` batches and a half
            assert getattr(got, name) == req[name], (name, getattr(got, name), req[name])
    assert got.max_train_samples == 16 * 10 + 8 and got.epochs == 1
    assert (got.precision, got.batch_size, got.strategy) == ("float32", 16, "one")
    # everything else is train's default, whatever the tune's own environment held
    clean = config.resolve_config(flags, environ={})
    assert got == clean


def _ended(tmp_path, rc, log_lines, metrics=None, **kw):
    from app.tuner import runner

    log = tmp_path / kw.get("name", "v.log")
    log.write_text("\n".join(log_lines) + "\n")
    return runner.ChildEnd(rc, metrics, kw.get("killed", False), 0, 1.0, str(log),
                           kw.get("timed_out", False))


def test_a_trial_whose_code_raised_shows_its_traceback_above_the_line(tmp_path, fake, capsys,
                                                                       monkeypatch):
    """The user's traceback is shown from the trial's log, as train shows it, then the one
    line, which names the log where it is kept: in the output folder's trials/, with the other
    trials' logs, not in the temporary folder a container's --rm removes."""
    from app.tuner import runner

    trace = ["Traceback (most recent call last):",
             '  File "/w/syn.py", line 2', "    return None", "    ^",
             "SyntaxError: invalid syntax"]

    def failing_verify(self, policy, batch_size, steps):
        end = _ended(Path(self.workdir), 1, ["$ python3 -m app.tuner.trial --request {...}", *trace],
                     {"status": "error", "reason": "error: your code raised SyntaxError while "
                                                   "importing ./syn.py (the traceback above "
                                                   "points at the line)"}, name="verify.log")
        return runner.outcome_of(end, None, any_fit=False)
    monkeypatch.setattr(fake, "verify", failing_verify)
    out = tmp_path / "X"
    rc = cli.main(["tune", "--model", "mlp", "--dataset", "synthetic", "--precision", "float32",
                   "--memory-budget", "1GiB", "--max-batch", "64", "--output", str(out),
                   "--quiet"])
    err_lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert rc == 1 and err_lines[:-1] == trace, err_lines
    assert err_lines[-1].startswith("error: a trial failed: your code raised SyntaxError"), \
        err_lines
    kept = out / "trials" / "verify.log"
    assert err_lines[-1].endswith(f"(log: {kept})") and "SyntaxError" in kept.read_text()
    assert sorted(p.name for p in out.iterdir()) == ["trials"]
    assert len(list((out / "trials").glob("*-float32-b*.log"))) >= 2


def _fail_first_trial(fake, monkeypatch):
    """The first search trial fails as the QA's model that raises did: exit 1, its log kept."""
    from app.tuner import runner

    searched = fake.__call__

    def raises(self, policy, batch_size, any_fit, phase="search", **overrides):
        searched(self, policy, batch_size, any_fit, phase, **overrides)
        log = os.path.join(self.workdir, f"{len(self.calls):02d}-{policy}-b{batch_size}.log")
        raise runner.TrialFailed("your code raised ValueError: my bug in build", log)
    monkeypatch.setattr(fake, "__call__", raises)
    return lambda: monkeypatch.setattr(fake, "__call__", searched)


def _tune_cli(out) -> int:
    return cli.main(["tune", "--model", "mlp", "--dataset", "synthetic", "--precision",
                     "float32", "--memory-budget", "1GiB", "--max-batch", "64", "--output",
                     str(out)])


def test_the_same_command_after_a_failed_trial_runs_and_keeps_the_failed_logs(
        tmp_path, fake, capsys, monkeypatch):
    """QA: a tune whose trial failed kept its logs in trials/, and the same command, run
    again after the fix, was refused ("already holds trials/, which are not from a finished
    tune").  The failed tune marks its trials/ (tune-failed.json): the rerun recognises it,
    moves it to trials-failed-<UTC time>/ (one line says so, and tune.json's notes) and
    writes its own; nothing of the failed tune's is lost."""
    fixed = _fail_first_trial(fake, monkeypatch)
    out = tmp_path / "tune8"
    assert _tune_cli(out) == 1
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert err[-1].startswith("error: a trial failed: your code raised ValueError"), err
    failed_log = out / "trials" / "01-float32-b16.log"
    assert err[-1].endswith(f"(log: {failed_log})") and failed_log.read_text() == "fake trial\n"
    assert sorted(p.name for p in out.iterdir()) == ["trials"]
    kept = sorted(p.name for p in (out / "trials").iterdir())

    fixed()
    assert _tune_cli(out) == 0
    captured = capsys.readouterr()
    aside = [p for p in out.iterdir() if p.name.startswith("trials-failed-")]
    assert len(aside) == 1 and re.fullmatch(r"trials-failed-\d{8}T\d{6}Z", aside[0].name)
    assert sorted(p.name for p in aside[0].iterdir()) == kept     # moved whole, marker too
    assert (aside[0] / "01-float32-b16.log").read_text() == "fake trial\n"
    said = [ln for ln in captured.err.splitlines() if aside[0].name in ln]
    assert len(said) == 1 and "failed" in said[0] and "01-float32-b16.log" in said[0], \
        captured.err
    doc = json.loads((out / "tune.json").read_text())
    assert doc["choice"]["batch_size"] == 16
    assert any(aside[0].name in n for n in doc["notes"]), doc["notes"]
    assert not (out / "trials" / "tune-failed.json").exists()
    assert sorted(p.name for p in out.iterdir() if p.name != LOCK_NAME) == sorted(
        ["trials", aside[0].name, "tune.json", "tune.png"])


@pytest.mark.parametrize("tamper", ["another_file_beside", "marker_not_ours", "tune_png_too"])
def test_a_failed_tunes_trials_with_anything_else_is_refused_as_before(
        tmp_path, fake, monkeypatch, tamper):
    """Only what a failed tune left, as it left it, is taken for one: its marker must be its
    own, and no other tune file beside it; anything else keeps the refusal."""
    from app.tuner import runner

    fixed = _fail_first_trial(fake, monkeypatch)
    out = tmp_path / "X"
    with pytest.raises(runner.TrialFailed):
        run_tune(out)
    fixed()
    if tamper == "another_file_beside":
        (out / "tune.json").write_text("{}")
    elif tamper == "marker_not_ours":
        (out / "trials" / "tune-failed.json").write_text('{"mine": 1}')
    else:
        (out / "tune.png").write_bytes(b"png")
    before = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    with pytest.raises(UsageError, match="already holds"):
        run_tune(out)
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == before


def test_a_verification_that_fails_for_another_reason_is_reported_as_that(tmp_path, fake,
                                                                          capsys, monkeypatch):
    from app.tuner import runner

    end = _ended(tmp_path, 2, ["$ tfmp train ...",
                               "error: dataset 'x.py:load' cannot be imported (ModuleNotFoundError)"])
    with pytest.raises(runner.TrialFailed) as err:
        runner.verification_outcome(end, None)
    line = err.value.line()
    assert line.startswith("error: the verification run (tfmp train) failed: exit status 2")
    assert "cannot be imported" in line and str(tmp_path / "v.log") in line
    # memory stays "did not fit"
    oom = _ended(tmp_path, 1, ["tensorflow.python.framework.errors_impl.ResourceExhaustedError: "
                               "OOM when allocating tensor"], {"status": "failed"})
    assert not runner.verification_outcome(oom, None).completed
    killed = _ended(tmp_path, -9, ["..."], killed=True)
    assert not runner.verification_outcome(killed, 2**30).completed

    # through tfmp tune: that one line, exit 1, not "no size held its budget"
    def failing_verify(self, policy, batch_size, steps):
        return runner.verification_outcome(end, None)
    monkeypatch.setattr(fake, "verify", failing_verify)
    out = tmp_path / "X"
    rc = cli.main(["tune", "--model", "mlp", "--dataset", "synthetic", "--precision", "float32",
                   "--memory-budget", "1GiB", "--max-batch", "64", "--output", str(out),
                   "--quiet"])
    err_lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert rc == 1 and len(err_lines) == 1, err_lines
    assert err_lines[0].startswith("error: the verification run (tfmp train) failed")
    assert "budget" not in err_lines[0] and not out.exists()


def test_a_training_set_that_limits_the_batch_is_said_when_a_trial_finds_it(tmp_path, fake,
                                                                              capsys):
    """The header names the sizes up to --max-batch before the data is loaded; the first trial
    that learns the training set allows less says so then, once, not only in the final notes."""
    fake.fits_up_to, fake.data_limit = 4096, 400
    doc = run_tune(tmp_path / "X", precision="float32,auto", max_batch=256, progress=True)
    lines = capsys.readouterr().err.splitlines()
    header = next(i for i, ln in enumerate(lines) if "batch sizes 8..256" in ln)
    said = [i for i, ln in enumerate(lines) if ln.startswith("[tune] the training set")]
    first_trial = next(i for i, ln in enumerate(lines) if ln.startswith("[tune] float32 "))
    assert len(said) == 1 and header < said[0] < first_trial, lines
    assert lines[said[0]] == ("[tune] the training set (400 samples) limits the batch to 40, so "
                              "that an epoch is at least 10 updates"), lines
    assert doc["precisions"]["float32"]["max_batch"] == 40


# ---- synthetic data in a trial (item 6) -----------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("max_train, limit", [(None, None), (400, 400)])
def test_generated_data_does_not_cap_the_search(max_train, limit):
    pytest.importorskip("tensorflow")
    from app.tuner import search, trial

    result = trial.run({"model": "mlp", "dataset": "synthetic", "policy": "float32",
                        "batch_size": 8, "steps": 1, "warmup_steps": 0, "min_seconds": 0,
                        "max_train_samples": max_train})
    assert result["status"] == "ok" and result["train_samples"] == limit
    # The search with every size fitting, as on a machine with plenty of memory: generated
    # data lets it reach the cap; a --max-train-samples the user set still bounds the batch.
    found = search.find_max_batch(
        lambda b: Outcome(True, 100 * MIB, 1000.0 + b, "", 0.1, result["train_samples"]),
        budget_bytes=64 * 2**30, margin=0.1, cap=8192)
    if limit is None:
        assert (found.max_batch, found.stopped) == (8192, "cap")
    else:
        assert (found.max_batch, found.stopped) == (40, "data")   # a tenth of the set


# --- on a GPU box (fake GPU, fake NVML): --jit without XLA's toolchain, the free-memory budget --

T4_ENV = {"hardware": {"gpus": [{"name": "Tesla T4", "compute_capability": [7, 5],
                                 "memory_bytes": 14 * 2**30}]},
          "auto_precision": {"policy": "mixed_float16"},
          "xla_gpu": {"libdevice": None, "ptxas": None, "ptxas_version": None,
                      "ptxas_error": "not found", "searched": ["/usr/local/cuda"],
                      "can_compile": False}}


def test_jit_on_a_gpu_without_libdevice_stops_before_any_trial(tmp_path, fake, monkeypatch):
    monkeypatch.setattr(api, "collect_environment", lambda: dict(T4_ENV))
    with pytest.raises(UsageError) as err:
        run_tune(tmp_path / "t", jit=True, memory_budget="auto")
    assert err.value.line().startswith("error: --jit cannot compile for the GPU here: "
                                       "libdevice.10.bc not found")
    assert _trials_ran(fake) == 0 and not (tmp_path / "t" / "tune.json").exists()


def test_auto_budget_on_a_gpu_is_what_is_free_and_names_who_holds_the_rest(tmp_path, fake,
                                                                          monkeypatch):
    from app.machine import nvml
    from tests.unit.machine.test_gpu_box import COMMANDS, KERNEL, FakeNVML

    env = dict(T4_ENV, xla_gpu=dict(T4_ENV["xla_gpu"], can_compile=True))
    monkeypatch.setattr(api, "collect_environment", lambda: env)
    reading = nvml.read(FakeNVML(procs=[KERNEL], used=14 * 2**30 + 200 * 2**20),
                        command=COMMANDS.get)
    monkeypatch.setattr(nvml, "read", lambda nvml=None: reading)
    doc = run_tune(tmp_path / "t", memory_budget="auto", precision="float32")
    assert doc["budget_bytes"] == reading.gpus[0].memory_free
    assert "free on GPU 0" in doc["budget_source"]
    assert any("held by pid 4242" in n for n in doc["notes"]), doc["notes"]


def test_a_choice_no_size_of_which_holds_in_verification_falls_to_another_precision(
        tmp_path, fake, monkeypatch):
    """float32 chosen at the budget's edge: every float32 size went over the budget in the
    longer verification run (CI, in the image, under a container limit); mixed_float16 had
    room.  The tune verifies that one instead of ending with "no size held its budget"."""
    def verify(self, policy, batch_size, steps):
        self.calls.append((policy, batch_size, "verify"))
        if policy == "float32":
            return Outcome(False, None, None, "resident memory passed the budget", 0.1)
        return Outcome(True, 100 * MIB + batch_size * MIB, 100.0 * batch_size, "", 0.1)
    monkeypatch.setattr(fake, "verify", verify)
    searched = fake.__call__

    def flat_speed(self, policy, batch_size, any_fit, phase="search", **overrides):
        # every size equally fast: the best batch is the smallest (16), below max_batch (24)
        o = searched(self, policy, batch_size, any_fit, phase, **overrides)
        return Outcome(o.completed, o.peak_memory_bytes, o.completed and 1000.0, o.reason,
                       o.seconds, o.data_limit)
    monkeypatch.setattr(fake, "__call__", flat_speed)
    fake.fits_up_to = 24
    doc = run_tune(tmp_path / "X", precision="float32,mixed_float16")
    verified = [c for r in fake.instances for c in r.calls if c[-1] == "verify"]
    # float32's only fitting size (the search starts at 16), then mixed_float16's best
    assert verified == [("float32", 16, "verify"), ("mixed_float16", 16, "verify")], verified
    assert doc["choice"]["precision"] == "mixed_float16" and doc["choice"]["batch_size"] == 16
    assert doc["verified"]["fits"] and doc["verified"]["stepped_down_from"] == 16
    assert doc["verified"]["stepped_down_from_precision"] == "float32"
    # mixed_float16's larger sizes were not what failed: its search's max_batch stands
    assert doc["precisions"]["mixed_float16"]["max_batch"] == 24, doc["precisions"]
    assert sum("did not hold" in n for n in doc["notes"]) == 1, doc["notes"]
