"""Hardening of the image, checked from the host (issue 11, items 3-8).

* sshd without PermitUserEnvironment: the environment comes from a root-owned
  SetEnv include; a user's ~/.ssh/environment is ignored.
* Hostile settings as people write them in .env: a trailing CR, spaces, quotes
  and `$` in secrets, several keys and key options in PUBLIC_KEY, an empty
  PUBLIC_KEY_FILE: each works as meant or stops the start with one FATAL line
  naming the variable.
* The /nbconvert/ pages carry `sandbox` in their Content-Security-Policy.
* ssh-audit finds no failure and only its post-quantum kex warning; pip is 25.0.1, its resolver
  refuses a conflicting install as a whole.
* Static: Python 3.8 syntax/library use (vermin) of what runs in the image; the
  Kubernetes example against a current Kubernetes release's schema.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from pathlib import Path

import paramiko
import pytest
import requests

from image_helpers import (HOST_CA_BUNDLE, REPO, docker_run, exec_in, free_port, health, run,
                           start_container, wait_until)

pytestmark = pytest.mark.docker

TOKEN = "hostile-token-123"
# Spaces, both quotes, `$`, `=`: all legal in a password, none may be mangled.
PASSWORD = "p a\"s's $HOME=1"
SETENV_VALUES = {
    "TFMP_T_SPACES": "two  spaces and a\ttab",
    "TFMP_T_SQUOTE": "it's 'quoted'",
    "TFMP_T_EQUALS": "k=v=w",
    "TFMP_T_DOLLAR": "$HOME stays literal",
}
# What sshd's SetEnv cannot carry (OpenSSH 8.2/8.4 have no escape for '"', and
# '#' ends a config line): SSH commands get them from /etc/bash.bashrc instead.
BASHRC_VALUES = {"TFMP_T_DQUOTE": 'say "hi"', "TFMP_T_HASH": "x#y"}
FORCED = "forced-by-key-option"


def _keypair(directory: Path, name: str) -> tuple[Path, str]:
    key = directory / name
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{name}@host", "-f", str(key)])
    return key, (directory / f"{name}.pub").read_text().strip()


def _ssh(port: int, *, key: Path | None = None, password: str | None = None) -> paramiko.SSHClient:
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
    pkey = paramiko.Ed25519Key.from_private_key_file(str(key)) if key else None
    client.connect("127.0.0.1", port=port, username="tf", pkey=pkey, password=password,
                   allow_agent=False, look_for_keys=False, timeout=15, banner_timeout=15,
                   auth_timeout=15)
    return client


def _ssh_run(client: paramiko.SSHClient, command: str) -> tuple[int, str]:
    _, stdout, stderr = client.exec_command(command, timeout=60)
    out = stdout.read().decode()
    stderr.read()
    return stdout.channel.recv_exit_status(), out


def _env0(text: str) -> dict:
    return dict(item.split("=", 1) for item in text.split("\0") if "=" in item)


# --- one container started with hostile-but-valid settings (module scope) ----------

@pytest.fixture(scope="module")
def hostile(image, tmp_path_factory):
    keys = tmp_path_factory.mktemp("keys")
    plain, plain_pub = _keypair(keys, "plain")
    forced, forced_pub = _keypair(keys, "forced")
    elsewhere, elsewhere_pub = _keypair(keys, "elsewhere")
    # Three keys, one per line; options as sshd documents them; a CRLF line end.
    public_key = (f"{plain_pub}\n"
                  f'command="echo {FORCED}",no-port-forwarding {forced_pub}\r\n'
                  f'from="203.0.113.0/24" {elsewhere_pub}')
    name = f"tfmp-sec-{uuid.uuid4().hex[:10]}"
    jport, sport = free_port(), free_port()
    env = []
    for var, value in {**SETENV_VALUES, **BASHRC_VALUES}.items():
        env += ["-e", f"{var}={value}"]
    start_container(name, image, "--shm-size=256m",
                    "-p", f"127.0.0.1:{jport}:8888", "-p", f"127.0.0.1:{sport}:22",
                    "-e", f"JUPYTER_TOKEN={TOKEN}\r", "-e", f"SSH_PASSWORD={PASSWORD}\r",
                    "-e", f"PUBLIC_KEY={public_key}", *env)
    try:
        wait_until(lambda: health(name).startswith("healthy"), 120, what=f"{name} healthy")
        yield {"name": name, "jupyter": f"http://127.0.0.1:{jport}", "ssh_port": sport,
               "plain": plain, "forced": forced, "elsewhere": elsewhere}
    finally:
        print(run(["docker", "logs", "--tail", "40", name], check=False).stderr[-3000:])
        run(["docker", "rm", "-f", "-v", name], check=False, timeout=60)


def _logs(container: str) -> str:
    return run(["docker", "logs", container], check=False).stderr


# --- item 4: SSH environment without PermitUserEnvironment ------------------------

def test_sshd_config_has_no_permit_user_environment(hostile):
    config = exec_in(hostile["name"], "/usr/sbin/sshd", "-T").stdout
    assert "permituserenvironment no" in config.splitlines()
    owner = exec_in(hostile["name"], "stat", "-c", "%U %G %a",
                    "/etc/ssh/sshd_config.d/tfmp-environment.conf").stdout.split()
    assert owner == ["root", "root", "600"]
    setenv = [line for line in config.splitlines() if line.startswith("setenv ")]
    assert any(line.startswith("setenv PATH=/") for line in setenv), setenv


def test_users_own_ssh_environment_file_is_ignored(hostile):
    exec_in(hostile["name"], "bash", "-c",
            "printf 'TFMP_T_INJECTED=1\\nLD_PRELOAD=/nonexistent.so\\n' > ~/.ssh/environment",
            user="tf")
    with _ssh(hostile["ssh_port"], key=hostile["plain"]) as client:
        status, out = _ssh_run(client, "env -0")
    got = _env0(out)
    assert status == 0
    assert "TFMP_T_INJECTED" not in got and "LD_PRELOAD" not in got


@pytest.mark.parametrize("shell", ["exec", "login shell"])
def test_values_with_spaces_quotes_hash_and_equals_reach_ssh_sessions(hostile, shell):
    command = "env -0" if shell == "exec" else "bash -lc 'env -0'"
    with _ssh(hostile["ssh_port"], key=hostile["plain"]) as client:
        status, out = _ssh_run(client, command)
    got = _env0(out)
    assert status == 0
    expected = {**SETENV_VALUES, **BASHRC_VALUES}
    assert {k: got.get(k) for k in expected} == expected


def test_values_setenv_cannot_carry_come_from_a_root_owned_file(hostile):
    config = exec_in(hostile["name"], "/usr/sbin/sshd", "-T").stdout
    assert not re.search(r"^setenv TFMP_T_(DQUOTE|HASH)=", config, re.M)
    owner = exec_in(hostile["name"], "stat", "-c", "%U %a", "/etc/tfmp/ssh-extra-env.sh").stdout
    assert owner.split() == ["root", "640"]
    assert re.search(r"INFO .*TFMP_T_DQUOTE TFMP_T_HASH reach\(es\) SSH commands through /etc/bash.bashrc",
                     _logs(hostile["name"]))


# --- item 6: hostile settings that must work as meant -------------------------------

def test_token_with_trailing_cr_works_without_it(hostile):
    resp = requests.get(hostile["jupyter"] + "/api/status", timeout=10,
                        headers={"Authorization": f"token {TOKEN}"})
    assert resp.status_code == 200
    assert "JUPYTER_TOKEN: removed a trailing carriage return" in _logs(hostile["name"])


def test_password_with_spaces_quotes_dollar_and_cr_logs_in(hostile):
    with _ssh(hostile["ssh_port"], password=PASSWORD) as client:
        assert _ssh_run(client, "whoami") == (0, "tf\n")
    with pytest.raises(paramiko.AuthenticationException):
        _ssh(hostile["ssh_port"], password=PASSWORD + "\r")


def test_several_keys_in_public_key_each_work_with_their_options(hostile):
    with _ssh(hostile["ssh_port"], key=hostile["plain"]) as client:
        assert _ssh_run(client, "echo plain") == (0, "plain\n")
    with _ssh(hostile["ssh_port"], key=hostile["forced"]) as client:  # command= wins
        assert _ssh_run(client, "echo anything else") == (0, FORCED + "\n")
    with pytest.raises(paramiko.AuthenticationException):  # from= another network
        _ssh(hostile["ssh_port"], key=hostile["elsewhere"])


# --- item 6: hostile settings that must stop the start ------------------------------

@pytest.fixture(scope="module")
def one_line_two_keys(tmp_path_factory) -> str:
    d = tmp_path_factory.mktemp("twokeys")
    return f"{_keypair(d, 'a')[1]} {_keypair(d, 'b')[1]}"


@pytest.mark.parametrize("case, env, message", [
    ("token-space", ["-e", "JUPYTER_TOKEN=my token"], "JUPYTER_TOKEN: the Jupyter token may contain only"),
    ("token-quote", ["-e", "JUPYTER_TOKEN=\"quoted-token\""], "JUPYTER_TOKEN: the Jupyter token may contain only"),
    ("token-dollar", ["-e", "JUPYTER_TOKEN=pa$$word123"], "JUPYTER_TOKEN: the Jupyter token may contain only"),
    ("token-placeholder", ["-e", "JUPYTER_TOKEN=change-me-to-a-long-random-string"],
     "JUPYTER_TOKEN is .env.example's placeholder, which anyone can read"),
    ("password-two-lines", ["-e", "SSH_PASSWORD=first\nsecond"], "SSH_PASSWORD must be a single line"),
    ("key-file-empty-var", ["-e", "PUBLIC_KEY_FILE="], "PUBLIC_KEY_FILE is set but empty"),
    # Issue 24, item 1: root reads these files at start; in the home tf could make them links.
    ("token-file-in-home", ["-e", "JUPYTER_TOKEN_FILE=/home/tf/.bashrc"],
     "JUPYTER_TOKEN_FILE='/home/tf/.bashrc' is in /home/tf, which the user controls, and root "
     "reads it at start: mount it elsewhere"),
    ("key-file-in-workspace", ["-e", "PUBLIC_KEY_FILE=/workspace/../workspace/keys.pub"],
     "PUBLIC_KEY_FILE='/workspace/../workspace/keys.pub' is in /workspace, which the user controls"),
    ("log-token-bad", ["-e", "JUPYTER_LOG_TOKEN=no"], "JUPYTER_LOG_TOKEN must be 1 (print the URL "
     "with the token) or 0 (print it without; unset: 0 with JUPYTER_TOKEN_FILE, else 1). "
     "Received: JUPYTER_LOG_TOKEN='no'"),
    ("key-quoted", ["-e", "PUBLIC_KEY=\"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAA x@y\""],
     "PUBLIC_KEY line 1 is not an OpenSSH public key"),
])
def test_hostile_setting_stops_with_one_fatal_line(image, case, env, message):
    _assert_one_fatal(docker_run(image, *env, timeout=60), message)


def test_two_keys_on_one_line_stop_with_one_fatal_line(image, one_line_two_keys):
    proc = docker_run(image, "-e", f"PUBLIC_KEY={one_line_two_keys}", timeout=60)
    _assert_one_fatal(proc, "PUBLIC_KEY line 1 holds more than one key")


def test_empty_public_key_file_stops_with_one_fatal_line(image, tmp_path):
    empty = tmp_path / "keys.pub"
    empty.write_text("\n# no key here\n")
    proc = docker_run(image, "-v", f"{empty}:/run/keys.pub:ro", "-e", "PUBLIC_KEY_FILE=/run/keys.pub",
                      timeout=60)
    _assert_one_fatal(proc, "PUBLIC_KEY_FILE='/run/keys.pub' holds no public key")


def test_a_token_file_of_two_lines_stops_with_one_fatal_line(image, tmp_path):
    """Its lines were joined: the server's token was neither line the user wrote."""
    secret = tmp_path / "token"
    secret.write_text("first-token\nsecond-token\n")
    proc = docker_run(image, "-v", f"{secret}:/run/token:ro", "-e", "JUPYTER_TOKEN_FILE=/run/token",
                      timeout=60)
    _assert_one_fatal(proc, "JUPYTER_TOKEN_FILE='/run/token' holds more than one line; allowed: "
                            "the secret alone, on one line")


