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
