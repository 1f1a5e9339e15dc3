"""The image run directly (`docker run`): batch jobs, bad settings, signals,
supervision, password login, pip constraints, the self-test, build hygiene."""
from __future__ import annotations

import json
import os
import re

import paramiko
import pytest

from image_helpers import (HOST_CA_BUNDLE, REPO, docker_run, exec_in, free_port, health, run,
                           wait_until)

pytestmark = pytest.mark.docker


# --- batch jobs ------------------------------------------------------------------------

@pytest.mark.parametrize("status", [0, 3, 42])
def test_batch_run_passes_the_exit_status_through(image, status):
    proc = docker_run(image, "-e", "TFMP_QUIET=1",
                      command=["bash", "-lc", f"test \"$(id -un)\" = tf && exit {status}"])
    assert proc.returncode == status, proc.stderr


def test_user_start_hooks_run_in_docker_stacks_folders(image, tmp_path):
    """start-notebook.d and before-notebook.d, as docker-stacks runs them: *.sh sourced (an
    exported variable reaches the command), executables run, anything else skipped."""
    start, before = tmp_path / "start-notebook.d", tmp_path / "before-notebook.d"
    start.mkdir()
    before.mkdir()
    (start / "10-export.sh").write_text("export HOOKED_BY_START=yes\n")
    (before / "20-mark").write_text("#!/bin/sh\necho \"before hook ran as $(id -u)\" >&2\n")
    (before / "20-mark").chmod(0o755)
    (before / "README.txt").write_text("not a hook\n")
    for d in (start, before):
        d.chmod(0o755)
    proc = docker_run(image, "-e", "TFMP_QUIET=1",
                      "-v", f"{start}:/usr/local/bin/start-notebook.d:ro",
                      "-v", f"{before}:/usr/local/bin/before-notebook.d:ro",
                      command=["bash", "-c", "echo \"var=$HOOKED_BY_START\""])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "var=yes"
    assert "hook: sourcing /usr/local/bin/start-notebook.d/10-export.sh" in proc.stderr
    assert "before hook ran as 0" in proc.stderr   # as root, before the command's user switch
    assert "hook: skipped /usr/local/bin/before-notebook.d/README.txt" in proc.stderr
    # A hook that fails is one ERROR line and the start goes on (docker-stacks' rule), a *.sh
    # one too; hooks run without the entrypoint's set -eu (an unset variable is empty).
    (before / "20-mark").write_text("#!/bin/sh\nexit 7\n")
    (before / "30-fails.sh").write_text("echo sourced >&2\nfalse\n")
    (before / "40-after.sh").write_text("echo \"after: $UNSET_IN_HOOK_OK\" >&2\n")
    proc = docker_run(image, "-e", "TFMP_QUIET=1",
                      "-v", f"{before}:/usr/local/bin/before-notebook.d:ro", command=["echo", "ran"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ran"
    assert "ERROR hook /usr/local/bin/before-notebook.d/20-mark exited with status 7; the start goes on" in proc.stderr
    assert "ERROR hook /usr/local/bin/before-notebook.d/30-fails.sh exited with status 1" in proc.stderr
    assert "after: " in proc.stderr


def test_batch_python_module_runs_as_the_user(image):
    proc = docker_run(image, "-e", "TFMP_QUIET=1", command=[
        "python", "-c", "import os, app, tensorflow as tf; print(os.getuid(), tf.__version__)"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1000", "2.9.3"]


def test_batch_tfmp_command_runs_the_package_beside_a_users_app_py(image, tmp_path):
    """`docker run IMAGE tfmp ...` in the workspace (the image's working folder) that holds a
    user's own app.py: the package runs, not their file."""
    (tmp_path / "app.py").write_text("print('HIJACKED')\nraise SystemExit(42)\n")
    proc = docker_run(image, "-e", "TFMP_QUIET=1", "-v", f"{tmp_path}:/workspace",
                      command=["tfmp", "env", "--json"])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["tensorflow"] == "2.9.3" and report["keras_major"] == 2, report
    # XLA on a GPU box: libdevice and ptxas present where TF 2.9 looks, and ptxas answers.
    xla = report["xla_gpu"]
    assert xla["can_compile"], xla
    assert xla["libdevice"] in ("/usr/local/cuda-11.2/nvvm/libdevice/libdevice.10.bc",
                                "/usr/local/cuda/nvvm/libdevice/libdevice.10.bc"), xla
    assert xla["ptxas"] and xla["ptxas_version"].startswith("11."), xla
    assert report["tf32"] == dict(report["tf32"], on=False, gpu_capable=False), report["tf32"]
    files = docker_run(image, "-e", "TFMP_QUIET=1", command=[
        "bash", "-c", "test -s \"$(readlink -f /usr/local/cuda/nvvm/libdevice/libdevice.10.bc)\""
        " && test -x \"$(readlink -f /usr/local/cuda/bin/ptxas)\" && ptxas --version"])
    assert files.returncode == 0, files.stdout + files.stderr
    assert "release 11.8" in files.stdout, files.stdout
    from app.machine.envreport import format_text   # `tfmp env`'s text of the same report

    assert "XLA on GPU:    can compile (libdevice /usr/local/cuda" in format_text(report)


def test_a_tfmp_command_alone_runs_tfmp_and_an_unknown_program_is_one_line(image):
    """`docker run IMAGE tune ...` is `tfmp tune ...` (it used to end in env's "'tune': No
    such file or directory"); a program that is nowhere is one line and status 127."""
    proc = docker_run(image, "-e", "TFMP_QUIET=1", command=["tune", "--help"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("usage: tfmp tune"), proc.stdout[:500]
    proc = docker_run(image, "-e", "TFMP_QUIET=1", command=["trian", "--epochs", "1"])
    assert proc.returncode == 127, proc.stdout + proc.stderr
    fatal = [line for line in proc.stderr.splitlines() if "FATAL" in line]
    assert len(fatal) == 1 and "no program named 'trian'" in fatal[0] \
        and "tfmp COMMAND" in fatal[0], proc.stderr
    assert "No such file" not in proc.stderr, proc.stderr
    # --help as the command: the container's commands, nothing started.
    proc = docker_run(image, command=["--help"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("usage: docker run") and "self-test" in proc.stdout, proc.stdout
    assert "train env benchmark notebooks check tune" in proc.stdout, proc.stdout
    # `env` alone is /usr/bin/env (docker run IMAGE env lists the variables, as anywhere):
    # the usage says so rather than promising tfmp's.
    assert "without tfmp: train benchmark notebooks check tune (" in proc.stdout, proc.stdout
    assert "env alone is the system's program: tfmp env" in proc.stdout, proc.stdout
    assert "[entrypoint]" not in proc.stderr, proc.stderr


def test_batch_app_usage_error_is_exit_2(image):
    proc = docker_run(image, "-e", "TFMP_QUIET=1",
                      command=["python", "-m", "app", "train", "--precision", "fp8"])
    assert proc.returncode == 2, proc.stdout + proc.stderr


def test_compose_batch_profile_runs_training(image, tmp_path):
    env = dict(os.environ, COMPOSE_PROJECT_NAME=f"tfmpbatch{os.getpid()}", IMAGE=image,
               MEMLOCK_LIMIT=_memlock())
    args = ["docker", "compose", "-f", "docker-compose.yml", "-f", "docker-compose.cpu.yml"]
    try:
        proc = run(args + ["run", "--rm", "train", "python", "-m", "app", "train",
                           "--dataset", "synthetic",
                           "--model", "mlp", "--epochs", "1", "--precision", "float32",
                           "--max-train-samples", "128", "--max-val-samples", "32",
                           "--output", "/workspace/runs/batch", "--no-save-model",
                           "--progress", "lines"], env=env, timeout=300, check=False)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        assert "done: 1 epoch(s)" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:]
        check = run(args + ["run", "--rm", "--entrypoint", "cat", "train",
                            "/workspace/runs/batch/metrics.json"], env=env, timeout=120)
        assert '"completed"' in check.stdout
    finally:
        run(args + ["down", "-v"], env=env, timeout=120, check=False)


def _memlock() -> str:
    from image_helpers import memlock_limit

    return memlock_limit()


def test_a_read_only_workspace_is_a_warning_and_the_command_runs(image, tmp_path):
    """-v DIR:/workspace:ro of a folder UID 1000 cannot write: the entrypoint's chown of its
    top failed and ended the container (exit 1, chown's line only) before the command ran,
    though its output could go elsewhere."""
    ro = tmp_path / "ro"
    ro.mkdir()
    os.chmod(ro, 0o755)   # root's: the image's user may not write there
    proc = docker_run(image, "-v", f"{ro}:/workspace:ro", command=["echo", "ran"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "ran"
    assert ("WARN  /workspace is not writable by UID 1000 and cannot be made so (Read-only "
            "file system): what is saved there fails; mount it read-write, or give --output "
            "(TFMP_OUTPUT) another folder") in proc.stderr, proc.stderr[-2000:]


TEAM_RUN = """
set -eu
mkdir -p /tmp/team && chgrp 4010 /tmp/team && chmod 2775 /tmp/team
as() {  # as UID $1 of the team's group, umask 002, in the team's folder
  uid=$1; shift
  setpriv --reuid "$uid" --regid 4010 --clear-groups env HOME=/tmp/team/home-$uid \\
    bash -c 'umask 002; mkdir -p "$HOME"; cd /tmp/team; "$@"' team "$@"
}
train="tfmp train --model mlp --dataset synthetic --max-train-samples 256 --offline
       --max-val-samples 64 --precision float32 --batch-size 32 --progress lines
       --output run --workspace ws"
as 4011 $train --epochs 1 >/dev/null
as 4012 $train --epochs 2 --resume >/dev/null
stat -c '%u %a %n' /tmp/team/run/checkpoints /tmp/team/run/checkpoints/* /tmp/team/run/model | sort -k3
"""


def test_a_teammate_resumes_a_run_another_member_of_the_group_started(image):
    """A team's shared run folder (one group, umask 002): TensorFlow made checkpoints/ and
    the saved model's folders 0755 whatever the umask, so the second member's --resume
    failed to write the next checkpoint.  The run's folders follow the umask now."""
    proc = docker_run(image, "--user", "0", "--entrypoint", "bash", "-e", "TFMP_QUIET=1",
                      command=["-c", TEAM_RUN], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line.split() for line in proc.stdout.splitlines()]
    assert any(uid == "4012" for uid, _, _ in rows), rows    # the teammate's checkpoint
    assert {mode for _, mode, name in rows if name.endswith(("/checkpoints", "/model"))} <= {
        "775", "2775"}, rows


# --- bad settings: one clear line, non-zero exit -------------------------------------

@pytest.mark.parametrize("env, message", [
    (["-e", "NB_UID=0"], "NB_UID=0 is refused: the user must not be root; allowed: your host "
                         "user's `id -u`, or, where that is root (0), the UID of a regular user"),
    (["-e", "NB_UID=abc"], "NB_UID must be a number"),
    (["-e", "PUBLIC_KEY=ssh-ed25519 not-a-key"], "PUBLIC_KEY line 1 is not an OpenSSH public key"),
    (["-e", "JUPYTER_TOKEN_FILE=/nonexistent/token"], "JUPYTER_TOKEN_FILE='/nonexistent/token' is not a readable file"),
    (["-e", "JUPYTER_TOKEN="], "JUPYTER_TOKEN is set but empty"),
    (["-e", "JUPYTER_TOKEN=a b"], "may contain only"),
    # The characters as typed: printf %q showed "\\ " for a space and '\\"' for a quote.
    (["-e", 'JUPYTER_TOKEN=a b"c$d e'], """(it goes into URLs); found: ' ', '"', '$'"""),
    (["-e", "SSH_PASSWORD="], "SSH_PASSWORD is set but empty"),
    (["-e", "JUPYTER_TOKEN_FILE="], "JUPYTER_TOKEN_FILE is set but empty; unset it or give the "
                                    "path of a file holding JUPYTER_TOKEN"),
    (["-e", "SSH_PASSWORD_FILE="], "SSH_PASSWORD_FILE is set but empty"),
    (["-e", "ENABLE_SSH=maybe"], "ENABLE_SSH must be 1 or 0"),
    (["-e", "JUPYTER_UI=classic"], "JUPYTER_UI must be lab or notebook. Received: JUPYTER_UI='classic'"),
    (["-e", "TFMP_GPU_PROFILING=1"], "TFMP_GPU_PROFILING=1 needs CAP_SYS_ADMIN in the container: "
                                     "start it with --cap-add SYS_ADMIN"),
    (["-e", "TFMP_GPU_PROFILING=yes"], "TFMP_GPU_PROFILING must be 1 or 0"),
], ids=["uid0", "uid-text", "bad-key", "token-file", "empty-token", "token-space", "token-chars",
        "empty-password", "empty-token-file", "empty-password-file", "enable-ssh", "jupyter-ui", "gpu-profiling-no-cap",
        "gpu-profiling-value"])
def test_bad_environment_fails_with_one_clear_line(image, env, message):
    proc = docker_run(image, "-e", "TFMP_QUIET=1", *env, timeout=60)
    assert proc.returncode != 0
    fatal = [line for line in proc.stderr.splitlines() if "FATAL" in line]
    assert len(fatal) == 1 and message in fatal[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


# --- serve mode: signals, supervision, tini ------------------------------------------

def _serve(container, *args):
    name = container("--shm-size=256m", "-e", "JUPYTER_TOKEN=test-token-123", *args)
    wait_until(lambda: health(name).startswith("healthy"), 90, what=f"{name} healthy")
    return name


def test_docker_stop_is_handled_by_the_entrypoint(container):
    """SIGTERM reaches the entrypoint through tini and it stops the services itself: exit 0
    and its log line.  Ignored, Docker would kill it at the end of the grace period (137).
    How long a stop takes is a figure of tests/benchmarks/bench_image.sh."""
    name = _serve(container)
    run(["docker", "stop", "-t", "30", name], timeout=90)
    code = run(["docker", "inspect", "-f", "{{.State.ExitCode}}", name]).stdout.strip()
    logs = run(["docker", "logs", name]).stderr
    assert code == "0", logs[-2000:]
    assert "stopping (signal received)" in logs, logs[-2000:]


@pytest.mark.parametrize("victim", ["jupyter-lab", "sshd"])
def test_container_exits_non_zero_when_a_service_dies(container, victim):
    name = _serve(container)
    pattern = "jupyter-lab" if victim == "jupyter-lab" else "sshd -D"
    exec_in(name, "pkill", "-KILL", "-f", pattern, timeout=20)
    wait_until(lambda: health(name).endswith("|exited"), 30, what=f"{name} to exit")
    code = int(run(["docker", "inspect", "-f", "{{.State.ExitCode}}", name]).stdout.strip())
    assert code != 0
    logs = run(["docker", "logs", name]).stderr
    assert "exited (status" in logs


def test_pid1_is_tini_for_batch_jobs(image):
    proc = docker_run(image, "-e", "TFMP_QUIET=1", command=["cat", "/proc/1/cmdline"])
    assert proc.stdout.split("\0")[0].endswith("tini"), proc.stdout


def test_password_login_only_when_configured(container):
    port = free_port()
    name = _serve(container, "-p", f"127.0.0.1:{port}:22", "-e", "SSH_PASSWORD=s3cret-pass")
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
    client.connect("127.0.0.1", port=port, username="tf", password="s3cret-pass",
                   allow_agent=False, look_for_keys=False, timeout=15)
    try:
        _, out, _ = client.exec_command("whoami", timeout=30)
        assert out.read().decode().strip() == "tf"
    finally:
        client.close()
    with pytest.raises(paramiko.AuthenticationException):
        client.connect("127.0.0.1", port=port, username="tf", password="wrong",
                       allow_agent=False, look_for_keys=False, timeout=15)
    # ...and the start-up log says password login is on (it is off unless configured:
    # test_stack.py::test_ssh_password_is_refused_by_default).
    assert "password login enabled" in run(["docker", "logs", name]).stderr


def test_non_root_start_runs_jupyter_only(container):
    name = container("-u", "1234:1234", "-e", "JUPYTER_TOKEN=test-token-123")
    wait_until(lambda: health(name).startswith("healthy"), 90, what=f"{name} healthy")
    logs = run(["docker", "logs", name]).stderr
    assert "only JupyterLab runs" in logs


# --- pip cannot break TensorFlow ----------------------------------------------------------

def test_pip_upgrade_of_numpy_keeps_tensorflow_importable(image):
    """`pip install -U numpy` would bring numpy 2 (TF 2.9 then fails to import);
    PIP_CONSTRAINT keeps it below 2.  Needs the index (the host's CA, as a user
    behind a TLS proxy would pass theirs)."""
    script = ("pip install --upgrade numpy >/tmp/pip.log 2>&1; echo pip-exit=$?; "
              "python -c 'import numpy, tensorflow as tf; print(\"numpy\", numpy.__version__, \"tf\", tf.__version__)'")
    proc = docker_run(image, "-e", "TFMP_QUIET=1", "-v", f"{HOST_CA_BUNDLE}:/tmp/host-ca.crt:ro",
                      "-e", "PIP_CERT=/tmp/host-ca.crt",
                      command=["bash", "-lc", script], timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "pip-exit=0" in proc.stdout, proc.stdout
    numpy_version = proc.stdout.split("numpy ")[1].split()[0]
    assert int(numpy_version.split(".")[0]) < 2 and "tf 2.9.3" in proc.stdout


def test_pip_install_of_numpy_2_is_refused_clearly(image):
    proc = docker_run(image, "-e", "TFMP_QUIET=1", "-v", f"{HOST_CA_BUNDLE}:/tmp/host-ca.crt:ro",
                      "-e", "PIP_CERT=/tmp/host-ca.crt",
                      command=["bash", "-lc", "pip install 'numpy>=2'"], timeout=300)
    assert proc.returncode != 0
    assert "numpy" in (proc.stdout + proc.stderr) and "conflict" in (proc.stdout + proc.stderr).lower()


# --- self-test, build hygiene -------------------------------------------------------------

# Its own xdist group: it needs the image, not the shared stack, and runs for minutes, so the
# worker that is not running the other image tests can take it (tests/conftest.py).
@pytest.mark.xdist_group("image-self-test")
def test_self_test_runs_the_apps_unit_tests_in_the_image(image):
    # -p no:warnings: TF 2.9's numpy deprecation warnings would push the failures out of view.
    # The timeout: the run took 786-1028 s on a shared 2-core AMD machine with AVX-512 and
    # 1452 s on one without (2026-12-02, beside the host's tests on the other worker);
    # 3000 s keeps a margin where a machine is slower still, inside CI's 90 minutes.
    proc = docker_run(image, "--shm-size=256m", command=["self-test", "-p", "no:warnings"],
                      timeout=3000)
    failures = proc.stdout.find("= FAILURES =")
    tail = (proc.stdout[failures:failures + 8000] if failures >= 0 else proc.stdout[-3000:]) \
        + proc.stderr[-2000:]
    assert proc.returncode == 0, tail
    assert re.search(r"\b\d+ passed\b", proc.stdout) and " failed" not in proc.stdout, tail
    # Only GPU tests (no GPU here), host-only ones and those needing bfloat16 kernels this
    # TensorFlow lacks on this CPU (tests/conftest.py BF16_SKIP: TF 2.9 without AVX-512) may
    # skip; the run itself fails on any other skip (--image-self-test), and the summary (-ra)
    # is read here too.
    skipped = [line for line in proc.stdout.splitlines() if line.startswith("SKIPPED")]
    allowed = ("no GPU visible to TensorFlow on this machine", "host only: ",
               "this TensorFlow cannot run mixed_bfloat16 ")
    assert skipped, "no skip reported at all: is -ra still on?"
    assert all(any(a in line for a in allowed) for line in skipped), "\n".join(skipped)
    assert "UNEXPECTED SKIP" not in proc.stdout


def test_no_build_secret_or_nvidia_apt_source_left_in_the_image(image):
    proc = docker_run(image, "-e", "TFMP_QUIET=1", command=["bash", "-c",
                      "find /run/secrets -type f 2>/dev/null; ls /tmp/pip-ca.* 2>/dev/null; env | grep -c PIP_CERT; "
                      "grep -rlis 'nvidia\\|cuda' /etc/apt/sources.list /etc/apt/sources.list.d/; "
                      "ls /etc/ssh/ssh_host_* 2>/dev/null; true"])
    assert proc.stdout.split() == ["0"], proc.stdout


def test_app_change_only_rebuilds_the_last_layers(image):
    """Build-order check: every layer before `COPY app` comes from the cache."""
    history = run(["docker", "history", "--no-trunc", "--format", "{{.CreatedBy}}", image]).stdout
    lines = [line for line in history.splitlines() if line.strip()]
    app_idx = next(i for i, line in enumerate(lines) if "/opt/tfmp/src/app" in line and "COPY" in line)
    pip_idx = next(i for i, line in enumerate(lines) if "pip-install.sh" in line)
    assert app_idx < pip_idx  # history is newest first: app is copied after pip ran
    dockerfile = (REPO / "Dockerfile").read_text()
    assert dockerfile.index("COPY app ") > dockerfile.index("pip-install.sh -r")


def test_gpu_profiling_keeps_cap_sys_admin_for_the_user_only_when_asked(image):
    """TFMP_GPU_PROFILING=1 with --cap-add SYS_ADMIN: a job as the user tf holds CAP_SYS_ADMIN
    (CUPTI's right on a driver that restricts profiling); the same container without the
    variable drops it with the rest, as always."""
    probe = ("import os, re; s = open('/proc/self/status').read(); "
             "e = int(re.search(r'CapEff:\\s*(\\w+)', s).group(1), 16); "
             "print(os.getuid(), bool(e >> 21 & 1))")
    kept = docker_run(image, "-e", "TFMP_QUIET=1", "-e", "TFMP_GPU_PROFILING=1",
                      "--cap-add", "SYS_ADMIN", command=["python3", "-c", probe])
    assert kept.returncode == 0 and kept.stdout.split() == ["1000", "True"], kept.stderr
    assert "TFMP_GPU_PROFILING=1: the user tf holds CAP_SYS_ADMIN" in kept.stderr
    dropped = docker_run(image, "-e", "TFMP_QUIET=1", "--cap-add", "SYS_ADMIN",
                         command=["python3", "-c", probe])
    assert dropped.stdout.split() == ["1000", "False"], dropped.stderr


def _cpuinfo(tmp_path, amx: bool) -> str:
    """This machine's /proc/cpuinfo with the AMX flags added or taken out, to mount over
    the container's (Docker allows /proc/cpuinfo as a mount target, as LXCFS uses it)."""
    with open("/proc/cpuinfo") as fh:
        lines = fh.read().splitlines()
    out = []
    for line in lines:
        if line.startswith("flags"):
            key, _, flags = line.partition(":")
            kept = [f for f in flags.split() if not f.startswith("amx")]
            line = f"{key}: {' '.join(kept + (['amx_bf16', 'amx_tile'] if amx else []))}"
        out.append(line)
    path = tmp_path / ("cpuinfo-amx" if amx else "cpuinfo-plain")
    path.write_text("\n".join(out) + "\n")
    return str(path)


def test_one_inter_op_thread_on_an_amx_cpu_without_a_gpu(image, tmp_path):
    """TF 2.9's bfloat16 convolutions can deadlock on an AMX CPU with several inter-op
    threads (docker/start/always/00-cpu-threads.sh): the entrypoint sets
    TF_NUM_INTEROP_THREADS=1 there, and only there - not without AMX, not with a GPU
    device node, never over the user's value - and SSH sessions get what batch jobs get;
    `tfmp env` says so, and warns where the entrypoint was bypassed."""
    show = ["python3", "-c", "import os; print('interop', os.environ.get('TF_NUM_INTEROP_THREADS'))"]

    def interop(*args):
        proc = docker_run(image, *args, command=show)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout.split()[-1], proc.stderr

    amx, plain = _cpuinfo(tmp_path, True), _cpuinfo(tmp_path, False)
    value, log = interop("-v", f"{amx}:/proc/cpuinfo:ro")
    assert value == "1", log
    said = [line for line in log.splitlines() if "TF_NUM_INTEROP_THREADS=1" in line]
    assert len(said) == 1 and "INFO" in said[0] and "this CPU has AMX" in said[0], log
    value, log = interop("-v", f"{amx}:/proc/cpuinfo:ro", "-e", "TFMP_QUIET=1")
    assert value == "1" and "TF_NUM_INTEROP_THREADS" not in log, log
    assert interop("-v", f"{plain}:/proc/cpuinfo:ro")[0] == "None"
    assert interop("-v", f"{amx}:/proc/cpuinfo:ro", "--device", "/dev/null:/dev/nvidia0")[0] == "None"
    assert interop("-v", f"{amx}:/proc/cpuinfo:ro", "-e", "TF_NUM_INTEROP_THREADS=4")[0] == "4"
    # Saved for SSH sessions with the rest of the environment (00-environment.sh runs after).
    proc = docker_run(image, "-v", f"{amx}:/proc/cpuinfo:ro", "-e", "TFMP_QUIET=1",
                      command=["grep", "-x", "TF_NUM_INTEROP_THREADS=1", "/etc/tfmp/container.env"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # `tfmp env` names the pools; started without the entrypoint (a replaced entrypoint, a
    # scheduler's own command) it also says the run could hang and what to set.
    threads = {}
    for how in ("entrypoint", "bypassed"):
        args = ["-v", f"{amx}:/proc/cpuinfo:ro", "-e", "TFMP_QUIET=1"]
        if how == "bypassed":
            args += ["--entrypoint", "tfmp"]
        proc = docker_run(image, *args, command=(["env"] if how == "bypassed" else ["tfmp", "env"]))
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        [threads[how]] = [line for line in proc.stdout.splitlines() if line.startswith("CPU threads:")]
    assert threads["entrypoint"].startswith("CPU threads:   inter-op 1, intra-op TensorFlow's default")
    assert "deadlock" not in threads["entrypoint"]
    assert threads["bypassed"].startswith("CPU threads:   inter-op TensorFlow's default")
    assert ("TF 2.9's bfloat16 convolutions can deadlock on this CPU with AMX: set "
            "TF_NUM_INTEROP_THREADS=1 before Python starts") in threads["bypassed"]
