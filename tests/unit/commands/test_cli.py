"""The command line as a user meets it: subprocesses, exit statuses, one-line errors."""
import json
import os
import re
import subprocess
import sys

import pytest

from tests.paths import ROOT, USER_MODELS
from tests.unit.helpers import ONCE_IN_THE_IMAGE, error_lines, run_app, start_app

DATASETS = os.path.join(USER_MODELS, "datasets.py")
QUICK = ["--dataset", "synthetic", "--max-train-samples", "128", "--max-val-samples", "32",
         "--batch-size", "32", "--precision", "float32", "--progress", "lines", "--offline",
         "--no-save-model"]


def assert_usage_error(proc, needle, *not_created):
    assert proc.returncode == 2, proc.stderr
    errors = error_lines(proc.stderr)
    assert len(errors) == 1, proc.stderr
    assert needle in errors[0], errors[0]
    assert "Traceback" not in proc.stderr
    for path in not_created:
        assert not os.path.exists(path), f"{path} was created"


@pytest.mark.parametrize("args, needle", [
    (["--precision", "fp8"], "--precision must be one of float32, mixed_float16, mixed_bfloat16, "
                             "auto. Received: --precision='fp8'"),
    (["--model", "vgg"], "model must be one of mlp, cnn, resnet"),
    (["--dataset", "imagenet"], "dataset must be one of"),
    (["--loop", "manual"], "loop must be one of fit, custom"),
    (["--batch-size", "0"], "--batch-size must be at least 1"),
    (["--epochs", "0"], "epochs must be at least 1"),
    (["--image-size", "0"], "--image-size must be at least 1"),
    (["--initial-loss-scale", "0"], "--initial-loss-scale must be a finite number > 0"),
    (["--initial-loss-scale", "nan"], "--initial-loss-scale must be a finite number > 0"),
    (["--epochs", "two"], "invalid int value: 'two'; allowed: an integer; see: tfmp train"),
    (["--learning-rate", "fast"], "invalid float value: 'fast'; allowed: a number; see: "),
    # inf, and what float32 rounds to inf or to 0, trains nothing or diverges at step 1
    (["--learning-rate", "inf"], "--learning-rate must be a finite number > 0 that float32 "
                                 "holds. Received: --learning-rate=inf; allowed: a number from "
                                 "1.4e-45 to 3.4e+38, e.g. 0.001"),
    (["--learning-rate", "1e308"], "Received: --learning-rate=1e+308; allowed: a number from "),
    (["--learning-rate", "1e-320"], "Received: --learning-rate=1e-320; allowed: a number from "),
    # numpy and TensorFlow take 32-bit unsigned seeds (a traceback from numpy before)
    (["--seed", "-1"], "--seed must be an integer from 0 to 2**32 - 1. Received: --seed=-1; "
                       "allowed: an integer from 0 to 4294967295, e.g. 0"),
    (["--initial-loss-scale", "1e300"], "--initial-loss-scale must be a finite number > 0. "
                                        "Received: --initial-loss-scale=1e+300"),
    (["--loop", "custom", "--steps-per-execution", "4"],
     "--steps-per-execution applies to --loop fit only. Received: --steps-per-execution=4, "
     "--loop='custom'; allowed: --loop fit with --steps-per-execution, or leave it at 1"),
    (["--seed", "4294967296"], "--seed must be an integer from 0 to 2**32 - 1. Received: "
                               "--seed=4294967296"),
    (["--accumulate", "0"], "--accumulate must be at least 1. Received: --accumulate=0"),
    # named as given: the flag (it said "early_stop_on applies with --early-stop only",
    # "scale_lr 'linear' applies with --tuned only", "seed must be ...")
    (["--early-stop-on", "val_accuracy"], "--early-stop-on applies with --early-stop only. "
                                          "Received: --early-stop-on='val_accuracy'"),
    (["--scale-lr", "linear"], "--scale-lr linear applies with --tuned only; allowed: "
                               "--scale-lr linear together with --tuned DIR/tune.json"),
    (["--global-batch", "100", "--batch-size", "32"],
     "--global-batch 100 is not a multiple of the micro-batch 32 (--batch-size 32); allowed: "
     "--global-batch 96 or 128"),
    (["--no-such-flag"], "unrecognized arguments: --no-such-flag; see: tfmp train --help"),
])
def test_bad_flags(tmp_path, args, needle):
    out = tmp_path / "run"
    proc = run_app("train", "--output", str(out), *args)
    assert_usage_error(proc, needle, out)