def test_a_users_jupyter_config_cannot_empty_the_token(image, tmp_path):
    """A config of the user's loads after the image's: one that set the token to "" served
    every request without authentication ("All authentication is disabled") while the start
    printed a URL with a token.  The image's identity provider, named on the server's command
    line, keeps the token."""
    config = tmp_path / "cfg"
    config.mkdir()
    (config / "jupyter_server_config.json").write_text(
        json.dumps({"IdentityProvider": {"token": ""}, "ServerApp": {"token": ""}}))
    os.chmod(config, 0o755)
    name, port = f"tfmp-noauth-{uuid.uuid4().hex[:8]}", free_port()
    start_container(name, image, "-p", f"127.0.0.1:{port}:8888", "-e", "ENABLE_SSH=0",
                    "-e", f"JUPYTER_TOKEN={TOKEN}", "-e", "JUPYTER_CONFIG_DIR=/cfg",
                    "-v", f"{config}:/cfg:ro")
    try:
        wait_until(lambda: health(name).startswith("healthy"), 120, what=f"{name} healthy")
        url = f"http://127.0.0.1:{port}/api/contents"
        assert requests.get(url, timeout=10).status_code == 403
        assert requests.get(url, timeout=10, headers={"Authorization": f"token {TOKEN}"}
                            ).status_code == 200
        logs = _logs(name)
        assert "a Jupyter config set an empty token, which would turn authentication off: " \
               "the image's token is used" in logs, logs[-3000:]
        assert "All authentication is disabled" not in logs
    finally:
        run(["docker", "rm", "-f", "-v", name], check=False, timeout=60)


