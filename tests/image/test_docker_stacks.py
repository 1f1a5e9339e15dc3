"""jupyter/docker-stacks' start conventions in this image, driven from the host: Jupyter options
after `serve` and in NOTEBOOK_ARGS, JUPYTER_PORT, a base URL end to end (a real Chromium:
JupyterLab and the TensorBoard tile; the healthcheck; the printed URL; `%tensorboard`'s proxy
URL), user hooks in both folders, GRANT_SUDO, CHOWN_EXTRA, NB_UMASK,
JUPYTER_ENV_VARS_TO_UNSET, GEN_CERT, IPv6, and `--user UID:0` (OpenShift's arbitrary UIDs).

Few containers, on purpose (CI's budget): one started with every knob at once (module
fixture `knobs`), one `--user 12345:0` start, and one-line refusals as short batch runs.
JupyterHub is tests/image/test_jupyterhub.py."""
from __future__ import annotations

import base64
import hashlib
import io
import re
import uuid
import zipfile
from pathlib import Path

import paramiko
import pytest
import requests

from image_helpers import (HOST_GID, HOST_UID, docker_run, exec_in, free_port, health,
                           kernel_execute, run, start_container, wait_until)
from test_tensorboard import DEEP_TEXT, FIND_TILE, TENSORBOARD_FRAME, DevTools

pytestmark = pytest.mark.docker

BASE = "/team/ann/"
PORT_IN = 9999
TOKEN = "stacks-token-0123456789"


def _logs(name: str) -> str:
    proc = run(["docker", "logs", name], check=False, timeout=60)
    return proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def ipv6_network():
    """A Docker network with IPv6 (the default bridge has none); None when the engine
    refuses one (the IPv6 test then says so)."""
    name = f"tfmp-v6-{uuid.uuid4().hex[:8]}"
    proc = run(["docker", "network", "create", "--ipv6", "--subnet", "fd00:7466:6d70::/64", name],
               check=False, timeout=60)
    if proc.returncode != 0:
        yield None, proc.stderr.strip()
    else:
        try:
            yield name, ""
        finally:
            run(["docker", "network", "rm", name], check=False, timeout=60)


@pytest.fixture(scope="module")
def knobs(image, ipv6_network, ssh_keypair, tmp_path_factory):
    """One `serve` container with docker-stacks' knobs all set (and sshd, which a hook's
    exports reach too): its name, host URL, SSH port, folder."""
    folder = tmp_path_factory.mktemp("knobs")
    start, before, data = folder / "start-notebook.d", folder / "before-notebook.d", folder / "data"
    for d in (start, before, data):
        d.mkdir()
        d.chmod(0o755)
    (data / "inside").mkdir()
    # A *.sh hook is sourced (its export reaches the server and kernels, and it sees a
    # variable JUPYTER_ENV_VARS_TO_UNSET removes later); an executable one runs, and its
    # failure is one line, not a stopped start.
    (start / "10-export.sh").write_text(
        'export FROM_START_HOOK="yes"\n'
        'echo "start hook sees STACKS_SECRET=${STACKS_SECRET:-unset}" >&2\n')
    (before / "20-fails").write_text('#!/bin/sh\necho "before hook as UID $(id -u)" >&2\nexit 7\n')
    (before / "20-fails").chmod(0o755)
    name = f"tfmp-t-stacks-{uuid.uuid4().hex[:8]}"
    host_port, ssh_port = free_port(), free_port()
    network, _ = ipv6_network
    args = ["-p", f"127.0.0.1:{host_port}:{PORT_IN}", "-p", f"127.0.0.1:{ssh_port}:22",
            "-e", f"PUBLIC_KEY={ssh_keypair[1]}",
            "-e", f"JUPYTER_PORT={PORT_IN}", "-e", f"JUPYTER_TOKEN={TOKEN}",
            "-e", f"NOTEBOOK_ARGS=--ServerApp.base_url={BASE} --ServerApp.iopub_data_rate_limit=123456789",
            "-e", "GEN_CERT=yes", "-e", "GRANT_SUDO=yes", "-e", "NB_UMASK=002",
            "-e", f"NB_UID={HOST_UID}", "-e", f"NB_GID={HOST_GID}",
            "-e", "CHOWN_EXTRA=/opt/data", "-e", "CHOWN_EXTRA_OPTS=-R",
            "-e", "STACKS_SECRET=only-for-hooks", "-e", "JUPYTER_ENV_VARS_TO_UNSET=STACKS_SECRET",
            "-e", "TF_CPP_MIN_LOG_LEVEL=2",
            "-v", f"{start}:/usr/local/bin/start-notebook.d:ro",
            "-v", f"{before}:/usr/local/bin/before-notebook.d:ro",
            "-v", f"{data}:/opt/data"]
    if network:
        args += ["--network", network]
    # Options after `serve` go to the server too: allow_hidden shows below in /api/contents.
    start_container(name, image, *args, command=["serve", "--ContentsManager.allow_hidden=True"])
    try:
        wait_until(lambda: health(name).startswith(("healthy", "unhealthy", "none|exited")),
                   timeout=150, interval=0.5, what=f"{name}'s healthcheck")
        assert health(name).startswith("healthy"), _logs(name)[-4000:]
        ca = folder / "jupyter.crt"
        ca.write_text(exec_in(name, "cat", "/etc/tfmp/tls/jupyter.crt").stdout)
        yield {"name": name, "url": f"https://127.0.0.1:{host_port}{BASE.rstrip('/')}",
               "host_port": host_port, "ssh_port": ssh_port, "key": ssh_keypair[0], "ca": ca,
               "data": data}
    finally:
        print(_logs(name)[-4000:])
        run(["docker", "rm", "-f", "-v", name], check=False, timeout=60)


