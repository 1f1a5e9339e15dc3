"""A training job as a scheduler runs it (`docker run IMAGE tfmp train ...`), stopped
the way schedulers and users stop it (and retried while it runs): `docker stop` (SIGTERM through tini) saves a checkpoint
and exits 143, and `--resume` in a *new* container on the same volume finishes the run;
`docker kill --signal INT` (Ctrl-C) exits 130; Ctrl-C twice in `docker run -it` ends a step
that never returns.

Small on purpose: synthetic data, an MLP, float32; the signal is sent once the job's own log
shows a step of epoch 2 (a `step N:` line after the `epoch 1/E:` line)."""
from __future__ import annotations

import json
import os
import re
import select
import time
import uuid

import pytest

from image_helpers import docker_run, run, wait_until

pytestmark = pytest.mark.docker

EPOCHS = 3


def _train_args(output: str) -> list:
    return ["tfmp", "train", "--dataset", "synthetic", "--model", "mlp",
            "--max-train-samples", "20000", "--max-val-samples", "128", "--batch-size", "32",
            "--precision", "float32", "--epochs", str(EPOCHS), "--offline", "--no-save-model",
            "--progress", "lines", "--log-every", "50", "--output", output]


def _inside_epoch(stdout: str, epoch: int) -> bool:
    lines = stdout.splitlines()
    ended = [i for i, line in enumerate(lines) if line.startswith(f"epoch {epoch - 1}/")]
    assert not any(line.startswith(f"epoch {epoch}/") for line in lines), \
        f"epoch {epoch} ended before the signal could be sent:\n{stdout[-2000:]}"
    return bool(ended) and any(line.startswith("step ") for line in lines[ended[0] + 1:])


@pytest.fixture
def volume():
    name = f"tfmp-t-{uuid.uuid4().hex[:10]}"
    run(["docker", "volume", "create", name], timeout=30)
    yield name
    # The `container` fixture may not have removed the stopped job yet: a volume in use
    # cannot be removed, so its users go first.
    users = run(["docker", "ps", "-aq", "--filter", f"volume={name}"], check=False).stdout.split()
    if users:
        run(["docker", "rm", "-f", "-v", *users], check=False, timeout=60)
    run(["docker", "volume", "rm", "-f", name], timeout=60)


def _start_training(container, volume: str, output: str) -> str:
    name = container("-e", "TFMP_QUIET=1", "-v", f"{volume}:/workspace",
                     command=_train_args(output))

    deadline = time.monotonic() + 240
    while True:   # not wait_until: a job that ended or went past epoch 2 fails at once
        logs = run(["docker", "logs", name])
        if _inside_epoch(logs.stdout, 2):
            return name
        output = logs.stdout[-2000:] + logs.stderr[-2000:]
        state = run(["docker", "inspect", "-f", "{{.State.Running}}", name]).stdout.strip()
        assert state == "true", f"the job ended before epoch 2:\n{output}"
        assert time.monotonic() < deadline, f"no step of epoch 2 logged within 240 s:\n{output}"
        time.sleep(0.5)


def _exit_code(name: str) -> int:
    return int(run(["docker", "inspect", "-f", "{{.State.ExitCode}}", name]).stdout.strip())