def test_missing_key_file_mounted_as_a_folder_stops(image, tmp_path):
    """`-v ~/.ssh/missing.pub:...` makes Docker create an empty folder there."""
    proc = docker_run(image, "-v", f"{tmp_path / 'missing.pub'}:/run/keys.pub",
                      "-e", "PUBLIC_KEY_FILE=/run/keys.pub", timeout=60)
    _assert_one_fatal(proc, "PUBLIC_KEY_FILE='/run/keys.pub' is not a readable file")


@pytest.mark.parametrize("gid, group, what", [
    ("42", "shadow", "gives rights others lack on /etc/shadow"),
    ("0", "root", "gives rights others lack on /etc/"),
    ("4", "adm", "gives rights others lack on /var/log/"),
    # tty writes to the terminals of `docker exec -it`, root's too (none exists at start)
    ("5", "tty", "gives rights others lack on every terminal (/dev/pts, gid=5"),
])
def test_an_nb_gid_of_a_privileged_group_stops_the_start(image, gid, group, what):
    """NB_GID joins the user to that GID's group: shadow would read /etc/shadow, adm the
    logs, root's group root's files.  One FATAL line naming the group, before any change."""
    proc = docker_run(image, "-e", f"NB_GID={gid}", "-e", "SSH_PASSWORD=pw-12345678",
                      command=["id"], timeout=60)
    _assert_one_fatal(proc, f"NB_GID={gid} is the image's group '{group}', which {what}")
    assert "uid=" not in proc.stdout