def test_options_port_and_base_url_reach_the_server_and_the_healthcheck(knobs):
    logs = _logs(knobs["name"])
    # The printed URL: https (GEN_CERT), the container port as the host port, the base URL.
    assert f"==> Jupyter URL: https://127.0.0.1:{PORT_IN}{BASE}lab?token={TOKEN}" in logs, logs[-3000:]
    assert f"==> TensorBoard: https://127.0.0.1:{PORT_IN}{BASE}tensorboard/" in logs
    assert "TLS: made a new self-signed certificate" in logs and "fingerprint" in logs
    argv = exec_in(knobs["name"], "ps", "-o", "args=", "-C", "jupyter-lab").stdout
    if not argv.strip():  # the server's process name depends on how pip made its script
        argv = exec_in(knobs["name"], "sh", "-c", "ps -eo args | grep '[j]upyter.lab'").stdout
    for option in (f"--ServerApp.base_url={BASE}", "--ServerApp.iopub_data_rate_limit=123456789",
                   "--ContentsManager.allow_hidden=True"):
        assert option in argv, argv
    headers = {"Authorization": f"token {TOKEN}"}
    verify = str(knobs["ca"])
    status = requests.get(knobs["url"] + "/api/status", headers=headers, verify=verify, timeout=30)
    assert status.status_code == 200, status.text[:200]
    # Only under the base URL; and the token rules are unchanged there.
    root = requests.get(f"https://127.0.0.1:{knobs['host_port']}/api/status", headers=headers,
                        verify=verify, timeout=30)
    assert root.status_code == 404, root.status_code
    bare = requests.get(knobs["url"] + "/api/contents", verify=verify, timeout=30,
                        allow_redirects=False)
    assert bare.status_code in (302, 401, 403), bare.status_code
    # The Notebook interface and JupyterLab's page, under the base URL, know it.
    for page in ("/tree", "/lab"):
        resp = requests.get(knobs["url"] + page, headers=headers, verify=verify, timeout=30)
        assert resp.status_code == 200, (page, resp.status_code)
        assert re.search(r'"baseUrl":\s*"' + re.escape(BASE) + '"', resp.text), (page, resp.text[:500])
    # The option after `serve` took effect: a hidden file is served.
    exec_in(knobs["name"], "sh", "-c", "echo hidden > /workspace/.stacks-hidden.txt", user="tf")
    hidden = requests.get(knobs["url"] + "/api/contents/.stacks-hidden.txt", headers=headers,
                          verify=verify, timeout=30)
    assert hidden.status_code == 200, hidden.status_code
    # The healthcheck found the server on its port, under its base URL, over TLS.
    out = exec_in(knobs["name"], "python3", "/usr/local/bin/tfmp-healthcheck").stdout
    assert out.strip() == "healthy: jupyter, sshd", out


