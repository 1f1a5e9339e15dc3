"""The start-up parts' Python helpers (docker/bin/tfmp-tls, tfmp-versions), run as programs
the way the parts run them: from the repository on a host, from /usr/local/bin in the image."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.paths import ROOT


def program(name: str) -> Path:
    for path in (ROOT / "docker/bin" / name, Path("/usr/local/bin") / name):
        if path.is_file():
            return path
    pytest.fail(f"{name} is neither in docker/bin nor in /usr/local/bin")


def run(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(program(name)), *args], capture_output=True,
                          text=True, timeout=60)


def test_tls_names_are_sorted_san_entries_as_openssl_prints_them():
    proc = run("tfmp-tls", "names", "GPU-Box.example.org., 203.0.113.7 [2001:db8::1] *.lab.example.org")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [
        "DNS:*.lab.example.org", "DNS:gpu-box.example.org", "DNS:localhost",
        "IP:127.0.0.1", "IP:2001:DB8:0:0:0:0:0:1", "IP:203.0.113.7"]


def test_tls_names_without_hostnames_are_the_loopback_ones():
    assert run("tfmp-tls", "names", "").stdout.split() == ["DNS:localhost", "IP:127.0.0.1"]


@pytest.mark.parametrize("word", ["bad_name", "-lead.example.org", "a" * 64 + ".org"])
def test_a_bad_tls_name_is_one_line_and_status_1(word):
    proc = run("tfmp-tls", "names", f"ok.example.org,{word}")
    assert proc.returncode == 1
    assert proc.stdout.strip().splitlines() == [
        f"JUPYTER_TLS_HOSTNAMES: {word!r} is neither a host name nor an IP address; allowed: "
        "names such as gpu-box.example.org or *.example.org, IPv4 or IPv6 addresses, "
        "separated by commas or spaces"]


def test_tls_check_refuses_a_pair_python_ssl_cannot_load(tmp_path):
    (tmp_path / "c.pem").write_text("not a certificate\n")
    proc = run("tfmp-tls", "check", str(tmp_path / "c.pem"), str(tmp_path / "c.pem"))
    assert proc.returncode != 0 and "SSLError" in proc.stderr


def test_tls_usage_error_is_one_line_exit_2():
    proc = run("tfmp-tls", "frobnicate")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "usage" in proc.stderr


def test_versions_line_names_python_tensorflow_jupyterlab_numpy():
    proc = run("tfmp-versions")
    assert proc.returncode == 0, proc.stderr
    line = proc.stdout.strip()
    assert line.startswith(f"Python {sys.version.split()[0]}, TensorFlow ")
    assert ", JupyterLab " in line and ", numpy " in line


# --- tfmp-jupyter-args: the Jupyter server's options (serve/10-jupyter.sh) ---------------------

def jupyter_args(*args: str, **env: str) -> subprocess.CompletedProcess:
    import os

    clean = {k: v for k, v in os.environ.items()
             if k not in ("NOTEBOOK_ARGS", "JUPYTER_PORT", "ENABLE_SSH")
             and not k.startswith("JUPYTERHUB_")}
    return subprocess.run([sys.executable, str(program("tfmp-jupyter-args")), *args],
                          capture_output=True, text=True, timeout=60, env={**clean, **env})


def parsed(proc: subprocess.CompletedProcess) -> list:
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.endswith("\0"), proc.stdout
    return proc.stdout[:-1].split("\0")


def test_jupyter_args_pass_through_with_notebook_args_first():
    out = parsed(jupyter_args("--ServerApp.base_url=/team/x", "--debug",
                              NOTEBOOK_ARGS="--ServerApp.iopub_data_rate_limit=1e9 --LabApp.collaborative='yes please'"))
    assert out == ["8888", "/team/x/", "--ServerApp.iopub_data_rate_limit=1e9",
                   "--LabApp.collaborative=yes please", "--ServerApp.base_url=/team/x", "--debug"]


def test_jupyter_args_port_from_jupyter_port_then_the_last_option():
    assert parsed(jupyter_args(JUPYTER_PORT="9999"))[:2] == ["9999", "/"]
    assert parsed(jupyter_args("--port", "7000", "--ServerApp.port=7001", JUPYTER_PORT="9999"))[:2] == ["7001", "/"]
    assert parsed(jupyter_args("--ServerApp.base_url", "/a/b/"))[:2] == ["8888", "/a/b/"]


def test_jupyter_args_take_port_22_where_no_ssh_server_runs():
    assert parsed(jupyter_args(JUPYTER_PORT="22", ENABLE_SSH="0"))[:2] == ["22", "/"]
    assert parsed(jupyter_args("--hub", JUPYTERHUB_SERVICE_URL="http://0.0.0.0:22/"))[:1] == ["22"]


def test_jupyter_args_under_the_hub_take_its_port_and_prefix():
    out = parsed(jupyter_args("--hub", "--debug", JUPYTERHUB_SERVICE_URL="http://0.0.0.0:8890/user/ann/",
                              JUPYTERHUB_SERVICE_PREFIX="/user/ann/"))
    assert out == ["8890", "/user/ann/", "--debug"]
    proc = jupyter_args("--hub", "--ServerApp.base_url=/x/", JUPYTERHUB_SERVICE_PREFIX="/user/ann/")
    assert proc.returncode == 2 and "JUPYTERHUB_SERVICE_PREFIX" in proc.stderr


@pytest.mark.parametrize("args, env, words", [
    (["--ServerApp.token="], {}, "--ServerApp.token is refused: set JUPYTER_TOKEN"),
    (["--IdentityProvider.token", "abc"], {}, "--IdentityProvider.token is refused"),
    ([], {"NOTEBOOK_ARGS": "--NotebookApp.token=''"}, "--NotebookApp.token is refused"),
    (["--ServerApp.password=sha1:x"], {}, "--ServerApp.password is refused"),
    (["--PasswordIdentityProvider.hashed_password=x"], {}, "is refused"),
    (["--ServerApp.identity_provider_class=x.Y"], {}, "--ServerApp.identity_provider_class is refused"),
    (["--ServerApp.allow_unauthenticated_access=True"], {}, "never runs without authentication"),
    (["--ServerApp.disable_check_xsrf=True"], {}, "XSRF"),
    (["--certfile=/tmp/c.pem"], {}, "JUPYTER_CERTFILE"),
    (["--port=http"], {}, "--port must be a port number"),
    ([], {"JUPYTER_PORT": "0"}, "JUPYTER_PORT must be a port number (1-65535). Received: '0'"),
    ([], {"NOTEBOOK_ARGS": "--x='open"}, "NOTEBOOK_ARGS cannot be split"),
    (["--ServerApp.base_url=/a b/"], {}, "base_url must be a URL path"),
    (["--ServerApp.base_url=/../x/"], {}, "base_url must be a URL path"),
    # A config file on the command line replaces every jupyter_server_config (the image's)
    (["--config=/tmp/noauth.py"], {}, "the Jupyter option --config is refused: it replaces "
                                      "the image's server settings"),
    ([], {"NOTEBOOK_ARGS": "--JupyterApp.config_file /tmp/x.json"}, "config_file is refused"),
    # Jupyter moved off sshd's port quietly; the URL and the healthcheck did not
    ([], {"JUPYTER_PORT": "22"}, "the Jupyter port 22 is the SSH server's in the container; "
                                 "allowed: another port (JUPYTER_PORT, default 8888), or "
                                 "ENABLE_SSH=0"),
    (["--port", "22"], {"ENABLE_SSH": "1"}, "the Jupyter port 22 is the SSH server's"),
])
def test_jupyter_args_refusals_are_one_line_and_status_2(args, env, words):
    proc = jupyter_args(*args, **env)
    assert proc.returncode == 2, proc.stdout
    assert proc.stdout == "" and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert words in proc.stderr, proc.stderr


# Every spelling traitlets reads as the same setting (one dash or two, `=` or the next
# argument, any class: a base class's setting reaches the server too), and the web
# application's settings, which tornado_settings (or an extension's settings) override:
# each one turned the XSRF check or the token off (QA: a cookie-only POST /api/kernels got
# 201 with -ServerApp.disable_check_xsrf=True).
XSRF = "the server never runs without its XSRF check"


@pytest.mark.parametrize("args, env, words", [
    (["-ServerApp.disable_check_xsrf=True"], {}, f"the Jupyter option -ServerApp.disable_check_xsrf is refused: {XSRF}"),
    ([], {"NOTEBOOK_ARGS": "-ServerApp.disable_check_xsrf=True"}, "-ServerApp.disable_check_xsrf is refused"),
    (["-ServerApp.disable_check_xsrf", "True"], {}, "-ServerApp.disable_check_xsrf is refused"),
    (["--NotebookApp.disable_check_xsrf", "True"], {}, "--NotebookApp.disable_check_xsrf is refused"),
    (["-Configurable.disable_check_xsrf=True"], {}, "-Configurable.disable_check_xsrf is refused"),
    (["-ServerApp.token="], {}, "the Jupyter option -ServerApp.token is refused: set JUPYTER_TOKEN"),
    (["-IdentityProvider.token", "abc"], {}, "-IdentityProvider.token is refused"),
    (["-PasswordIdentityProvider.password_required=False"], {}, "is refused"),
    (["-JupyterApp.config_file=/tmp/x.py"], {}, "-JupyterApp.config_file is refused: it replaces"),
    (["--ServerApp.cookie_secret=abc"], {}, "a known secret lets anyone sign a login cookie"),
    (['--ServerApp.tornado_settings={"disable_check_xsrf": True}'], {},
     f"the Jupyter option --ServerApp.tornado_settings is refused: it sets disable_check_xsrf, and {XSRF}"),
    ([], {"NOTEBOOK_ARGS": "--ServerApp.tornado_settings='{\"xsrf_cookies\": False}'"},
     f"it sets xsrf_cookies, and {XSRF}"),
    (["--ServerApp.tornado_settings", "disable_check_xsrf=True"], {}, "it sets disable_check_xsrf"),
    (["-ServerApp.tornado_settings=allow_unauthenticated_access=True"], {},
     "-ServerApp.tornado_settings is refused: it sets allow_unauthenticated_access"),
    (["--ServerApp.tornado_settings=headers={}", "--ServerApp.tornado_settings=token="], {},
     "it sets token, and set JUPYTER_TOKEN"),
    (["--NotebookApp.tornado_settings={'cookie_secret': b'x'}"], {}, "it sets cookie_secret"),
    (["--LabApp.settings=disable_check_xsrf=True"], {}, "--LabApp.settings is refused: it sets disable_check_xsrf"),
    (["--ServerApp.tornado_settings.disable_check_xsrf=True"], {}, "is refused"),
    # Cross-origin pages with the login cookie (QA: a cookie-only terminal websocket from
    # another origin got 101 with allow_origin_pat=.*, the contents API a CORS 200).
    ([], {"NOTEBOOK_ARGS": "--ServerApp.allow_origin_pat=.* --ServerApp.allow_credentials=True"},
     "the Jupyter option --ServerApp.allow_origin_pat is refused: other sites' pages could then "
     "use the login cookie"),
    (["-ServerApp.allow_origin=*"], {}, "-ServerApp.allow_origin is refused"),
    (["--ServerApp.allow_credentials", "True"], {}, "--ServerApp.allow_credentials is refused"),
    (["--ServerApp.tornado_settings=allow_origin=*"], {}, "it sets allow_origin, and other sites'"),
    # A server extension named on the command line dropped the image's CVE fix (QA: the
    # nbconvert page's CSP lost its sandbox); the config file's update() keeps both.
    ([], {"NOTEBOOK_ARGS": "--ServerApp.jpserver_extensions=jupyter_lsp=True"},
     "the Jupyter option --ServerApp.jpserver_extensions is refused: on the command line it "
     "replaces every server extension the configuration enables, the image's tfmp_nbconvert_csp"),
    (["-ServerApp.jpserver_extensions", "{'jupyter_lsp': True}"], {},
     "c.ServerApp.jpserver_extensions.update({'NAME': True})"),
])
def test_jupyter_args_refuse_a_weakening_setting_however_it_is_spelled(args, env, words):
    proc = jupyter_args(*args, **env)
    assert proc.returncode == 2, proc.stdout
    assert proc.stdout == "" and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert words in proc.stderr, proc.stderr


def test_jupyter_args_read_single_dash_options_and_harmless_web_settings():
    out = parsed(jupyter_args("-ServerApp.port", "7002", "-ServerApp.base_url=/b/",
                              '--ServerApp.tornado_settings={"headers": {"X-Frame-Options": "DENY"}}',
                              "--ServerApp.tornado_settings=websocket_max_message_size=1e9"))
    assert out[:2] == ["7002", "/b/"]


# --- run-hooks.sh: docker-stacks' hook rules, sourced by entrypoint.sh -------------------------

def test_run_hooks_runs_each_kind_and_gives_the_callers_options_back(tmp_path):
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "10-export.sh").write_text('export FROM_HOOK=yes\necho "unset is ${NOT_SET_ANYWHERE}."\n')
    (hooks / "20-fails.sh").write_text("false\n")
    (hooks / "30-run").write_text("#!/bin/sh\necho ran-executable\nexit 3\n")
    (hooks / "30-run").chmod(0o755)
    (hooks / "40-skip.txt").write_text("not a hook\n")
    script = (f'set -euo pipefail; source {program("run-hooks.sh")} {hooks}; '
              'echo "var=$FROM_HOOK opts=$-"; shopt -o pipefail; x=$(false); echo not-reached')
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert "unset is ." in proc.stdout and "ran-executable" in proc.stdout, proc.stdout
    assert "ERROR hook " + str(hooks / "20-fails.sh") + " exited with status 1" in proc.stderr
    assert "ERROR hook " + str(hooks / "30-run") + " exited with status 3" in proc.stderr
    assert "skipped " + str(hooks / "40-skip.txt") in proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("var="))
    assert line.startswith("var=yes opts=") and "e" in line.split("=")[-1] and "u" in line.split("=")[-1]
    assert "pipefail" in proc.stdout and "on" in proc.stdout.split("pipefail")[-1].split()[0]
    # set -e came back: the failing $(false) ended the shell.
    assert "not-reached" not in proc.stdout and proc.returncode == 1, proc.stdout


def test_run_hooks_needs_exactly_one_folder(tmp_path):
    for args in ("", f"{tmp_path} {tmp_path}", str(tmp_path / "missing")):
        proc = subprocess.run(["bash", "-c", f'source {program("run-hooks.sh")} {args}; echo "rc=$?"'],
                              capture_output=True, text=True, timeout=60)
        assert proc.stdout.strip() == "rc=2", (args, proc.stdout, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1 and "ERROR" in proc.stderr, proc.stderr


# --- entrypoint.sh's caps_missing: CapEff decoded without capsh ---------------------------

@pytest.mark.host_only(reason="the image ships no entrypoint.sh beside tests/")
@pytest.mark.parametrize("cap_eff, missing", [
    ("00000000a80425fb", ""),                        # Docker's default set
    ("0000000000000000", "CHOWN DAC_OVERRIDE SETUID SETGID KILL SYS_CHROOT"),   # --cap-drop ALL
    ("00000000000400e3", ""),                        # the documented minimal set
    ("00000000000000c1", "DAC_OVERRIDE KILL SYS_CHROOT"),   # CHOWN SETUID SETGID
    ("000001ffffffffff", ""),                        # --privileged
    ("not hex", "CHOWN DAC_OVERRIDE SETUID SETGID KILL SYS_CHROOT"),
])
def test_caps_missing_decodes_the_effective_set(cap_eff, missing):
    script = (f"eval \"$(sed -n '/^caps_missing() {{/,/^}}/p' {ROOT / 'entrypoint.sh'})\"; "
              f"caps_missing '{cap_eff}' CHOWN DAC_OVERRIDE SETUID SETGID KILL SYS_CHROOT")
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout == missing, (proc.stdout, proc.stderr)