@pytest.mark.parametrize("argv, flag", [
    (["--epochs", "3", "train"], "--epochs"),
    (["--precision=float32", "train"], "--precision"),
    (["--bogus"], "--bogus"),
])
def test_a_flag_before_the_command_is_named_not_taken_for_the_command(capsys, argv, flag):
    from app.cli import main
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    errors = error_lines(capsys.readouterr().err)
    assert errors == [f"error: {flag} comes before the command; allowed: tfmp COMMAND [FLAGS], "
                      "the command one of train, env, benchmark, notebooks, check, tune; "
                      "see: tfmp --help"]


@pytest.mark.parametrize("command, flag", [
    ("train", "--output"), ("train", "--workspace"), ("train", "--model"),
    ("train", "--tuned"), ("check", "--dataset"), ("check", "--json"), ("tune", "--output"),
    ("tune", "--memory-budget"), ("benchmark", "--data-dir"), ("benchmark", "--output"),
    ("notebooks", "--install"),
])
def test_an_empty_value_is_refused_not_read_as_the_default(tmp_path, monkeypatch, capsys,
                                                           command, flag):
    """`--output "$OUT"` with OUT unset trained into the default folder, which in a
    container without a mount is gone with it."""
    from app.cli import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stop:
        main([command, flag, " " if flag == "--workspace" else ""])
    assert stop.value.code == 2
    assert error_lines(capsys.readouterr().err) == [
        f"error: argument {flag}: is empty; allowed: a value, or leave the flag out for its "
        f"default; see: tfmp {command} --help"]
    assert list(tmp_path.iterdir()) == []


def test_an_empty_value_through_the_api_or_a_variable_is_one_line(tmp_path):
    from app.core.errors import UsageError
    from app.training.config import resolve_config

    with pytest.raises(UsageError) as caught:
        resolve_config({"output": ""})
    assert str(caught.value) == ("error: output is empty. Received: output=''; allowed: a "
                                 "value, or leave it out for its default")
    with pytest.raises(UsageError, match="TFMP_WORKSPACE is empty"):
        resolve_config({}, {"TFMP_WORKSPACE": "  "})
    # Empty says "none" where none is a value: a --resume drops the run's float32 layers
    cfg = resolve_config({"float32_layers": "", "class_weight": ""}, {})
    assert (cfg.float32_layers, cfg.class_weight) == ("", None)


def test_bad_environment_variable(tmp_path):
    out = tmp_path / "run"
    proc = run_app("train", "--output", str(out), env={"TFMP_EPOCHS": "lots"})
    assert_usage_error(proc, "TFMP_EPOCHS", out)


@ONCE_IN_THE_IMAGE
def test_missing_data_dir(tmp_path):
    out = tmp_path / "run"
    proc = run_app("train", "--dataset", "mnist", "--data-dir", str(tmp_path / "nodata"),
                   "--output", str(out))
    assert_usage_error(proc, "does not exist", out)


@ONCE_IN_THE_IMAGE
def test_missing_file_offline(tmp_path):
    out = tmp_path / "run"
    proc = run_app("train", "--dataset", "mnist", "--data-dir", str(tmp_path), "--offline",
                   "--output", str(out))
    assert_usage_error(proc, "mnist.npz", out)


@ONCE_IN_THE_IMAGE
def test_corrupt_data_file(tmp_path):
    (tmp_path / "mnist.npz").write_bytes(b"\x00garbage" * 10)
    out = tmp_path / "run"
    proc = run_app("train", "--dataset", "mnist", "--data-dir", str(tmp_path), "--output", str(out))
    assert_usage_error(proc, "corrupt", out)


