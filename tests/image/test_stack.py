"""The compose stack as users start it (`docker compose up` with the CPU override),
driven from the host: Jupyter's HTTP + websocket API, a headless browser, an SSH
client.  One stack is shared by the module; the host-key test at the end
restarts it with `down`/`up`."""
from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import paramiko
import pytest
import requests
import websocket

from image_helpers import (HOST_GID, HOST_UID, PARITY_VALUES, container_env, exec_in,
                           kernel_execute, run, wait_until)

pytestmark = pytest.mark.docker

CHROMIUM = "/usr/bin/chromium"


# --- helpers -----------------------------------------------------------------------

def ssh_client(stack, username="tf", key: paramiko.PKey | None = None, password=None,
               use_default_key=True) -> paramiko.SSHClient:
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
    if key is None and use_default_key and password is None:
        key = paramiko.Ed25519Key.from_private_key_file(str(stack.private_key))
    client.connect("127.0.0.1", port=stack.ssh_port, username=username, pkey=key,
                   password=password, allow_agent=False, look_for_keys=False, timeout=15,
                   banner_timeout=15, auth_timeout=15)
    return client


def ssh_run(client: paramiko.SSHClient, command: str, timeout: float = 120) -> tuple[int, str, str]:
    _, stdout, stderr = client.exec_command(command, timeout=timeout)
    out = stdout.read().decode()
    err = stderr.read().decode()
    return stdout.channel.recv_exit_status(), out, err


# --- health and PID 1 ----------------------------------------------------------------

def test_stack_becomes_healthy(stack):
    state = run(["docker", "inspect", "-f", "{{.State.Health.Status}}", stack.container]).stdout
    assert state.strip() == "healthy"


def test_pid1_is_tini(stack):
    cmdline = exec_in(stack.container, "cat", "/proc/1/cmdline").stdout.split("\0")
    assert Path(cmdline[0]).name == "tini", cmdline


def test_token_is_announced_once_and_stored_user_only(stack):
    logs = stack.compose("logs", "--no-color", "tfmp").stdout
    lines = [line for line in logs.splitlines() if "==> Jupyter URL: http://" in line]
    assert len(lines) == 1, lines
    token = stack.token()
    assert f":{stack.jupyter_port}/lab?token={token}" in lines[0]
    mode = exec_in(stack.container, "stat", "-c", "%a %u", "/home/tf/.jupyter/token").stdout.split()
    assert mode == ["600", str(HOST_UID)]


# --- Jupyter: authentication --------------------------------------------------------

@pytest.mark.parametrize("path", ["/api/status", "/api/kernels", "/api/terminals", "/lab",
                                  "/lab/terminals/1", "/api/contents"])
def test_unauthenticated_requests_are_refused(stack, path):
    resp = requests.get(stack.base_url + path, allow_redirects=False, timeout=10)
    if resp.status_code in (301, 302, 303, 307):
        assert "/login" in resp.headers["Location"], resp.headers["Location"]
    else:
        assert resp.status_code in (401, 403), (resp.status_code, resp.text[:200])


@pytest.mark.parametrize("path", ["/terminals/websocket/1", "/api/events/subscribe"])
def test_unauthenticated_websockets_are_refused(stack, path):
    requests.post(stack.base_url + "/api/terminals", timeout=10,
                  headers={"Authorization": f"token {stack.token()}"})  # make terminal 1 exist
    with pytest.raises(websocket.WebSocketBadStatusException) as err:
        websocket.create_connection(f"ws://127.0.0.1:{stack.jupyter_port}{path}", timeout=15)
    assert err.value.status_code in (401, 403)


def test_wrong_token_is_refused(stack):
    resp = requests.get(stack.base_url + "/api/status", timeout=10,
                        headers={"Authorization": "token not-the-token"})
    assert resp.status_code == 403


def test_kernel_via_rest_and_websocket_imports_app_and_tensorflow(stack):
    code = ("import app, tensorflow as tf\n"
            "tf.keras.mixed_precision.set_global_policy('mixed_bfloat16')\n"
            "print('TF', tf.__version__, 'POLICY', tf.keras.mixed_precision.global_policy().name,"
            " 'APP', app.__file__)\n")
    text, errors = kernel_execute(stack.base_url, stack.token(), code)
    assert not errors, errors
    assert re.search(r"TF 2\.9\.3 POLICY mixed_bfloat16 APP /opt/tfmp/src/app/", text), text