def test_no_group_gets_sudo_and_a_group_that_owns_nothing_is_taken(image):
    """sudo's own `%sudo ALL=(ALL:ALL) ALL` is gone (with it and an SSH_PASSWORD, NB_GID=27
    gave root), so group sudo gives nothing; it, docker-stacks' users (100) and a Mac's staff
    GID (20, dialout here) own nothing of the system's, and start as before."""
    rules = docker_run(image, "--entrypoint", "bash", command=[
        "-c", "grep -hE '^[[:space:]]*%' /etc/sudoers /etc/sudoers.d/* || true"], timeout=60)
    assert rules.returncode == 0 and rules.stdout.strip() == "", rules.stdout
    for gid, name in (("27", "sudo"), ("100", "users"), ("20", "dialout")):
        proc = docker_run(image, "-e", "TFMP_QUIET=1", "-e", f"NB_GID={gid}",
                          command=["id", "-gn"], timeout=60)
        assert proc.returncode == 0 and proc.stdout.strip() == name, (gid, proc.stderr[-1500:])


def test_the_users_own_group_on_a_mounted_data_folder_is_no_privilege(image, tmp_path):
    """NB_GID set to the host's `id -g`, as docs/image.md says, with a data folder of that
    group the group alone may read (umask 027: 750 and 640), a folder and a single file
    mounted: what the admin mounts is not the image's, so the start goes on and the user
    reads the data through the group."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "x.csv").write_text("a,b\n")
    alone = tmp_path / "alone.txt"
    alone.write_text("single\n")
    for path, mode in ((data, 0o750), (data / "x.csv", 0o640), (alone, 0o640)):
        os.chown(path, 4321, 4242)
        os.chmod(path, mode)
    proc = docker_run(image, "-e", "TFMP_QUIET=1", "-e", "NB_UID=4321", "-e", "NB_GID=4242",
                      "-v", f"{data}:/data", "-v", f"{alone}:/srv/alone.txt",
                      command=["bash", "-c", "id -g; cat /data/x.csv /srv/alone.txt"],
                      timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["4242", "a,b", "single"], proc.stdout


def _assert_one_fatal(proc, message: str) -> None:
    assert proc.returncode == 64, (proc.returncode, proc.stderr[-2000:])
    fatal = [line for line in proc.stderr.splitlines() if "FATAL" in line]
    assert len(fatal) == 1 and message in fatal[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


# --- the start's own helpers run no code of the user's -------------------------------------

# As `tf`: a .pth file in the user site (on the home volume) that logs who loaded it and what it
# saw of a secret meant for hooks only; a dist-info there too, so the start's package check runs.
PLANT_PTH = ("site=$(python3 -c 'import site; print(site.getusersitepackages())') && "
             "mkdir -p \"$site/probe_pkg-1.0.dist-info\" && "
             "printf 'Metadata-Version: 2.1\\nName: probe-pkg\\nVersion: 1.0\\n' "
             ">\"$site/probe_pkg-1.0.dist-info/METADATA\" && "
             "echo \"import os, sys; open('/home/tf/pth-ran.txt', 'a').write("
             "repr((os.path.basename(sys.argv[0]), os.environ.get('HOOKS_ONLY_SECRET'))) + '\\n')\" "
             ">\"$site/zz_probe.pth\"")


def test_the_starts_own_helpers_run_no_code_from_the_users_site(image):
    """A .pth file in ~/.local (the persistent home) ran in tfmp-home, `tfmp notebooks` and
    tfmp-tensorboard during the root start, before JUPYTER_ENV_VARS_TO_UNSET applied: it read
    the secret meant for the hooks.  Only the user's own sessions (the server) load it now."""
    volume = f"tfmp-t-pth-{uuid.uuid4().hex[:8]}"
    name = f"tfmp-t-pth-{uuid.uuid4().hex[:8]}"
    try:
        proc = docker_run(image, "-e", "TFMP_QUIET=1", "-v", f"{volume}:/home/tf",
                          command=["bash", "-c", PLANT_PTH])
        assert proc.returncode == 0, proc.stderr
        start_container(name, image, "-e", f"JUPYTER_TOKEN={TOKEN}", "-e", "ENABLE_SSH=0",
                        "-e", "HOOKS_ONLY_SECRET=s3cret", "-e", "JUPYTER_ENV_VARS_TO_UNSET=HOOKS_ONLY_SECRET",
                        "-v", f"{volume}:/home/tf")
        wait_until(lambda: health(name).startswith(("healthy", "unhealthy", "none|exited")),
                   timeout=150, interval=0.5, what=f"{name}'s healthcheck")
        assert health(name).startswith("healthy"), _logs(name)[-3000:]
        ran = exec_in(name, "cat", "/home/tf/pth-ran.txt", check=False).stdout.splitlines()
        assert ran and all(line.endswith(", None)") for line in ran), ran   # the server's own
        helpers = [line for line in ran if re.search(r"'(tfmp|tfmp-home|tfmp-tensorboard|tfmp-tls)'", line)]
        assert not helpers, helpers
    finally:
        run(["docker", "rm", "-f", "-v", name], check=False, timeout=60)
        run(["docker", "volume", "rm", "-f", volume], check=False, timeout=60)