@ONCE_IN_THE_IMAGE
def test_a_data_file_whose_arrays_disagree_is_corrupt(tmp_path):
    """An mnist.npz of the right layout whose labels are fewer than its samples trained on
    the labels there were, exit 0."""
    import numpy as np

    np.savez(tmp_path / "mnist.npz", x_train=np.zeros((100, 28, 28), np.uint8),
             y_train=np.zeros(50, np.uint8), x_test=np.zeros((10, 28, 28), np.uint8),
             y_test=np.zeros(10, np.uint8))
    out = tmp_path / "run"
    proc = run_app("train", "--dataset", "mnist", "--data-dir", str(tmp_path), "--offline",
                   "--output", str(out))
    assert_usage_error(proc, "is corrupt or not a dataset file (x_train holds 100 sample(s) of "
                             "shape (28, 28), y_train 50 label(s)); allowed: delete the file", out)


def test_labels_that_are_not_finite_are_named_by_row(tmp_path):
    """NaN among float labels read as values: the line asked for a regression loss."""
    (tmp_path / "nan_labels.py").write_text(
        "import numpy as np\n"
        "def load():\n"
        "    x = np.random.default_rng(0).random((64, 8)).astype('float32')\n"
        "    y = (np.arange(64) % 3).astype('float32')\n"
        "    y[[5, 17]] = np.nan\n"
        "    return (x, y), (x[:16], y[:16] * 0)\n")
    out = tmp_path / "run"
    proc = run_app("train", "--model", "mlp", "--dataset", f"{tmp_path}/nan_labels.py:load",
                   "--epochs", "1", "--output", str(out))
    assert_usage_error(proc, "2 training label(s) are NaN or infinite (rows 5, 17); allowed: "
                             "finite labels: fix or drop those rows", out)


@pytest.mark.parametrize("where", ["arrays", "batched"])
def test_num_classes_the_labels_pass_is_one_line(tmp_path, where):
    """--num-classes 2 for labels 0..3: the loss failed on the first batch with
    TensorFlow's "Received a label value of 3" and left a failed run behind."""
    out = tmp_path / "run"
    proc = run_app("train", "--model", "mlp", "--dataset", f"{DATASETS}:{where}",
                   "--num-classes", "2", "--epochs", "1", "--output", str(out))
    assert_usage_error(proc, f"num_classes 2 is too few for dataset '{DATASETS}:{where}': its "
                             "labels go up to class id 3; allowed: num_classes 4 or more, or "
                             "leave it unset to count the labels", out)


@ONCE_IN_THE_IMAGE
def test_unwritable_output(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    proc = run_app("train", *QUICK, "--output", str(blocker / "run"))
    assert_usage_error(proc, "cannot be created")


@ONCE_IN_THE_IMAGE
def test_an_output_through_a_link_to_nothing_is_one_line_for_every_command(tmp_path):
    """runs -> a volume not mounted today: each command that makes a folder says so in one
    line, exit 2, before any work (train, benchmark and tune ended in os.makedirs'
    FileNotFoundError traceback, notebooks --install in a FileExistsError).  The four
    processes run side by side."""
    link = tmp_path / "runs"
    link.symlink_to(tmp_path / "not-mounted")
    quick = ["--model", "mlp", "--dataset", "synthetic", "--offline"]
    commands = {"train": ["train", *QUICK, "--output", str(link / "a")],
                "benchmark": ["benchmark", *quick, "--output", str(link / "b")],
                "tune": ["tune", *quick, "--output", str(link / "t")],
                "notebooks": ["notebooks", "--install", str(link / "nb")]}
    procs = {name: start_app(*args) for name, args in commands.items()}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=180)
        assert_usage_error(subprocess.CompletedProcess(proc.args, proc.returncode, out, err),
                           f"cannot be created: '{link}' is a link to "
                           f"'{tmp_path / 'not-mounted'}', which does not exist")
    assert os.listdir(tmp_path) == ["runs"]


@ONCE_IN_THE_IMAGE
def test_resume_without_checkpoint(tmp_path):
    out = tmp_path / "run"
    proc = run_app("train", *QUICK, "--output", str(out), "--resume")
    assert_usage_error(proc, "no checkpoint", out)