# --- Jupyter: a real browser -----------------------------------------------------------

def _chromium(*args: str, user_data: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing (.ci/run installs Debian's chromium)")
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--no-first-run", "--hide-scrollbars", f"--user-data-dir={user_data}",
             "--window-size=1280,800", "--virtual-time-budget=20000"]
    return run([CHROMIUM, *flags, *args], timeout=timeout, check=False)


def test_browser_logs_in_with_token_and_shows_the_launcher(stack, tmp_path):
    url = f"{stack.base_url}/lab?token={stack.token()}"
    dom = _chromium("--dump-dom", url, user_data=tmp_path / "profile-dom")
    assert "jp-Launcher" in dom.stdout, dom.stdout[-2000:] + dom.stderr[-2000:]
    shot = tmp_path / "lab.png"
    _chromium(f"--screenshot={shot}", url, user_data=tmp_path / "profile-shot")
    assert shot.is_file() and shot.stat().st_size > 10_000
    from PIL import Image

    with Image.open(shot) as img:
        assert img.size == (1280, 800)
        colours = img.convert("RGB").getcolors(maxcolors=1_000_000) or []
        assert len(colours) > 20, "the screenshot is blank"
    keep = os.environ.get("TFMP_SCREENSHOT_DIR")
    if keep:
        shutil.copy(shot, Path(keep) / "jupyterlab-launcher.png")


def test_browser_without_token_gets_the_login_page(stack, tmp_path):
    dom = _chromium("--dump-dom", f"{stack.base_url}/lab", user_data=tmp_path / "profile")
    assert "jp-Launcher" not in dom.stdout
    assert "password" in dom.stdout.lower() or "token" in dom.stdout.lower()


# --- SSH -----------------------------------------------------------------------------

def test_ssh_key_login_works(stack):
    with ssh_client(stack) as client:
        status, out, _ = ssh_run(client, "id -u; whoami; pwd")
    assert status == 0
    assert out.split() == [str(HOST_UID), "tf", "/home/tf"]


def test_ssh_root_login_is_refused(stack):
    with pytest.raises(paramiko.AuthenticationException):
        ssh_client(stack, username="root")


def test_ssh_wrong_key_is_refused(stack):
    with pytest.raises(paramiko.AuthenticationException):
        ssh_client(stack, key=paramiko.RSAKey.generate(2048))


def test_ssh_password_is_refused_by_default(stack):
    with pytest.raises(paramiko.AuthenticationException):
        ssh_client(stack, password="tf", use_default_key=False)


PARITY_VARS = ["PATH", "LD_LIBRARY_PATH", "CUDA_VERSION", "NVIDIA_VISIBLE_DEVICES",
               "NVIDIA_DRIVER_CAPABILITIES", "TF_CPP_MIN_LOG_LEVEL", "PIP_CONSTRAINT",
               "TF_FORCE_GPU_ALLOW_GROWTH",
               "TFMP_WORKSPACE", "TFMP_TEST_USER_VAR", "LANG", *PARITY_VALUES]


def _one_of_each(path: str) -> str:
    """A PATH with each folder once: a login shell's ~/.profile adds ~/.local/bin again when
    it exists (Debian's), which changes no lookup."""
    return ":".join(dict.fromkeys(path.split(":")))


@pytest.mark.parametrize("shell", ["exec", "login shell"])
def test_ssh_environment_matches_docker_exec(stack, shell):
    expected = container_env(stack.container)
    # `docker exec` (root's default here) has the image's PATH; the user's processes have
    # `pip install --user`'s scripts first (entrypoint.sh, user_path).
    expected["PATH"] = "/home/tf/.local/bin:" + expected["PATH"]
    assert expected.get("TFMP_TEST_USER_VAR") == "passed-with-dash-e"
    assert {v: expected.get(v) for v in PARITY_VALUES} == PARITY_VALUES
    command = "env -0" if shell == "exec" else "bash -lc 'env -0'"
    with ssh_client(stack) as client:
        status, out, err = ssh_run(client, command)
    assert status == 0, err
    got = dict(item.split("=", 1) for item in out.split("\0") if "=" in item)
    got["PATH"] = _one_of_each(got.get("PATH", ""))
    diff = {v: (expected.get(v), got.get(v)) for v in PARITY_VARS if expected.get(v) != got.get(v)}
    assert not diff, f"differs over SSH ({shell}): {diff}"
    for secret in ("JUPYTER_TOKEN", "SSH_PASSWORD", "PUBLIC_KEY"):
        assert secret not in got


def test_ssh_sessions_see_the_environment_of_a_jupyter_kernel(stack):
    """What a notebook runs under (a kernel started by JupyterLab) and what an SSH user runs
    under agree on every variable that decides where TensorFlow finds CUDA, pip's
    constraints, the workspace, and on the Python interpreter itself."""
    code = ("import json, os, sys\n"
            "print(json.dumps({'env': dict(os.environ),"
            " 'python': os.path.realpath(sys.executable)}))\n")
    out, errors = kernel_execute(stack.base_url, stack.token(), code)
    assert not errors, errors
    kernel = json.loads(out)
    assert kernel["env"].get("TFMP_TEST_USER_VAR") == "passed-with-dash-e"
    assert {v: kernel["env"].get(v) for v in PARITY_VALUES} == PARITY_VALUES
    # GPU memory grows as needed in kernels and SSH sessions alike (docs/image.md).
    assert kernel["env"].get("TF_FORCE_GPU_ALLOW_GROWTH") == "true"
    python = "python -c 'import os, sys; print(os.path.realpath(sys.executable))'"
    with ssh_client(stack) as client:
        for shell, command in (("exec", "env -0"), ("login shell", "bash -lc 'env -0'")):
            status, out, err = ssh_run(client, command)
            assert status == 0, err
            got = dict(item.split("=", 1) for item in out.split("\0") if "=" in item)
            got["PATH"] = _one_of_each(got.get("PATH", ""))
            diff = {v: (kernel["env"].get(v), got.get(v)) for v in PARITY_VARS
                    if kernel["env"].get(v) != got.get(v)}
            assert not diff, f"a kernel and SSH ({shell}) differ: {diff}"
            assert got.get("TF_FORCE_GPU_ALLOW_GROWTH") == "true", shell
        status, out, err = ssh_run(client, python)
    assert status == 0, err
    assert out.strip() == kernel["python"]


def test_a_users_own_command_in_local_bin_runs_over_ssh_and_from_a_kernel(stack):
    """A console script `pip install --user` put in ~/.local/bin runs by its name in
    `ssh host cmd` and in a kernel's subprocess (`!cmd`), not only in login shells."""
    make = ("mkdir -p ~/.local/bin && printf '#!/bin/sh\\necho hello-from-local-bin\\n' "
            ">~/.local/bin/tfmp-qa-hello && chmod +x ~/.local/bin/tfmp-qa-hello")
    try:
        with ssh_client(stack) as client:
            status, _, err = ssh_run(client, make)
            assert status == 0, err
            status, out, err = ssh_run(client, "tfmp-qa-hello")
        assert (status, out.strip()) == (0, "hello-from-local-bin"), err
        code = ("import subprocess\n"
                "print(subprocess.run('tfmp-qa-hello', shell=True, capture_output=True, "
                "text=True).stdout)\n")
        out, errors = kernel_execute(stack.base_url, stack.token(), code)
        assert not errors and out.strip() == "hello-from-local-bin", (out, errors)
    finally:
        with ssh_client(stack) as client:
            ssh_run(client, "rm -f ~/.local/bin/tfmp-qa-hello")


# As `tf`: a `ls` in ~/.local/bin that, run by root, leaves a mark (the QA report's planted
# `ls` wrote a sudoers rule instead).
PLANT_LS = ("mkdir -p ~/.local/bin && printf '%s\\n' '#!/bin/sh' "
            "'[ \"$(id -u)\" = 0 ] && touch /run/tfmp-planted-ls-ran-as-root' 'exec /bin/ls \"$@\"' "
            ">~/.local/bin/ls && chmod +x ~/.local/bin/ls")
# As `tf`: each PATH folder given that the user may write (or, missing, may create).
USER_WRITABLE = ('for d in "$@"; do p=$d; while [ ! -e "$p" ]; do p=$(dirname "$p"); done; '
                 '[ -w "$p" ] && echo "$d"; done; true')


@pytest.mark.parametrize("shell", [["bash", "-lc"], ["sh", "-lc"], ["bash", "-ic"], ["bash", "-c"]],
                         ids=" ".join)
def test_roots_docker_exec_shells_never_look_in_a_folder_the_user_can_write(stack, shell):
    """An admin's `docker exec C bash -lc 'ls ...'` (root) ran the user's ~/.local/bin/ls: the
    login shell's PATH came from the user's. The user's own sessions keep ~/.local/bin first
    (test_a_users_own_command_in_local_bin_runs_over_ssh_and_from_a_kernel)."""
    exec_in(stack.container, "sh", "-c", PLANT_LS, user="tf")
    try:
        out = exec_in(stack.container, *shell,
                      'ls /workspace >/dev/null; echo "LS=$(command -v ls)"; echo "PATH=$PATH"').stdout
        found = dict(line.split("=", 1) for line in out.splitlines() if line[:3] in ("LS=", "PAT"))
        assert found["LS"] == "/usr/bin/ls" or found["LS"] == "/bin/ls", out
        writable = exec_in(stack.container, "sh", "-c", USER_WRITABLE, "sh",
                           *found["PATH"].split(":"), user="tf").stdout.split()
        assert not writable, f"root's PATH in {' '.join(shell)} holds folders tf may write: {writable}"
        marks = exec_in(stack.container, "ls", "/run", check=False).stdout.split()
        assert "tfmp-planted-ls-ran-as-root" not in marks, "the user's ls ran as root"
    finally:
        exec_in(stack.container, "rm", "-f", "/home/tf/.local/bin/ls", "/run/tfmp-planted-ls-ran-as-root",
                check=False)


def test_sftp_session_works_and_writes_as_the_user(stack):
    """sftp (internal-sftp) under the same sshd settings: upload, list, ownership."""
    with ssh_client(stack) as client, client.open_sftp() as sftp:
        # A relative path lands in the user's home (paramiko's getcwd() is None until a chdir,
        # so ask the server what "." is, and write through a relative name).
        assert sftp.normalize(".") == "/home/tf"
        with sftp.open("sftp-relative.txt", "w") as fh:
            fh.write("relative\n")
        assert sftp.stat("/home/tf/sftp-relative.txt").st_size == len("relative\n")
        sftp.remove("/home/tf/sftp-relative.txt")
        with sftp.open("/workspace/sftp-check.txt", "w") as fh:
            fh.write("over sftp\n")
        assert "sftp-check.txt" in sftp.listdir("/workspace")
    path = stack.workspace / "sftp-check.txt"
    assert path.read_text() == "over sftp\n"
    assert (path.stat().st_uid, path.stat().st_gid) == (HOST_UID, HOST_GID)


def test_training_over_ssh_writes_metrics_owned_by_the_host_user(stack):
    """A short `python -m app train` (CLI of docs/training.md) in the bind-mounted workspace."""
    cmd = ("cd /workspace && python -m app train --dataset synthetic --model mlp --epochs 1 "
           "--precision float32 --max-train-samples 256 --max-val-samples 64 --batch-size 64 "
           "--output /workspace/runs/ssh-smoke --no-save-model --progress lines")
    with ssh_client(stack) as client:
        status, out, err = ssh_run(client, cmd, timeout=300)
    assert status == 0, out[-2000:] + err[-3000:]
    metrics = stack.workspace / "runs" / "ssh-smoke" / "metrics.json"
    assert metrics.is_file(), sorted(str(p) for p in stack.workspace.rglob("*"))
    assert json.loads(metrics.read_text())["status"] == "completed"
    for path in [metrics, metrics.parent, metrics.parent.parent]:
        st = path.stat()
        assert (st.st_uid, st.st_gid) == (HOST_UID, HOST_GID), (path, st.st_uid, st.st_gid)
    assert not stat.S_IWOTH & metrics.stat().st_mode


HOSTILE_APP = "print('HIJACKED')\nraise SystemExit(42)\n"


def test_tfmp_over_ssh_runs_the_package_beside_a_users_own_app_py(stack):
    """`tfmp` runs our package from any folder; `python -m app` there runs the user's app.py."""
    folder = stack.workspace / "own-project"
    folder.mkdir()
    (folder / "app.py").write_text(HOSTILE_APP)
    for path in (folder, folder / "app.py"):
        os.chown(path, HOST_UID, HOST_GID)
    cmd = ("cd /workspace/own-project && tfmp train --dataset synthetic --model mlp --epochs 1 "
           "--precision float32 --max-train-samples 128 --max-val-samples 32 --batch-size 32 "
           "--output /workspace/runs/tfmp-beside-app-py --no-save-model --progress lines")
    with ssh_client(stack) as client:
        status, out, err = ssh_run(client, cmd, timeout=300)
        alias_status, alias_out, _ = ssh_run(client, "cd /workspace/own-project && python -m app env")
    assert status == 0 and "HIJACKED" not in out + err, out[-2000:] + err[-3000:]
    metrics = stack.workspace / "runs" / "tfmp-beside-app-py" / "metrics.json"
    assert json.loads(metrics.read_text())["status"] == "completed"
    # What `tfmp` avoids: the same folder hands `python -m app` to the user's file.
    assert (alias_status, alias_out.strip()) == (42, "HIJACKED")


# --- restart: host keys persist (last: it restarts the shared stack) -----------------

def _host_key_fingerprint(stack) -> str:
    transport = paramiko.Transport(("127.0.0.1", stack.ssh_port))
    try:
        transport.start_client(timeout=15)
        return transport.get_remote_server_key().fingerprint
    finally:
        transport.close()


def test_host_keys_survive_compose_down_and_up(stack):
    before = _host_key_fingerprint(stack)
    stack.compose("down", "-t", "5", timeout=120)  # keeps named volumes
    stack.compose("up", "-d", "--no-build", "tfmp", timeout=180)
    stack.wait_healthy()
    assert _host_key_fingerprint(stack) == before


def test_one_run_per_output_folder_over_ssh(stack):
    """Two SSH sessions start the same job: the second stops at once (exit 2, the first run
    named); after `kill -9` of the first, `--resume` starts at once (no stale lock)."""
    out = "/workspace/runs/ssh-twin"
    args = ("tfmp train --dataset synthetic --model mlp --max-train-samples 20000 "
            "--max-val-samples 128 --batch-size 32 --precision float32 --epochs 3 --offline "
            f"--no-save-model --progress lines --log-every 50 --output {out}")
    client = ssh_client(stack)
    try:
        code, pid, err = ssh_run(client, f"nohup {args} >/tmp/first.log 2>&1 </dev/null & echo $!")
        assert code == 0, err
        pid = pid.strip()
        # Once epoch 1 has a checkpoint, the first run is frozen (SIGSTOP keeps its lock, as a
        # slow run would): on a fast machine it could otherwise finish while the second
        # process is still importing TensorFlow, and the premise would be gone.
        code, _, err = ssh_run(client, "timeout 240 bash -c 'until grep -q \"^epoch 1/\" "
                               f"/tmp/first.log; do sleep 0.05; done' && kill -STOP {pid}",
                               timeout=300)
        assert code == 0, "the first run did not finish its first epoch: " + \
            ssh_run(client, "tail -c 2000 /tmp/first.log")[1]
        assert ssh_run(client, "grep -q '^done:' /tmp/first.log")[0] != 0, \
            "the first run ended before it could be frozen"
        code, _, err = ssh_run(client, args, timeout=300)
        assert code == 2, err
        [line] = [x for x in err.splitlines() if x.startswith("error:")]
        assert f"is in use by another run (host " in line and f"pid {pid}," in line, line
        assert ssh_run(client, f"kill -0 {pid}")[0] == 0, "the first run must still be alive"
        ssh_run(client, f"kill -9 {pid}")
        wait_until(lambda: ssh_run(client, f"kill -0 {pid}")[0] != 0, 30, what="the kill")
        code, stdout, err = ssh_run(client, f"{args} --resume", timeout=600)
        assert code == 0, err[-3000:]
        assert "done: 3 epoch(s)" in stdout
    finally:
        client.close()