# --- item 3: nbconvert pages are sandboxed ------------------------------------------

NOTEBOOK = {
    "nbformat": 4, "nbformat_minor": 5, "metadata": {},
    "cells": [{"cell_type": "code", "id": "c1", "metadata": {}, "execution_count": 1,
               "source": "display(HTML(...))",
               "outputs": [{"output_type": "display_data", "metadata": {},
                            "data": {"text/html": "<script>document.title='owned'</script>"}}]}],
}


def test_nbconvert_pages_carry_a_sandbox_csp(hostile):
    headers = {"Authorization": f"token {TOKEN}"}
    base = hostile["jupyter"]
    put = requests.put(f"{base}/api/contents/csp-check.ipynb", headers=headers, timeout=30,
                       json={"type": "notebook", "format": "json", "content": NOTEBOOK})
    assert put.status_code in (200, 201), put.text
    get = requests.get(f"{base}/nbconvert/html/csp-check.ipynb", headers=headers, timeout=60)
    post = requests.post(f"{base}/nbconvert/html", headers=headers, timeout=60,
                         json={"content": NOTEBOOK})
    for resp in (get, post):
        assert resp.status_code == 200, resp.text[:500]
        csp = resp.headers["Content-Security-Policy"]
        assert "frame-ancestors 'self'" in csp and "sandbox allow-scripts" in csp, csp
    assert "owned" in get.text  # the payload is there; the sandbox is what defuses it
    assert "tfmp_nbconvert_csp:" in _logs(hostile["name"])


REAL_BASE_SERVER_CHECK = r"""
set -e
PIP_CONSTRAINT= pip install -q --user 'jupyter_server==2.14.2' 'tornado==6.4.2' >/tmp/pip.log 2>&1 \
  || { tail -n 20 /tmp/pip.log; exit 1; }
echo token-for-2-14-2 > /tmp/tok
printf '%s' '{"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": []}' > /tmp/empty.ipynb
TFMP_JUPYTER_TOKEN_PATH=/tmp/tok jupyter server --ServerApp.root_dir=/tmp --ServerApp.port=8899 \
  >/tmp/server.log 2>&1 &
python3 - <<'EOF'
import time, urllib.error, urllib.request, jupyter_server, tornado
url = "http://127.0.0.1:8899/nbconvert/html/empty.ipynb"
request = urllib.request.Request(url, headers={"Authorization": "token token-for-2-14-2"})
for _ in range(120):
    try:
        response = urllib.request.urlopen(request)
        break
    except (urllib.error.URLError, ConnectionError):
        time.sleep(0.5)
print("versions", jupyter_server.__version__, tornado.version)
print("CSP", response.headers["Content-Security-Policy"])
EOF
"""