def test_hooks_sudo_umask_chown_and_unset_in_one_start(knobs):
    name, logs = knobs["name"], _logs(knobs["name"])
    assert "hook: sourcing /usr/local/bin/start-notebook.d/10-export.sh" in logs
    assert "start hook sees STACKS_SECRET=only-for-hooks" in logs
    assert "before hook as UID 0" in logs
    assert "ERROR hook /usr/local/bin/before-notebook.d/20-fails exited with status 7; the start goes on" in logs
    assert "unset STACKS_SECRET (JUPYTER_ENV_VARS_TO_UNSET)" in logs
    assert "WARN  GRANT_SUDO=yes: tf may run any command as root with sudo" in logs
    code = ("import os, subprocess\n"
            "open('/workspace/umask-probe.txt', 'w').close()\n"
            "print('MODE', oct(os.stat('/workspace/umask-probe.txt').st_mode & 0o777))\n"
            "print('SECRET', os.environ.get('STACKS_SECRET', 'absent'))\n"
            "print('HOOK', os.environ.get('FROM_START_HOOK', 'absent'))\n"
            "print('PROXY', os.environ.get('TENSORBOARD_PROXY_URL'))\n"
            "print('SUDO', subprocess.run(['sudo', '-n', 'id', '-u'], capture_output=True, text=True).stdout.strip())\n")
    text, errors = kernel_execute(knobs["url"], TOKEN, code, ca_file=knobs["ca"])
    assert not errors, errors
    assert "MODE 0o664" in text, text               # NB_UMASK=002 in the server and its kernels
    assert "SECRET absent" in text and "HOOK yes" in text, text
    assert f"PROXY {BASE}proxy/%PORT%/" in text, text   # %tensorboard's frame under the base URL
    assert "SUDO 0" in text, text                    # GRANT_SUDO=yes
    # SSH sessions see the hook's export as the kernel does (the sessions' environment is
    # written after the hooks), and not the unset variable; nor do login shells.
    assert "STACKS_SECRET" not in exec_in(name, "cat", "/etc/tfmp/container.env").stdout
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
    client.connect("127.0.0.1", port=knobs["ssh_port"], username="tf", allow_agent=False,
                   look_for_keys=False, timeout=15, banner_timeout=15, auth_timeout=15,
                   pkey=paramiko.Ed25519Key.from_private_key_file(str(knobs["key"])))
    with client:
        probe = "echo HOOK=${FROM_START_HOOK:-absent} SECRET=${STACKS_SECRET:-absent}"
        for command in (probe, f"bash -lc '{probe}'"):
            _, stdout, _ = client.exec_command(command, timeout=60)
            assert stdout.read().decode().split() == ["HOOK=yes", "SECRET=absent"], command
    # `docker exec` hands its process the container's environment as Docker keeps it, the
    # secrets included (QA: `docker exec -u tf C bash -lc env` printed them): its login and
    # interactive shells drop them, so nothing they run inherits them.
    probe = "echo SECRET=${STACKS_SECRET:-absent} TOKEN=${JUPYTER_TOKEN:-absent}"
    for shell in (["bash", "-lc"], ["sh", "-lc"], ["bash", "-ic"]):
        seen = exec_in(name, *shell, probe, user="tf").stdout.split()
        assert seen == ["SECRET=absent", "TOKEN=absent"], (shell, seen)
    # CHOWN_EXTRA with -R: the mounted folder and what is in it belong to NB_UID:NB_GID.
    for path in (knobs["data"], knobs["data"] / "inside"):
        st = path.stat()
        assert (st.st_uid, st.st_gid) == (HOST_UID, HOST_GID), (path, st.st_uid, st.st_gid)


