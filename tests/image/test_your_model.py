"""Your own model in the image (issue 9): a user's files dropped into /workspace are
trained, checked and benchmarked over SSH, trained from a Jupyter kernel through
``app.train``, and trained by a batch ``docker run`` with the folder mounted; TF 2.9.3
(Keras 2) is what runs them."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from image_helpers import HOST_GID, HOST_UID, docker_run, kernel_execute
from test_stack import ssh_client, ssh_run

pytestmark = pytest.mark.docker

FILES = Path(__file__).parent / "user_files"
SMALL = "--batch-size 32 --progress lines --no-save-model --learning-rate 3e-3"


@pytest.fixture(scope="module")
def user_files(stack):
    for name in ("mynet.py", "mydata.py", "clash.py"):
        target = stack.workspace / name
        shutil.copy(FILES / name, target)
        os.chown(target, HOST_UID, HOST_GID)
    return stack


def _ssh(stack, command, timeout=600):
    with ssh_client(stack) as client:
        return ssh_run(client, f"cd /workspace && {command}", timeout=timeout)


def test_user_model_trains_over_ssh(user_files):
    status, out, err = _ssh(user_files, "python -m app train --model mynet:build --dataset "
                            f"mydata:load --precision mixed_bfloat16 --epochs 3 {SMALL} "
                            "--output /workspace/runs/mine")
    assert status == 0, out[-2000:] + err[-3000:]
    m = json.loads((user_files.workspace / "runs/mine/metrics.json").read_text())
    assert m["task"]["model"] == "mynet:build" and m["data"]["input_shape"] == [8, 8]
    assert m["epochs"][-1]["val_accuracy"] >= 0.9


def test_user_model_is_checked_over_ssh(user_files):
    status, out, err = _ssh(user_files, "python -m app check --model ./mynet.py:build "
                            "--dataset mydata:load --json /workspace/check.json")
    assert status == 0, out[-2000:] + err[-3000:]
    report = json.loads((user_files.workspace / "check.json").read_text())
    assert report["verdict"] in ("ready", "ready with warnings"), report
    status, out, err = _ssh(user_files, "python -m app check --model clash:build "
                            "--dataset mydata:load --precision mixed_float16")
    assert status == 1, out[-2000:] + err[-3000:]
    assert "add_bias" in out + err


def test_a_dtype_clash_stops_training_with_one_line(user_files):
    status, out, err = _ssh(user_files, "python -m app train --model clash:build --dataset "
                            f"mydata:load --precision mixed_bfloat16 --epochs 1 {SMALL} "
                            "--output /workspace/runs/clash")
    assert status == 1, out[-2000:] + err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in err, err[-3000:]
    assert "'add_bias' (AddBias" in errors[0] and "self.compute_dtype" in errors[0]


def test_user_model_is_benchmarked_over_ssh(user_files):
    status, out, err = _ssh(user_files, "python -m app benchmark --model mynet:build --dataset "
                            "mydata:load --policies float32,mixed_bfloat16 --repeats 1 "
                            "--epochs 2 --batch-size 32 --output /workspace/bench", timeout=900)
    assert status == 0, out[-2000:] + err[-3000:]
    report = json.loads((user_files.workspace / "bench/benchmark.json").read_text())
    assert report["settings"]["model"] == "mynet:build"
    assert report["policies_run"] == ["float32", "mixed_bfloat16"]
    assert all(report["results"][p]["runs_ok"] == 1 for p in report["policies_run"])
    # the input-rate child timed the user's pipeline and built the user's model
    assert report["input_pipeline"]["samples_per_second"] > 0
    assert report["layer_widths"]["widths"] == [64]
    assert "| float32 |" in out and "| mixed_bfloat16 |" in out
    assert "Input pipeline alone" in out


def test_user_model_trains_from_a_jupyter_kernel(user_files):
    code = ("import sys; sys.path.insert(0, '/workspace')\n"
            "import app, mynet, mydata\n"
            "m = app.train(model=mynet.build, data=mydata.load, precision='mixed_bfloat16',\n"
            "              epochs=3, batch_size=32, learning_rate=3e-3, save_model=False,\n"
            "              output='/workspace/runs/from-kernel')\n"
            "print('RESULT', m['status'], m['epochs'][-1]['val_accuracy'])\n")
    text, errors = kernel_execute(user_files.base_url, user_files.token(), code, timeout=600)
    assert not errors, errors
    line = [ln for ln in text.splitlines() if ln.startswith("RESULT")][-1]
    status, accuracy = line.split()[1:]
    assert status == "completed" and float(accuracy) >= 0.9, text[-2000:]
    assert (user_files.workspace / "runs/from-kernel/metrics.json").stat().st_uid == HOST_UID


def test_batch_docker_run_trains_the_mounted_folder(image, tmp_path):
    for name in ("mynet.py", "mydata.py"):
        shutil.copy(FILES / name, tmp_path / name)
    os.chown(tmp_path, HOST_UID, HOST_GID)
    proc = docker_run(image, "-e", "TFMP_QUIET=1", "-e", f"NB_UID={HOST_UID}", "-e",
                      f"NB_GID={HOST_GID}", "-v", f"{tmp_path}:/workspace", command=[
                          "python", "-m", "app", "train", "--model", "./mynet.py:build",
                          "--dataset", "./mydata.py:load", "--precision", "float32",
                          "--epochs", "2", *SMALL.split(), "--output", "/workspace/run"],
                      timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    m = json.loads((tmp_path / "run/metrics.json").read_text())
    assert m["status"] == "completed" and m["task"]["model"] == "./mynet.py:build"