def test_docker_stop_saves_a_checkpoint_and_a_new_container_resumes(image, container, volume):
    output = "/workspace/runs/stopped"
    name = _start_training(container, volume, output)
    run(["docker", "stop", "-t", "60", name], timeout=120)   # 60 s grace: a kill would be 137
    logs = run(["docker", "logs", name])
    assert _exit_code(name) == 143, logs.stdout[-2000:] + logs.stderr[-2000:]
    assert "received signal 15" in logs.stderr and "--resume" in logs.stderr, logs.stderr[-2000:]

    script = (f"{' '.join(_train_args(output))} --resume && "
              f"cat {output}/metrics.json > /tmp/m.json && echo METRICS && cat /tmp/m.json")
    proc = docker_run(image, "-e", "TFMP_QUIET=1", "-v", f"{volume}:/workspace",
                      command=["bash", "-c", script], timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert f"done: {EPOCHS} epoch(s)" in proc.stdout
    metrics = json.loads(proc.stdout.split("METRICS\n", 1)[1])
    assert metrics["status"] == "completed"
    assert [e["epoch"] for e in metrics["epochs"]] == list(range(1, EPOCHS + 1))
    # the new container went on from the checkpoint: it trained epochs 2.. only
    trained_here = [line for line in proc.stdout.splitlines() if line.startswith("epoch ")]
    assert trained_here[0].startswith(f"epoch 2/{EPOCHS}:"), proc.stdout[-2000:]


def test_docker_stop_of_the_service_lets_a_job_started_in_it_save_a_checkpoint(image, container,
                                                                                volume):
    """`tfmp train` started inside the running service (over SSH, in a terminal; here with
    `docker exec` as the user, which PID 1 does not start either): `docker stop` of the service
    sends the job SIGTERM before the services stop, and waits for it: it saves a checkpoint
    and metrics.json says interrupted, not "running" for good."""
    name = container("-e", "ENABLE_SSH=0", "-v", f"{volume}:/workspace")
    wait_until(lambda: "==> " in run(["docker", "logs", name]).stderr, 120,
               what="the service to start")
    output = "/workspace/runs/in-service"
    run(["docker", "exec", "-d", "-u", "tf", name, "bash", "-c",
         " ".join(_train_args(output)) + " > /tmp/job.log 2>&1"], timeout=30)

    def in_epoch_2() -> bool:
        log = run(["docker", "exec", name, "cat", "/tmp/job.log"], check=False).stdout
        return _inside_epoch(log, 2)
    wait_until(in_epoch_2, 240, interval=0.5, what="a step of epoch 2 in the job's log")
    run(["docker", "stop", "-t", "60", name], timeout=120)
    logs = run(["docker", "logs", name]).stderr
    assert re.search(r"sending SIGTERM to \d process\(es\) of UID 1000", logs), logs[-2000:]
    assert "still running after" not in logs, logs[-2000:]
    proc = docker_run(image, "--entrypoint", "bash", "-v", f"{volume}:/workspace",
                      command=["-c", f"cat {output}/metrics.json; echo; echo FILES; "
                               f"ls {output}/checkpoints"], timeout=60)
    saved, files = proc.stdout.split("\nFILES\n")
    assert json.loads(saved)["status"] == "interrupted", (saved[-500:], logs[-2000:])
    assert "ckpt-" in files, files


def test_sigint_to_a_training_container_exits_130(container, volume):
    name = _start_training(container, volume, "/workspace/runs/interrupted")
    run(["docker", "kill", "--signal", "INT", name], timeout=30)
    wait_until(lambda: run(["docker", "inspect", "-f", "{{.State.Running}}", name]).stdout.strip()
               == "false", 120, what=f"{name} to exit after SIGINT")
    logs = run(["docker", "logs", name])
    assert _exit_code(name) == 130, logs.stdout[-2000:] + logs.stderr[-2000:]
    assert "received signal 2" in logs.stderr and "Traceback" not in logs.stderr


def _pause(container: str, attempts: int = 5) -> None:
    """docker pause, again while the runtime reports "unable to freeze": the cgroup freezer
    gives up when a process is mid-fork or in the kernel, which a training process on a
    loaded machine can be (seen once, in a fresh-clone CI run on 2 busy cores)."""
    for attempt in range(attempts):
        proc = run(["docker", "pause", container], timeout=30, check=False)
        if proc.returncode == 0:
            return
        if "unable to freeze" not in proc.stderr or attempt == attempts - 1:
            raise AssertionError(f"docker pause {container} -> exit {proc.returncode}: "
                                 f"{proc.stderr.strip()}")
        time.sleep(1)


def test_two_jobs_on_one_volume_one_trains_and_docker_kill_frees_the_folder(image, container,
                                                                             volume):
    """A scheduler retries a job whose first attempt still runs: the retry stops at once
    (exit 2, the other run named) and touches nothing; once the first container is killed
    outright, the next attempt resumes without any stale lock to clean up."""
    output = "/workspace/runs/twin"
    first = _start_training(container, volume, output)
    _pause(first)   # nothing changes in the folder but by the retry
    try:
        listing = ["bash", "-c", f"cd {output} && find . -type f -printf '%p %s %T@\\n' | sort"]
        before = docker_run(image, "-e", "TFMP_QUIET=1", "-v", f"{volume}:/workspace",
                            command=listing).stdout
        retry = docker_run(image, "-e", "TFMP_QUIET=1", "-v", f"{volume}:/workspace",
                           command=_train_args(output), timeout=300)
        after = docker_run(image, "-e", "TFMP_QUIET=1", "-v", f"{volume}:/workspace",
                           command=listing).stdout
    finally:
        run(["docker", "unpause", first], timeout=30)
    assert retry.returncode == 2, retry.stdout[-1000:] + retry.stderr[-2000:]
    [line] = [x for x in retry.stderr.splitlines() if x.startswith("error:")]
    assert f"output directory '{output}' is in use by another run" in line
    hostname = run(["docker", "inspect", "-f", "{{.Config.Hostname}}", first]).stdout.strip()
    assert f"host {hostname}," in line and "command: tfmp train" in line, line
    assert "metrics.json" in before and before == after

    run(["docker", "kill", first], timeout=30)      # SIGKILL: no handler, no cleanup
    resumed = docker_run(image, "-e", "TFMP_QUIET=1", "-v", f"{volume}:/workspace",
                         command=[*_train_args(output), "--resume"], timeout=600)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    assert f"done: {EPOCHS} epoch(s)" in resumed.stdout


class _Terminal:
    """``docker run -it`` in a pseudo-terminal, as a user types into it: Ctrl-C is the
    terminal's ^C (the kernel's SIGINT to the foreground process group, under tini)."""

    def __init__(self, cmd):
        import pty

        self.pid, self.fd = pty.fork()
        if self.pid == 0:   # the child: exec or die, never return into pytest
            try:
                os.execvp(cmd[0], cmd)
            finally:
                os._exit(127)
        self.text = ""

    def read_for(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            ready, _, _ = select.select([self.fd], [], [], 0.2)
            if not ready:
                continue
            try:
                chunk = os.read(self.fd, 4096)
            except OSError:   # the other end closed: the container is gone
                return
            if not chunk:
                return
            self.text += chunk.decode(errors="replace")

    def read_until(self, needle: str, seconds: float) -> None:
        end = time.monotonic() + seconds
        while needle not in self.text:
            assert time.monotonic() < end, f"{needle!r} not seen in {seconds:.0f} s:\n{self.text[-2000:]}"
            self.read_for(0.5)

    def ctrl_c(self) -> None:
        os.write(self.fd, b"\x03")

    def wait(self, seconds: float) -> int:
        end = time.monotonic() + seconds
        while True:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
            assert time.monotonic() < end, f"still running after {seconds:.0f} s:\n{self.text[-2000:]}"
            self.read_for(0.5)


def test_ctrl_c_twice_in_a_terminal_ends_a_stuck_step(image):
    """`docker run -it IMAGE tfmp train ...` whose step never returns: the first Ctrl-C is
    answered and the job keeps waiting for the step (tini delivers it once: a single ^C
    must never force the stop), the second ends it at once with 130."""
    from tests.paths import USER_MODELS

    name = f"tfmp-t-{uuid.uuid4().hex[:10]}"
    cmd = ["docker", "run", "-it", "--rm", "--name", name, "-e", "TFMP_QUIET=1",
           "-e", "STUCK_MARK=/tmp/stuck", "-e", "STUCK_ROWS=32", "-e", "STUCK_AT=3",
           "-v", f"{USER_MODELS}:/models:ro", image,
           "tfmp", "train", "--model", "/models/stuck.py:build",
           "--dataset", "/models/datasets.py:arrays", "--precision", "float32", "--epochs", "2",
           "--batch-size", "32", "--offline", "--no-save-model", "--progress", "lines",
           "--output", "/tmp/run"]
    term = _Terminal(cmd)
    try:
        term.read_until("strategy:", 180)
        # The step is stuck once the mark exists (the third training batch).
        wait_until(lambda: run(["docker", "exec", name, "test", "-e", "/tmp/stuck"],
                               check=False).returncode == 0, 120, what="the stuck step")
        term.ctrl_c()
        term.read_until("received signal 2: saving a checkpoint", 30)
        term.read_for(3)
        assert "signal 2 again" not in term.text, term.text[-2000:]
        assert run(["docker", "inspect", "-f", "{{.State.Running}}", name]).stdout.strip() == "true"
        term.ctrl_c()
        code = term.wait(30)
    finally:
        run(["docker", "rm", "-f", name], check=False, timeout=60)
    assert code == 130, term.text[-2000:]
    assert ("received signal 2 again: stopping now, without saving; no checkpoint had been "
            "saved, so a rerun starts from the beginning") in term.text, term.text[-2000:]