@ONCE_IN_THE_IMAGE
@pytest.mark.slow
def test_resume_with_incompatible_checkpoint(tmp_path):
    out = tmp_path / "run"
    first = run_app("train", *QUICK, "--epochs", "1", "--output", str(out))
    assert first.returncode == 0, first.stderr
    before = (out / "metrics.json").read_text()
    proc = run_app("train", *QUICK, "--epochs", "2", "--output", str(out), "--resume",
                   "--model", "cnn")
    assert_usage_error(proc, "trained with a different spec (model 'mlp' -> 'cnn')")
    assert (out / "metrics.json").read_text() == before   # the old run is untouched


@ONCE_IN_THE_IMAGE
def test_resume_of_a_metrics_file_that_names_no_job(tmp_path):
    """metrics.json cut to {} beside a checkpoint: one line saying so, not "trained with a
    different spec (model None -> 'mlp')"."""
    out = tmp_path / "run"
    (out / "checkpoints").mkdir(parents=True)
    (out / "checkpoints" / "checkpoint").write_text('model_checkpoint_path: "ckpt-1"\n')
    (out / "checkpoints" / "ckpt-1.index").write_bytes(b"")
    (out / "metrics.json").write_text("{}")
    proc = run_app("train", *QUICK, "--epochs", "2", "--output", str(out), "--resume")
    assert_usage_error(proc, "metrics.json' names no model and dataset the run was trained on; "
                             "the run cannot be resumed safely; allowed: restore it from a copy")
    assert (out / "metrics.json").read_text() == "{}"


@ONCE_IN_THE_IMAGE
@pytest.mark.slow
def test_resume_continues_in_the_runs_own_precision(tmp_path):
    """A run trained under mixed_float16: --resume with another precision asked for is one
    line (float32 to mixed_bfloat16 went on silently, mixed_float16 to float32 failed on
    the checkpoint with TensorFlow's internals); under auto, the default, it keeps its own."""
    out = tmp_path / "run"
    first = run_app("train", *QUICK, "--precision", "mixed_float16", "--epochs", "1",
                    "--output", str(out))
    assert first.returncode == 0, first.stderr
    before = (out / "metrics.json").read_text()
    proc = run_app("train", *QUICK, "--precision", "mixed_bfloat16", "--epochs", "2",
                   "--output", str(out), "--resume")
    assert_usage_error(proc, f"--resume: the run in {str(out)!r} trained under mixed_float16; "
                             "--precision mixed_bfloat16 would continue it under "
                             "mixed_bfloat16; allowed: --precision mixed_float16 or auto")
    assert (out / "metrics.json").read_text() == before
    kept = run_app("train", *QUICK, "--precision", "auto", "--epochs", "2", "--output", str(out),
                   "--resume")
    assert kept.returncode == 0, kept.stderr
    assert "note: --resume keeps the run's precision, mixed_float16 (auto would pick " \
        in kept.stderr, kept.stderr
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["precision"]["policy"] == "mixed_float16"
    assert [e["epoch"] for e in metrics["epochs"]] == [1, 2]