def test_nbconvert_sandbox_on_the_real_bases_server_versions(image):
    """The real base (Python 3.8) gets jupyter_server 2.14.2 and tornado 6.4.2; the
    stand-in has newer ones.  Install those two (as the user, from the index) and
    check the override there too."""
    proc = docker_run(image, "-e", "TFMP_QUIET=1", "-v", f"{HOST_CA_BUNDLE}:/tmp/host-ca.crt:ro",
                      "-e", "PIP_CERT=/tmp/host-ca.crt",
                      command=["bash", "-c", REAL_BASE_SERVER_CHECK], timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "versions 2.14.2 6.4.2" in proc.stdout, proc.stdout
    csp = proc.stdout.split("CSP ", 1)[1].splitlines()[0]
    assert "frame-ancestors 'self'" in csp and "sandbox allow-scripts" in csp, csp


# The server's extensions as a start builds them: the image's config, a user's config that
# adds one the way the refusal of --ServerApp.jpserver_extensions says, and the command line.
EXTENSIONS_CHECK = r"""
set -e
echo token-for-the-check > /tmp/tok
mkdir -p ~/.jupyter
echo "c.ServerApp.jpserver_extensions.update({'jupyter_lsp': True})" > ~/.jupyter/jupyter_server_config.py
TFMP_JUPYTER_TOKEN_PATH=/tmp/tok python3 -c '
import sys
from jupyter_server.serverapp import ServerApp
app = ServerApp()
app.parse_command_line(sys.argv[1:])
app.load_config_file()
print(sorted(k for k, on in app.jpserver_extensions.items() if on))
' "$@"
"""


def test_an_extension_enabled_in_a_config_file_keeps_the_nbconvert_fix(image):
    """`--ServerApp.jpserver_extensions=jupyter_lsp=True` replaced the whole dict, the
    CSP fix with it (refused now, one line: tests/image/test_docker_stacks.py); the way the
    refusal names, a config file's update(), keeps both."""
    proc = docker_run(image, "--user", "1000", "--entrypoint", "bash",
                      command=["-c", EXTENSIONS_CHECK, "check"], timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "['jupyter_lsp', 'tfmp_nbconvert_csp']", \
        proc.stdout + proc.stderr[-2000:]


def test_cookie_secret_is_fresh_per_start_and_not_on_disk(hostile):
    found = exec_in(hostile["name"], "find", "/home/tf", "-name", "jupyter_cookie_secret").stdout
    assert found.strip() == ""
    assert "Writing Jupyter server cookie secret" not in _logs(hostile["name"])


def test_sandbox_is_added_once_and_keeps_the_policy():
    import importlib.util

    spec = importlib.util.spec_from_file_location("csp", REPO / "docker/python/tfmp_nbconvert_csp.py")
    csp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(csp)
    assert csp.with_sandbox("frame-ancestors 'self'") == "frame-ancestors 'self'; sandbox allow-scripts"
    once = csp.with_sandbox("frame-ancestors 'self'; report-uri /csp")
    assert once == "frame-ancestors 'self'; report-uri /csp; sandbox allow-scripts"
    assert csp.with_sandbox(once) == once
    assert csp.with_sandbox("default-src 'none'; sandbox") == "default-src 'none'; sandbox"


# --- item 5: ssh-audit against the running stack --------------------------------------

# The one finding ssh-audit (3.9) gives every key exchange OpenSSH 8.2 (the real
# base) and 8.4 (the stand-in) can offer: the post-quantum hybrids arrived in 8.5
# (sntrup4591761 in 8.0-8.4 was withdrawn, and ssh-audit warns on it too).
ALLOWED_WARNINGS = {("kex", "does not provide protection against post-quantum attacks")}


def _ssh_audit_findings(text: str) -> list[tuple[str, str, str, str]]:
    """(kind, algorithm, level, message) for every [fail]/[warn] line."""
    found, kind, algorithm = [], "", ""
    for line in text.splitlines():
        head = re.match(r"\((\w+)\) (\S+)", line)
        if head:
            kind, algorithm = head.groups()
        for level, message in re.findall(r"\[(fail|warn)\] (.+?)\s*$", line):
            found.append((kind, algorithm, level, message))
    return found


def test_ssh_audit_reports_no_failure_and_no_warning(stack):
    """No failure, and no warning but the documented post-quantum one (docs/image.md)."""
    proc = run([_tool("ssh-audit"), "--no-colors", "--skip-rate-test", "-t", "15",
                "-p", str(stack.ssh_port), "127.0.0.1"], timeout=120, check=False)
    print(proc.stdout)
    assert "(gen) banner: SSH-2.0-OpenSSH" in proc.stdout, proc.stdout[-3000:] + proc.stderr
    # ssh-audit's exit status: 0 good, 2 warnings only, 3 a failure (1: no connection).
    assert proc.returncode in (0, 2), (proc.returncode, proc.stdout[-3000:])
    # Its Terrapin note when ChaCha20 or CBC-EtM would let an unpatched client in.
    assert "vulnerable SSH channels" not in proc.stdout, proc.stdout[-3000:]
    findings = _ssh_audit_findings(proc.stdout)
    unexpected = [f for f in findings if (f[0], f[3]) not in ALLOWED_WARNINGS or f[2] != "warn"]
    assert not unexpected, "\n".join(map(str, unexpected))
    assert not re.search(r"^\(cve\)", proc.stdout, re.M), proc.stdout


# --- item 8: pip and its resolver -------------------------------------------------------

def test_pip_is_25_0_1(image):
    proc = docker_run(image, "-e", "TFMP_QUIET=1", command=["pip", "--version"])
    assert proc.returncode == 0, proc.stderr
    print(proc.stdout)
    assert proc.stdout.startswith("pip 25.0.1 "), proc.stdout


def test_conflicting_install_is_refused_whole(image):
    """A good package beside an impossible one: the resolver refuses both, so
    nothing is installed; the legacy resolver would have installed the first."""
    script = ("before=$(pip freeze --all | sort); "
              "pip install --user 'tomli-w' 'numpy>=2' > /tmp/pip.log 2>&1; echo pip-exit=$?; "
              "cat /tmp/pip.log; "
              "after=$(pip freeze --all | sort); "
              "[ \"$before\" = \"$after\" ] && echo unchanged; "
              "pip check && echo pip-check-ok")
    proc = docker_run(image, "-e", "TFMP_QUIET=1", "-v", f"{HOST_CA_BUNDLE}:/tmp/host-ca.crt:ro",
                      "-e", "PIP_CERT=/tmp/host-ca.crt", command=["bash", "-lc", script],
                      timeout=300)
    out = proc.stdout
    assert "pip-exit=1" in out, out[-3000:] + proc.stderr[-2000:]
    assert "ResolutionImpossible" in out or "conflict" in out.lower(), out[-3000:]
    assert "unchanged" in out and "pip-check-ok" in out, out[-3000:]


# --- item 5 and 7: static checks ------------------------------------------------------------

def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed (the test extra in pyproject.toml has it)")
    return path


def _in_image_python_files() -> list[Path]:
    """app/, docker/ and the tests the image ships (.dockerignore keeps out
    tests/image and tests/benchmarks, which run on the host)."""
    # docker/bin holds the programs named as installed (no .py); all of them are Python but
    # run-hooks.sh, docker-stacks' hook runner, a shell file (shellcheck checks it).
    programs = [p for p in (REPO / "docker/bin").iterdir() if p.suffix != ".sh"]
    files = [*(REPO / "app").rglob("*.py"), *(REPO / "docker").rglob("*.py"), *programs]
    files += [p for p in (REPO / "tests").rglob("*.py")
              if not {"image", "benchmarks"} & set(p.relative_to(REPO / "tests").parts)]
    return sorted(p for p in files if "__pycache__" not in p.parts)


def test_code_that_runs_in_the_image_needs_at_most_python_3_8():
    """The real base runs Python 3.8, which no Debian package offers to test on.

    vermin does not count annotations unless told to; a module without
    `from __future__ import annotations` evaluates them at import time, so
    those modules are checked with --eval-annotations (`list[int]` there would
    fail on 3.8).  ast's 3.8 grammar mode catches newer syntax as well."""
    import ast

    files = _in_image_python_files()
    assert any(p.parts[-2:] == ("app", "__main__.py") for p in files)
    lazy = [p for p in files if "from __future__ import annotations" in p.read_text()]
    eager = [p for p in files if p not in lazy]
    for group, flags in ((lazy, []), (eager, ["--eval-annotations"])):
        proc = run([_tool("vermin"), "--target=3.8-", "--violations", "--no-tips", *flags,
                    *map(str, group)], timeout=120, check=False)
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    for path in files:
        ast.parse(path.read_text(), filename=str(path), feature_version=(3, 8))


def test_k8s_example_validates_against_a_current_kubernetes_schema():
    import kubernetes_validate
    import yaml

    version = kubernetes_validate.latest_version()
    manifest = REPO / "docs/k8s/multiworker-job.yaml"
    docs = [d for d in yaml.safe_load_all(manifest.read_text()) if d]
    assert {d["kind"] for d in docs} >= {"Job"}
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)  # raises on any error
    assert int(version.split(".")[1]) >= 30, version


# --- hardened starts: --cap-drop and --read-only (docs/image.md, "Hardened starts") ---------

# docs/image.md's minimal set for a root start with SSH: what the start itself needs, KILL
# (its SIGTERM to the user's jobs at docker stop) and SYS_CHROOT (sshd's logins).
MINIMAL_CAPS = ("CHOWN", "DAC_OVERRIDE", "SETUID", "SETGID", "KILL", "SYS_CHROOT")


def _caps(*without: str) -> list[str]:
    return ["--cap-drop", "ALL", *[arg for cap in MINIMAL_CAPS if cap not in without
                                   for arg in ("--cap-add", cap)]]


@pytest.mark.parametrize("args, message", [
    (["--cap-drop", "ALL", "-e", "NB_UID=2030", "-e", "NB_GID=2030"],
     "started as root without the capabilities CHOWN DAC_OVERRIDE SETUID SETGID (--cap-drop)"),
    (["--cap-drop", "ALL", "--cap-add", "CHOWN", "--cap-add", "SETUID"],
     "allowed: --cap-add DAC_OVERRIDE --cap-add SETGID (docs/image.md, \"Hardened starts\"), "
     "or --user UID:GID, a start without root, which needs none"),
    (["--read-only", "-e", "NB_UID=2020", "-e", "NB_GID=2020"],
     "the root file system is read-only (--read-only) and a root start writes /etc"),
    (["--read-only", "--tmpfs", "/run", "--tmpfs", "/tmp", "--user", "1000:100"],
     "a start with --user writes /run/tfmp and /tmp; add --tmpfs /run/tfmp ("),
], ids=["cap-drop-all", "two-caps-missing", "read-only-root", "read-only-user-no-state-tmpfs"])
def test_a_hardened_start_that_cannot_work_stops_with_one_fatal_line(image, args, message):
    """--cap-drop ALL said a fresh home volume was someone else's (or ended in setpriv's
    "Operation not permitted", exit 1); --read-only ended in groupmod's or chown's or mktemp's
    own error, exit 10 or 1.  Now one FATAL line with what works, before any change."""
    _assert_one_fatal(docker_run(image, *args, command=["true"], timeout=60), message)


def test_hardened_starts_that_work_say_what_is_missing_and_go_on(image):
    """The documented minimal set (a batch job: no WARN about capabilities); without KILL one
    WARN (jobs get no SIGTERM at docker stop); --read-only with --user and the two tmpfs runs."""
    minimal = docker_run(image, *_caps(), command=["true"], timeout=60)
    assert minimal.returncode == 0 and "capabilit" not in minimal.stderr, minimal.stderr[-2000:]
    proc = docker_run(image, *_caps("KILL"), command=["true"], timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert ("WARN  no KILL capability (--cap-drop): at docker stop the user's jobs get no SIGTERM "
            "from the start") in proc.stderr, proc.stderr[-2000:]
    ro = docker_run(image, "--read-only", "--tmpfs", "/run/tfmp", "--tmpfs", "/tmp",
                    "--user", "1000:100", command=["bash", "-c", "echo $HOME"], timeout=60)
    assert ro.returncode == 0 and ro.stdout.strip() == "/tmp/home-1000", ro.stderr[-2000:]
    assert ("/home/tf is not writable by UID 1000, GID 100: it is on the read-only root file "
            "system (--read-only): mount a volume on /home/tf") in ro.stderr, ro.stderr[-2000:]


def test_without_sys_chroot_ssh_is_off_with_one_warn_line(image):
    """sshd chroots every login: without SYS_CHROOT each login failed while the container was
    healthy.  SSH is off with one WARN (as for --user), Jupyter serves."""
    name = start_container(f"tfmp-nochroot-{uuid.uuid4().hex[:8]}", image, *_caps("SYS_CHROOT"),
                           "-e", "SSH_PASSWORD=pw-12345678")
    try:
        wait_until(lambda: health(name).startswith("healthy"), 120, what=f"{name} healthy")
        logs = _logs(name)
        assert ("WARN  SSH: the container lacks the SYS_CHROOT capability (--cap-drop), which "
                "sshd needs for every login, so only JupyterLab runs") in logs, logs[-2000:]
        assert "SSH host key" not in logs and "FATAL" not in logs, logs[-2000:]
    finally:
        run(["docker", "rm", "-f", name], check=False, timeout=60)


@pytest.mark.parametrize("where, ids, message", [
    ("/home/tf", ["-e", "NB_UID=2030", "-e", "NB_GID=2030"],
     "the home /home/tf belongs to UID 1234, not NB_UID=2030: set NB_UID=1234 with an NB_GID "
     "of your own (not 0, the folder's group 'root', which NB_GID may not be) or mount"),
    ("/workspace", [],
     "the workspace /workspace belongs to UID 1234, not NB_UID=1000, and UID 1000 may not write "
     "there: set NB_UID=1234 with an NB_GID of your own (not 0, the folder's group 'root'"),
])
def test_the_advice_for_a_folder_of_another_user_names_no_refused_gid(image, tmp_path, where,
                                                                       ids, message):
    """A mounted folder of UID 1234, group 0: the FATAL said "set NB_UID=1234 (and NB_GID=0)",
    and NB_GID=0 is refused.  Following the new advice starts (NB_GID of one's own)."""
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("x\n")
    folder.chmod(0o755)
    for path in (folder, folder / "notes.txt"):
        os.chown(path, 1234, 0)
    _assert_one_fatal(docker_run(image, *ids, "-v", f"{folder}:{where}", command=["true"],
                                 timeout=60), message)
    if where == "/home/tf":
        proc = docker_run(image, "-e", "TFMP_QUIET=1", "-e", "NB_UID=1234", "-e", "NB_GID=2030",
                          "-v", f"{folder}:{where}", command=["true"], timeout=60)
        assert proc.returncode == 0, proc.stderr[-2000:]


def test_a_user_start_on_a_home_of_another_uid_names_its_owner(image):
    """The home volume re-owned for NB_UID=2005, then --user 12345:0: the WARN told to start
    with --user 12345:0, as it was.  Now it names the owner and a start that works."""
    volume = f"qa-ff-home-{uuid.uuid4().hex[:8]}"
    try:
        first = docker_run(image, "-e", "TFMP_QUIET=1", "-e", "NB_UID=2005", "-e", "NB_GID=2005",
                           "-v", f"{volume}:/home/tf", command=["true"], timeout=60)
        assert first.returncode == 0, first.stderr[-2000:]
        proc = docker_run(image, "-e", "TFMP_QUIET=1", "--user", "12345:0",
                          "-v", f"{volume}:/home/tf", command=["bash", "-c", "echo $HOME"],
                          timeout=60)
        assert proc.returncode == 0 and proc.stdout.strip() == "/tmp/home-12345", proc.stderr
        assert ("WARN  /home/tf is not writable by UID 12345, GID 0: it belongs to UID:GID "
                "2005:2005 (mode 775): start with --user 2005:2005, or as root with NB_UID=12345"
                ) in proc.stderr, proc.stderr[-2000:]
        assert "--user 12345:0" not in proc.stderr
    finally:
        run(["docker", "volume", "rm", "-f", volume], check=False, timeout=60)