def test_the_tensorboard_tile_under_a_base_url_in_chromium(knobs, tmp_path):
    browser = DevTools(tmp_path / "profile", tmp_path / "chromium.log",
                       extra_flags=("--ignore-certificate-errors",))
    shot = tmp_path / "base-url-tensorboard.png"
    try:
        browser.call("Page.navigate", url=f"{knobs['url']}/lab?token={TOKEN}")
        wait_until(lambda: browser.eval(f"!!({FIND_TILE})"), timeout=90, interval=0.5,
                   what="JupyterLab's launcher with the TensorBoard tile under the base URL")
        assert browser.eval("location.pathname") == f"{BASE}lab"
        browser.eval(f"({FIND_TILE}).click(), true")
        wait_until(lambda: browser.eval(f"!!{TENSORBOARD_FRAME}"), timeout=60, interval=0.5,
                   what="a JupyterLab tab with TensorBoard's frame")
        body = f"(({TENSORBOARD_FRAME}).contentDocument || {{}}).body"
        text = wait_until(lambda: "TensorBoard" in (browser.eval(f"{DEEP_TEXT}({body})") or "")
                          and browser.eval(f"{DEEP_TEXT}({body})"), timeout=120, interval=1,
                          what="TensorBoard's page in the frame")
        frame_url = browser.eval(f"({TENSORBOARD_FRAME}).contentWindow.location.href")
        browser.screenshot(shot)
    finally:
        browser.close()
    assert frame_url.startswith(f"{knobs['url']}/tensorboard/"), frame_url
    assert "TensorBoard" in text


def test_ipv6_the_server_answers_on_the_containers_ipv6_addresses(knobs, ipv6_network):
    network, why = ipv6_network
    if network is None:
        pytest.skip(f"this Docker engine makes no IPv6 network ({why}): IPv6 not checked")
    address = exec_in(knobs["name"], "sh", "-c",
                      "awk '$6 == \"eth0\" && $1 !~ /^fe80/ {print $1; exit}' /proc/net/if_inet6").stdout.strip()
    assert len(address) == 32, address
    ipv6 = ":".join(address[i:i + 4] for i in range(0, 32, 4))
    probe = ("import ssl, sys, urllib.request\n"
             "ctx = ssl._create_unverified_context()\n"
             "for host in sys.argv[1:]:\n"
             f"    req = urllib.request.Request(f'https://[{{host}}]:{PORT_IN}{BASE}api/status',"
             f" headers={{'Authorization': 'token {TOKEN}'}})\n"
             "    print(host, urllib.request.urlopen(req, context=ctx, timeout=10).status)\n")
    out = exec_in(knobs["name"], "python3", "-c", probe, "::1", ipv6).stdout.split()
    assert out == ["::1", "200", ipv6, "200"], out


# --- --user UID:0 (OpenShift's arbitrary UIDs) ---------------------------------------------