@ONCE_IN_THE_IMAGE
def test_a_batch_larger_than_the_data_trains_in_one_step(tmp_path):
    """--batch-size past the training set is the whole set in one batch: the sentinel's
    copy of a failing batch was sized by the flag (an out-of-memory traceback for 2e7)."""
    out = tmp_path / "run"
    proc = run_app("train", *QUICK, "--batch-size", "20000000", "--epochs", "1",
                   "--output", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["epochs"][0]["steps"] == 1, metrics["epochs"][0]


@ONCE_IN_THE_IMAGE
def test_existing_run_is_not_overwritten(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.json").write_text("{}")
    proc = run_app("train", *QUICK, "--output", str(out))
    assert_usage_error(proc, "already holds a run")


@ONCE_IN_THE_IMAGE
def test_env_text_and_json():
    cluster = json.dumps({"cluster": {"worker": ["a:1", "b:2"]},
                          "task": {"type": "worker", "index": 1}})
    text = run_app("env", env={"TFMP_EPOCHS": "3", "TF_CONFIG": cluster})
    assert text.returncode == 0, text.stderr
    for label in ("TensorFlow:", "Keras:", "NumPy:", "CUDA build:", "CPU bfloat16:",
                  "auto precision:", "Settings from the environment (flags override them):",
                  "  TFMP_EPOCHS=3",
                  "  TF_CONFIG: a cluster of 2 worker(s); this process is worker:1 (not the "
                  "chief)"):
        assert label in text.stdout, label
    # A variable train would refuse: the report still, its error line, and exit 2
    js = run_app("env", "--json", env={"TFMP_EPOCHS": "lots", "TF_CONFIG": "{bad"})
    assert js.returncode == 2, js.stderr
    report = json.loads(js.stdout)
    assert report["auto_precision"]["policy"] in ("float32", "mixed_float16", "mixed_bfloat16")
    assert {"tensorflow", "keras", "python", "numpy", "cuda_version", "cudnn_version",
            "hardware"} <= set(report)
    errors = error_lines(js.stderr)
    assert len(errors) == 2 and errors == report["environment"]["errors"], js.stderr
    assert errors[0].startswith("error: environment variable TFMP_EPOCHS='lots' is not valid")
    assert errors[1].startswith("error: environment variable TF_CONFIG is not valid: not JSON")


@pytest.mark.parametrize("environ, variables, tf_config, errors", [
    ({}, {}, "unset: one worker", 0),
    ({"TFMP_BATCH_SIZE": "64", "TFMP_JIT": "yes", "TFMP_OUTPUT": "", "HOME": "/x"},
     {"TFMP_BATCH_SIZE": 64, "TFMP_JIT": True}, "unset: one worker", 0),
    ({"TFMP_PRECISION": "fp16"}, {"TFMP_PRECISION": None}, "unset: one worker", 1),
    # Refused by train, and named by it as the variable: env took them (a QA pass).
    ({"TFMP_ACCUMULATE": "0"}, {"TFMP_ACCUMULATE": None}, "unset: one worker", 1),
    ({"TFMP_INPUT_SHAPE": "28,x"}, {"TFMP_INPUT_SHAPE": None}, "unset: one worker", 1),
    # another setting's value a flag may give: not this variable's fault
    ({"TFMP_DATASET": "images"}, {"TFMP_DATASET": "images"}, "unset: one worker", 0),
    ({"TF_CONFIG": '{"cluster": {"chief": ["c:1"], "worker": ["w:1"]}, '
                   '"task": {"type": "chief", "index": 0}}'},
     {}, "a cluster of 2 worker(s); this process is chief:0 (the chief)", 0),
    ({"TF_CONFIG": '{"cluster": {"worker": ["w:1"]}, "task": {"type": "worker", "index": 3}}'},
     {}, None, 1),
])
def test_env_checks_the_settings_the_environment_gives(environ, variables, tf_config, errors):
    from app.commands.env import environment_settings, settings_lines

    env = environment_settings(environ)
    assert (env["variables"], env["tf_config"], len(env["errors"])) == (variables, tf_config,
                                                                         errors)
    assert all(e.startswith("error: ") and ("TF_CONFIG" in e or "TFMP_" in e)
               for e in env["errors"]), env["errors"]
    lines = settings_lines(env)
    assert lines[-1] == f"  TF_CONFIG: {tf_config or 'not valid'}"
    assert ("  no TFMP_ setting is set" in lines) == (not variables)


def test_env_text_format_from_a_fake_report():
    from app.machine.envreport import format_text

    text = format_text({
        "python": "3.9.2", "platform": "Linux", "tensorflow": "2.9.3", "keras": "2.9.0",
        "keras_major": 2, "numpy": "1.23.5", "built_with_cuda": True, "cuda_version": "64_112",
        "cudnn_version": "64_8", "auto_precision": {"policy": "mixed_float16", "reason": "T4"},
        "hardware": {"gpus": [{"name": "Tesla T4", "compute_capability": [7, 5],
                               "memory_bytes": 15 * 2**30, "tensor_cores": True}],
                     "cpu_avx512_bf16": False, "cpu_amx": False}})
    assert "GPU 0:         Tesla T4, compute capability 7.5, memory 15.0 GiB, Tensor Cores yes" in text
    assert "CUDA 64_112, cuDNN 64_8" in text


@pytest.mark.parametrize("variable, value, words", [
    ("TFMP_EPOCHS", "lots", "error: environment variable TFMP_EPOCHS='lots' is not valid"),
    ("TFMP_BATCH_SIZE", "0", "error: TFMP_BATCH_SIZE must be at least 1"),
])
def test_tune_refuses_a_bad_variable_as_train_does(tmp_path, variable, value, words):
    """It ran, and the first trial's `tfmp env` failed: "a trial failed: ... (log: -)", exit
    1; TFMP_BATCH_SIZE=0 was called reference_batch_size (a QA pass)."""
    proc = run_app("tune", "--model", "mlp", "--dataset", "synthetic", "--output",
                   str(tmp_path / "t"), env={variable: value})
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert error_lines(proc.stderr) == [line for line in proc.stderr.splitlines()
                                        if line.strip()][-1:]
    assert error_lines(proc.stderr)[0].startswith(words), proc.stderr[-2000:]
    assert not (tmp_path / "t").exists()


def test_a_reader_that_stops_early_ends_the_command_quietly():
    """``tfmp notebooks | head -1`` printed a BrokenPipeError traceback (a QA pass): the
    reader here has gone before the first line, as head has once it read its lines."""
    from tests.unit.helpers import app_env

    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run([sys.executable, "-m", "app", "notebooks"], stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=120, env=app_env())
    finally:
        os.close(write_end)
    assert proc.returncode in (0, 141), proc.stderr
    assert proc.stderr == ""


def test_version_prints_the_packages_version():
    """It said "error: --version comes before the command" (a QA pass)."""
    import app

    pyproject = (ROOT / "pyproject.toml").read_text()
    [version] = re.findall(r'(?m)^version = "([^"]+)"', pyproject)
    assert app.__version__ == version   # the version tfmp reports is the package's
    proc = run_app("--version")
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, f"tfmp {version}\n", "")


def _entry_point_code(entry):
    """The Python each way of starting the program runs, as its launcher would run it."""
    if entry == "python -m app":
        return "import runpy; runpy.run_module('app', run_name='__main__', alter_sys=True)"
    if entry == "the tfmp script":   # the image's /usr/local/bin/tfmp, from docker/bin on the host
        script = ROOT / "docker" / "bin" / "tfmp"
        script = script if script.exists() else "/usr/local/bin/tfmp"
        return f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')"
    # pip's console script: the function pyproject.toml names, its result the exit status
    target = re.search(r'^tfmp = "([\w.]+):(\w+)"$', (ROOT / "pyproject.toml").read_text(),
                       re.MULTILINE)
    module, function = target.groups()
    return f"import sys; from {module} import {function}; sys.exit({function}())"


@pytest.mark.parametrize("entry", ["python -m app", "the tfmp script", "pip's console script"])
def test_a_ctrl_c_during_teardown_leaves_the_decided_status_whatever_started_the_program(entry):
    """The status decided, TensorFlow's teardown can take a moment, and a Ctrl-C then must
    change nothing: not a KeyboardInterrupt traceback, nor a death by SIGINT.  An atexit hook
    sends the Ctrl-C while the interpreter tears down; the command's status (0) stands."""
    late_ctrl_c = ("import atexit, os, signal, sys, time; sys.argv = ['tfmp', 'notebooks']; "
                   "atexit.register(lambda: (os.kill(os.getpid(), signal.SIGINT), time.sleep(1)))")
    proc = subprocess.run([sys.executable, "-c", late_ctrl_c + "\n" + _entry_point_code(entry)],
                          capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr and "KeyboardInterrupt" not in proc.stderr
    assert "notebooks shipped in" in proc.stdout   # the command itself ran