def _probe_wheel(folder: Path) -> Path:
    """A tiny pure-Python wheel, made here (the container has no index to install from)."""
    name = "tfmp_stacks_probe-1.0-py3-none-any.whl"
    files = {"tfmp_stacks_probe.py": "WHERE = __file__\n",
             "tfmp_stacks_probe-1.0.dist-info/METADATA":
                 "Metadata-Version: 2.1\nName: tfmp-stacks-probe\nVersion: 1.0\n",
             "tfmp_stacks_probe-1.0.dist-info/WHEEL":
                 "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = []
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as whl:
        for path, text in files.items():
            data = text.encode()
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{path},sha256={digest},{len(data)}")
            whl.writestr(path, data)
        record.append("tfmp_stacks_probe-1.0.dist-info/RECORD,,")
        whl.writestr("tfmp_stacks_probe-1.0.dist-info/RECORD", "\n".join(record) + "\n")
    (folder / name).write_bytes(buf.getvalue())
    return folder / name


def test_arbitrary_uid_gets_a_name_and_the_home(image, container, tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    wheel = _probe_wheel(wheels)
    wheels.chmod(0o755)
    wheel.chmod(0o644)
    port = free_port()
    name = container("--user", "12345:0", "-p", f"127.0.0.1:{port}:8888", "-e", f"JUPYTER_TOKEN={TOKEN}",
                     "-e", "GRANT_SUDO=yes", "-v", f"{wheels}:/wheels:ro")
    wait_until(lambda: health(name).startswith(("healthy", "unhealthy", "none|exited")),
               timeout=150, interval=0.5, what=f"{name}'s healthcheck")
    logs = _logs(name)
    assert health(name).startswith("healthy"), logs[-3000:]
    assert "UID 12345 has no entry in /etc/passwd: named tf, home /home/tf" in logs, logs[-3000:]
    # What cannot work this way says so, in one line each.
    assert "started as a non-root user (--user): SSH needs root to switch users" in logs
    assert "GRANT_SUDO=yes needs a root start" in logs
    script = ("set -e; whoami; echo ~; id -un; "
              "pip install -q --user --no-index --no-deps /wheels/tfmp_stacks_probe-1.0-py3-none-any.whl; "
              "python3 -c 'import tfmp_stacks_probe as p; print(p.WHERE)'; "
              "cd ~ && git init -q probe && cd probe && git -c user.email=tf@example.org commit -q --allow-empty -m probe && "
              "git log --format=%an; "
              "test ! -w /etc/passwd && echo passwd-not-writable")
    # A `docker exec` login shell gets the name too (/etc/profile.d).
    out = exec_in(name, "bash", "-lc", script, user="12345:0").stdout.split()
    assert out[:3] == ["tf", "/home/tf", "tf"], out
    assert re.match(r"/home/tf/\.local/lib/python3\.\d+/site-packages/tfmp_stacks_probe\.py$", out[3]), out
    assert out[4:] == ["tf", "passwd-not-writable"], out
    # The kernel (started by the server, with the entrypoint's environment) too.
    text, errors = kernel_execute(f"http://127.0.0.1:{port}", TOKEN,
                                  "import getpass, os, pwd\n"
                                  "print(getpass.getuser(), pwd.getpwuid(os.getuid()).pw_dir, os.path.expanduser('~'))\n")
    assert not errors, errors
    assert text.split() == ["tf", "/home/tf", "/home/tf"], text


# --- one-line refusals (batch runs: no server starts) -----------------------------------------

@pytest.mark.parametrize("env, command, line", [
    (["-e", "GEN_CERT=maybe"], ["serve"], "GEN_CERT must be yes or 1"),
    (["-e", "GEN_CERT=yes", "-e", "JUPYTER_TLS=off"], ["serve"], "GEN_CERT=yes asks for JUPYTER_TLS=self-signed"),
    (["-e", "NOTEBOOK_ARGS=--ServerApp.token="], ["serve"], "the Jupyter option --ServerApp.token is refused"),
    ([], ["serve", "--IdentityProvider.token=''"], "the Jupyter option --IdentityProvider.token is refused"),
    (["-e", "JUPYTER_PORT=http"], ["serve"], "JUPYTER_PORT must be a port number (1-65535)"),
    (["-e", "NB_UMASK=abc"], ["serve"], "NB_UMASK must be an octal umask"),
    (["-e", "GRANT_SUDO=maybe"], ["true"], "GRANT_SUDO must be yes or 1"),
    (["-e", "CHOWN_EXTRA=/home/tf/x"], ["true"], "CHOWN_EXTRA: '/home/tf/x' is in /home/tf or /workspace"),
    (["-e", "CHOWN_EXTRA=/opt/none"], ["true"], "CHOWN_EXTRA: '/opt/none' does not exist"),
    (["-e", "CHOWN_EXTRA=/workspace/../tmp/../workspace"], ["true"], "is in /home/tf or /workspace"),
    (["-e", "CHOWN_EXTRA=/home/tf"], ["true"], "CHOWN_EXTRA: '/home/tf' is in /home/tf or /workspace"),
    (["-e", "CHOWN_EXTRA_OPTS=-L", "-e", "CHOWN_EXTRA=/opt"], ["true"], "CHOWN_EXTRA_OPTS may be -R"),
    # Owning a system folder, or one above it or above the home, makes the user root
    (["-e", "CHOWN_EXTRA=/etc"], ["true"], "CHOWN_EXTRA: '/etc' is a system folder or holds one (/etc)"),
    (["-e", "CHOWN_EXTRA=/mnt,/usr/local/lib"], ["true"], "'/usr/local/lib' is a system folder or holds one (/usr)"),
    (["-e", "CHOWN_EXTRA=/opt"], ["true"], "'/opt' is a system folder or holds one (/opt/tfmp)"),
    (["-e", "CHOWN_EXTRA=/home"], ["true"], "CHOWN_EXTRA: '/home' holds /home/tf or /workspace"),
    (["-e", "CHOWN_EXTRA=/srv/../usr/local/bin"], ["true"],
     "CHOWN_EXTRA: '/srv/../usr/local/bin' holds '.' or '..' (it is '/usr/local/bin')"),
    (["-e", "CHOWN_EXTRA=/.dockerenv"], ["true"], "CHOWN_EXTRA: '/.dockerenv' is not a folder"),
    (["-e", "NB_UID=18446744073709551616"], ["true"], "NB_UID must be at most 4294967294"),
    # Only shown in the start-up lines, and shown as given: `ssh -p -1 tf@127.0.0.1`
    (["-e", "JUPYTER_HOST_PORT=abc"], ["serve"], "JUPYTER_HOST_PORT must be a port number (1-65535). Received: JUPYTER_HOST_PORT='abc'"),
    (["-e", "SSH_HOST_PORT=-1"], ["serve"], "SSH_HOST_PORT must be a port number (1-65535)"),
    (["-e", "TFMP_QUIET=yes"], ["true"], "TFMP_QUIET must be 1 (no banner before batch commands) or 0"),
    (["-e", "NB_GID=4294967295"], ["true"], "NB_GID must be at most 4294967294"),
    (["-e", "NOTEBOOK_ARGS=--config=/tmp/noauth.py"], ["serve"], "the Jupyter option --config is refused"),
    # traitlets reads one dash as two: a cookie-only POST /api/kernels got 201 (QA)
    (["-e", "NOTEBOOK_ARGS=-ServerApp.disable_check_xsrf=True"], ["serve"],
     "the Jupyter option -ServerApp.disable_check_xsrf is refused"),
    (["-e", "NOTEBOOK_ARGS=--ServerApp.jpserver_extensions=jupyter_lsp=True"], ["serve"],
     "the Jupyter option --ServerApp.jpserver_extensions is refused"),
    (["-e", "ENABLE_SSH=1", "-e", "JUPYTER_PORT=22"], ["serve"], "the Jupyter port 22 is the SSH server's in the container"),
    (["-e", "JUPYTER_ENV_VARS_TO_UNSET=A,B-C"], ["true"], "JUPYTER_ENV_VARS_TO_UNSET must name variables"),
    (["-e", "JUPYTERHUB_API_TOKEN=x"], ["serve"], "JUPYTERHUB_API_TOKEN is set but JUPYTERHUB_API_URL is not"),
    # After the (empty) hook folders ran, the entrypoint's set -e still holds: a check failing
    # in a $(...) stops the start.
    (["-e", "JUPYTER_TOKEN="], ["serve"], "JUPYTER_TOKEN is set but empty"),
])
def test_a_bad_docker_stacks_setting_is_one_fatal_line(image, env, command, line):
    proc = docker_run(image, "-e", "TFMP_QUIET=1", "-e", "ENABLE_SSH=0", *env, command=command, timeout=120)
    assert proc.returncode == 64, proc.stderr[-2000:]
    fatal = [x for x in proc.stderr.splitlines() if " FATAL " in x]
    assert len(fatal) == 1 and line in fatal[0], proc.stderr[-2000:]
    # A CHOWN_EXTRA list is judged whole before any folder in it is re-owned.
    assert "now belongs to UID" not in proc.stderr, proc.stderr[-2000:]


# 09-rights.sh's functions alone, as root, with the start's helpers stubbed: a folder the user
# may write (/data, given earlier) holds the one CHOWN_EXTRA names now, and the user swaps its
# parent for a symlink to /usr/local (renameat2 in a loop, in the QA report).  The swap is made
# here by a hook at one moment, so the race is lost every time, not 1 start in 9.
CHOWN_EXTRA_RACE = r"""
set -euo pipefail
log() { printf '%s %s\n' "$1" "$2" >&2; }
info() { log INFO "$*"; }
warn() { log WARN "$*"; }
fatal() { log FATAL "$*"; exit 64; }
is_root() { true; }
NB_USER=tf NB_UID=1000 NB_GID=1000 USER_HOME=/home/tf WORKSPACE=/workspace
source /usr/local/lib/tfmp/start/always/09-rights.sh   # no CHOWN_EXTRA yet: defines only
mkdir -p /data/project/bin
swap() { mv -T /data/project /data/project_real; ln -s /usr/local /data/project; }
case $1 in
  # just after the path was checked (resolved with no symlink in it)
  realpath) realpath() { command realpath "$@"; swap; } ;;
  # just before the change itself, after every look at the path
  chown) chown() { swap; command chown "$@"; } ;;
esac
status=0
(CHOWN_EXTRA=/data/project/bin chown_extra) || status=$?
echo "status=$status usr_local_bin=$(stat -c %u /usr/local/bin) real=$(stat -c %u /data/project_real/bin)"
"""


@pytest.mark.parametrize("swapped_at, status, real_owner", [
    # Then the folder the path leads to is not the one checked: refused, nothing re-owned.
    ("realpath", "64", "0"),
    # The folder already held is the one re-owned, wherever its path now leads.
    ("chown", "0", "1000"),
])
def test_chown_extra_re_owns_the_folder_it_checked_even_if_a_parent_is_swapped(
        image, swapped_at, status, real_owner):
    proc = docker_run(image, "--entrypoint", "bash",
                      command=["-c", CHOWN_EXTRA_RACE, "race", swapped_at], timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == [f"status={status}", "usr_local_bin=0", f"real={real_owner}"], \
        proc.stdout + proc.stderr[-2000:]
    if status == "64":
        fatal = [x for x in proc.stderr.splitlines() if "FATAL" in x]
        assert len(fatal) == 1 and "CHOWN_EXTRA: '/data/project/bin' changed after it was " \
            "checked (it now leads to '/usr/local/bin'" in fatal[0], proc.stderr


def test_docker_stacks_settings_not_read_here_say_so(image):
    proc = docker_run(image, "-e", "TFMP_QUIET=1", "-e", "NB_USER=kitten", "-e", "CHOWN_HOME=yes",
                      "-e", "DOCKER_STACKS_JUPYTER_CMD=notebook", command=["whoami"], timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "tf", proc.stderr[-2000:]
    warns = [x for x in proc.stderr.splitlines() if " WARN " in x]
    assert any("NB_USER='kitten' is not read here: the user is always tf" in x for x in warns), warns
    assert any("CHOWN_HOME is docker-stacks' and not read here" in x for x in warns), warns
    assert any("DOCKER_STACKS_JUPYTER_CMD is docker-stacks' and not read here" in x for x in warns), warns
    # `start.sh CMD`, docker-stacks' entrypoint left in a command, runs CMD.
    proc = docker_run(image, "-e", "TFMP_QUIET=1", command=["start.sh", "id", "-un"], timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "tf", proc.stderr[-2000:]


def test_without_grant_sudo_the_user_has_no_sudo(stack):
    proc = exec_in(stack.container, "sudo", "-n", "true", user="tf", check=False)
    assert proc.returncode != 0 and "password" in proc.stderr.lower(), proc.stderr
    assert exec_in(stack.container, "test", "-e", "/etc/sudoers.d/tfmp-grant-sudo", check=False).returncode == 1
