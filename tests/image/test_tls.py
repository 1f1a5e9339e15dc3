"""JupyterLab over TLS (docker/start/serve/08-jupyter-tls.sh), driven from the host.

One container with JUPYTER_TLS=self-signed and a named volume for its certificate carries most
checks: that certificate, taken from the container, is the only CA given to requests,
websocket-client and Chromium; the healthcheck; plain HTTP to the port.  Its tests only look, so
they pass in any order: the restart has a container of its own, and the renewal checks start
on a copy of its volume.  One more container serves a certificate made here with
openssl, as a small CA would make it.  Bad settings stop the start before any server runs, so
each costs a few seconds.  The shared `stack` stays plain HTTP."""
from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import re
import socket
import ssl
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
import websocket

from image_helpers import (REPO, docker_run, exec_in, free_port, health, kernel_execute,
                           kernel_session, run, start_container, wait_until, websocket_tls,
                           websocket_url)
from test_stack import _chromium  # the image tests' one headless-Chromium command line

pytestmark = pytest.mark.docker

HOSTNAMES = "tfmp-tls.test, 10.9.8.7"
SANS = ["DNS:localhost", "DNS:tfmp-tls.test", "IP:10.9.8.7", "IP:127.0.0.1"]
SECRET_TOKEN = "token-from-a-secret-file-0123"
FINGERPRINT = re.compile(r"==> TLS certificate SHA-256 fingerprint: ((?:[0-9A-F]{2}:){31}[0-9A-F]{2})")


# --- helpers ---------------------------------------------------------------------------

def fingerprint_of(pem: str) -> str:
    """SHA-256 of a PEM certificate's DER bytes, as OpenSSL and browsers print it."""
    digest = hashlib.sha256(ssl.PEM_cert_to_DER_cert(pem)).hexdigest().upper()
    return ":".join(digest[i:i + 2] for i in range(0, len(digest), 2))


def served_certificate(port: int) -> str:
    """The certificate the server presents (PEM), fetched without verifying it."""
    return ssl.get_server_certificate(("127.0.0.1", port))


def spki_hash(cert_file: Path) -> str:
    """base64(SHA-256(SubjectPublicKeyInfo)): what Chromium's SPKI allow-list takes."""
    pub = run(["openssl", "x509", "-in", str(cert_file), "-noout", "-pubkey"]).stdout
    der = subprocess.run(["openssl", "pkey", "-pubin", "-outform", "der"], input=pub.encode(),
                         capture_output=True, check=True, timeout=30).stdout
    return base64.b64encode(hashlib.sha256(der).digest()).decode()


def logs_of(name: str) -> str:
    proc = run(["docker", "logs", name], check=False, timeout=60)
    return proc.stdout + proc.stderr


def lines_with(text: str, needle: str) -> list[str]:
    return [line for line in text.splitlines() if needle in line]


def start_serve(name: str, port: int, *args: str, image: str) -> None:
    start_container(name, image, "-p", f"127.0.0.1:{port}:8888", "-e", "ENABLE_SSH=0", *args)


def wait_healthy(name: str, timeout: float = 120) -> None:
    wait_until(lambda: health(name).startswith("healthy"), timeout, interval=0.5,
               what=f"{name} to become healthy ({logs_of(name)[-1500:]})")


def remove(name: str) -> None:
    run(["docker", "rm", "-f", "-v", name], check=False, timeout=60)


@dataclass
class TlsContainer:
    name: str
    port: int
    volume: str
    ca_file: Path    # the container's certificate: the only thing the host trusts
    image: str

    @property
    def base_url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def token(self) -> str:
        return exec_in(self.name, "cat", "/home/tf/.jupyter/token").stdout.strip()

    def headers(self) -> dict:
        return {"Authorization": f"token {self.token()}"}


@contextlib.contextmanager
def self_signed_box(image: str, folder: Path):
    """A serve container with JUPYTER_TLS=self-signed, its certificate in a new named volume;
    removed with the volume at the end.

    BIND_ADDRESS=0.0.0.0 as a user exposing the port would set it: with TLS on, no warning."""
    suffix = uuid.uuid4().hex[:8]
    box = TlsContainer(name=f"tfmp-tls-{suffix}", port=free_port(), volume=f"tfmp-tls-{suffix}",
                       ca_file=folder / "jupyter.crt", image=image)
    try:
        start_serve(box.name, box.port, "-v", f"{box.volume}:/etc/tfmp/tls",
                    "-e", "JUPYTER_TLS=self-signed", "-e", f"JUPYTER_TLS_HOSTNAMES={HOSTNAMES}",
                    "-e", "BIND_ADDRESS=0.0.0.0", image=image)
        wait_healthy(box.name)
        box.ca_file.write_text(exec_in(box.name, "cat", "/etc/tfmp/tls/jupyter.crt").stdout)
        yield box
    finally:
        print(logs_of(box.name)[-3000:])
        remove(box.name)
        run(["docker", "volume", "rm", "-f", box.volume], check=False, timeout=60)


@pytest.fixture(scope="module")
def self_signed(image, tmp_path_factory):
    """The module's shared self-signed container: its tests only look (none restarts or
    removes it, so they pass in any order)."""
    with self_signed_box(image, tmp_path_factory.mktemp("tls")) as box:
        yield box


# --- the self-signed certificate ----------------------------------------------------------

def test_url_is_https_with_the_served_certificates_fingerprint_beside_it(self_signed):
    logs = logs_of(self_signed.name).splitlines()
    urls = [i for i, line in enumerate(logs) if "==> Jupyter URL: " in line]
    assert len(urls) == 1, urls
    token = self_signed.token()
    assert f"==> Jupyter URL: https://127.0.0.1:8888/lab?token={token} " in logs[urls[0]]
    printed = FINGERPRINT.search(logs[urls[0] + 1])
    assert printed, logs[urls[0]:urls[0] + 2]
    assert printed.group(1) == fingerprint_of(self_signed.ca_file.read_text())
    assert printed.group(1) == fingerprint_of(served_certificate(self_signed.port))
    assert lines_with("\n".join(logs), "==> TensorBoard: https://127.0.0.1:8888/tensorboard/")
    made = lines_with("\n".join(logs), "TLS: made a new self-signed certificate for")
    assert len(made) == 1 and " ".join(SANS) in made[0], made
    # TLS is on: BIND_ADDRESS=0.0.0.0 is no reason to warn.
    assert not lines_with("\n".join(logs), "clear text")


def test_certificate_names_and_key_files(self_signed):
    text = run(["openssl", "x509", "-in", str(self_signed.ca_file), "-noout", "-ext",
                "subjectAltName,basicConstraints,extendedKeyUsage"]).stdout
    for san in ("DNS:localhost", "DNS:tfmp-tls.test", "IP Address:10.9.8.7", "IP Address:127.0.0.1"):
        assert san in text, text
    assert "CA:FALSE" in text and "TLS Web Server Authentication" in text, text
    # The kept key is root's; the server reads its own copy, readable by tf only.
    kept = exec_in(self_signed.name, "stat", "-c", "%a %U", "/etc/tfmp/tls/jupyter.key").stdout
    served = exec_in(self_signed.name, "stat", "-c", "%a %U", "/run/tfmp/tls/jupyter.key").stdout
    assert kept.split() == ["600", "root"] and served.split() == ["600", "tf"], (kept, served)


def test_the_certificate_is_the_only_trust_needed_and_the_cookie_is_secure(self_signed):
    ca = str(self_signed.ca_file)
    for host in ("127.0.0.1", "localhost"):   # both are in its subjectAltName
        resp = requests.get(f"https://{host}:{self_signed.port}/api/status",
                            headers=self_signed.headers(), verify=ca, timeout=30)
        assert resp.status_code == 200, resp.text[:200]
    # Against the system's CAs the same request fails: the check above really verified.
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(self_signed.base_url + "/api/status", timeout=30)
    session = requests.Session()
    resp = session.get(f"{self_signed.base_url}/lab?token={self_signed.token()}", verify=ca,
                       timeout=60)
    assert resp.status_code == 200 and "jupyter" in resp.text.lower()
    login = [c for c in session.cookies if c.name.startswith("username-")]
    assert login and all(c.secure for c in login), [(c.name, c.secure) for c in session.cookies]


def test_plain_http_to_the_tls_port_gets_no_page_and_no_token(self_signed):
    token = self_signed.token()
    with socket.create_connection(("127.0.0.1", self_signed.port), timeout=15) as sock:
        sock.sendall(f"GET /lab?token={token} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except (ConnectionResetError, socket.timeout):
            pass
    assert not answer.startswith(b"HTTP/"), answer[:200]
    assert b"<html" not in answer.lower() and token.encode() not in answer, answer[:200]
    assert b"location" not in answer.lower(), answer[:200]   # no redirect to https either
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(f"http://127.0.0.1:{self_signed.port}/api/status", timeout=15)


def test_healthcheck_reports_healthy_over_tls(self_signed):
    assert health(self_signed.name) == "healthy|running"
    out = exec_in(self_signed.name, "python3", "/usr/local/bin/tfmp-healthcheck").stdout
    assert out.strip() == "healthy: jupyter", out
    services = json.loads(exec_in(self_signed.name, "cat", "/run/tfmp/services").stdout)
    # Root's copy: the healthcheck (root) never reads the user's /run/tfmp/tls.
    assert services["jupyter"]["certfile"] == "/run/tfmp/jupyter-pin.crt", services
    owner = exec_in(self_signed.name, "stat", "-c", "%U %a", "/run/tfmp/jupyter-pin.crt").stdout
    assert owner.split() == ["root", "644"], owner


def test_kernel_and_terminal_over_wss(self_signed):
    text, errors = kernel_execute(self_signed.base_url, self_signed.token(),
                                  "import tensorflow as tf; print('TLS', 6 * 7, tf.__version__)",
                                  ca_file=self_signed.ca_file)
    assert not errors, errors
    assert text.startswith("TLS 42 2.9"), text
    ca = str(self_signed.ca_file)
    resp = requests.post(self_signed.base_url + "/api/terminals", headers=self_signed.headers(),
                         verify=ca, timeout=30)
    assert resp.status_code == 200, resp.text[:200]
    term = resp.json()["name"]
    ws = websocket.create_connection(
        f"{websocket_url(self_signed.base_url)}/terminals/websocket/{term}",
        header=[f"Authorization: token {self_signed.token()}"], timeout=60,
        sslopt=websocket_tls(self_signed.ca_file))
    try:
        ws.send(json.dumps(["stdin", "echo tls-$((6 * 7))\r"]))
        seen = []

        def echoed():
            msg = json.loads(ws.recv())
            if msg[0] == "stdout":
                seen.append(msg[1])
            return "tls-42" in "".join(seen)

        wait_until(echoed, timeout=60, interval=0, what="the terminal's answer over wss://")
    finally:
        ws.close()
        requests.delete(f"{self_signed.base_url}/api/terminals/{term}",
                        headers=self_signed.headers(), verify=ca, timeout=30)


def test_tensorboard_and_the_magic_over_tls(self_signed):
    ca = str(self_signed.ca_file)
    resp = requests.get(self_signed.base_url + "/tensorboard/", headers=self_signed.headers(),
                        verify=ca, timeout=120)
    assert resp.status_code == 200 and "tensorboard" in resp.text.lower(), resp.text[:300]
    code = "%load_ext tensorboard\n%tensorboard --logdir /workspace/runs\n"
    with kernel_session(self_signed.base_url, self_signed.token(), code, timeout=240,
                        ca_file=self_signed.ca_file) as messages:
        errors = ["\n".join(m["content"]["traceback"]) for m in messages if m["msg_type"] == "error"]
        assert not errors, errors
        html = "\n".join(m["content"].get("data", {}).get("text/html", "") for m in messages
                         if m["msg_type"] in ("display_data", "update_display_data",
                                              "execute_result"))
        # A path, not a URL: the frame loads from the page's own https origin.
        found = re.search(r'"/proxy/(\d+)/"', html)
        assert found, html[-1000:]
        frame = requests.get(f"{self_signed.base_url}/proxy/{found.group(1)}/",
                             headers=self_signed.headers(), verify=ca, timeout=60)
        assert frame.status_code == 200 and "tensorboard" in frame.text.lower(), frame.text[:300]


def test_chromium_shows_jupyterlab_over_https(self_signed, tmp_path):
    """Chromium is told to accept this certificate's key only (its SPKI allow-list), not to
    ignore certificate errors; without that it shows no JupyterLab."""
    url = f"{self_signed.base_url}/lab?token={self_signed.token()}"
    trust = f"--ignore-certificate-errors-spki-list={spki_hash(self_signed.ca_file)}"
    dom = _chromium(trust, "--dump-dom", url, user_data=tmp_path / "profile-dom")
    assert "jp-Launcher" in dom.stdout, dom.stdout[-2000:] + dom.stderr[-2000:]
    shot = tmp_path / "lab-https.png"
    _chromium(trust, f"--screenshot={shot}", url, user_data=tmp_path / "profile-shot")
    from PIL import Image

    with Image.open(shot) as img:
        assert img.size == (1280, 800)
        assert len(img.convert("RGB").getcolors(maxcolors=1_000_000) or []) > 20, "blank page"
    keep = os.environ.get("TFMP_SCREENSHOT_DIR")
    if keep:
        Path(keep, "jupyterlab-https.png").write_bytes(shot.read_bytes())
    untrusted = _chromium("--dump-dom", url, user_data=tmp_path / "profile-untrusted")
    assert "jp-Launcher" not in untrusted.stdout


def test_fingerprint_is_unchanged_after_a_restart(image, tmp_path):
    # A container of its own: the restart would change what the shared one's logs show.
    with self_signed_box(image, tmp_path) as own:
        before = fingerprint_of(served_certificate(own.port))
        run(["docker", "restart", "-t", "10", own.name], timeout=120)
        wait_healthy(own.name)
        logs = logs_of(own.name)
        printed = FINGERPRINT.findall(logs)
        assert printed == [before, before], printed
        assert fingerprint_of(served_certificate(own.port)) == before
    assert len(lines_with(logs, "TLS: reusing the self-signed certificate")) == 1
    assert len(lines_with(logs, "TLS: made a new self-signed certificate")) == 1


def _start_and_read_tls_line(image: str, volume: str, hostnames: str) -> tuple[str, str]:
    """Starts serve on the volume; returns its 'TLS: ...' line and the printed fingerprint."""
    name = f"tfmp-tls-{uuid.uuid4().hex[:8]}"
    try:
        start_serve(name, free_port(), "-v", f"{volume}:/etc/tfmp/tls", "-e",
                    "JUPYTER_TLS=self-signed", "-e", f"JUPYTER_TLS_HOSTNAMES={hostnames}",
                    image=image)
        found = wait_until(lambda: FINGERPRINT.search(logs_of(name)), timeout=120, interval=0.5,
                           what=f"{name}'s fingerprint line")
        tls = lines_with(logs_of(name), "TLS: ")
        assert len(tls) == 1, tls
        return tls[0], found.group(1)
    finally:
        remove(name)


@pytest.fixture
def kept_volume(self_signed):
    """A new volume holding a copy of the shared container's kept certificate (that container
    and its volume stay as they are for the other tests); removed at the end."""
    volume = f"tfmp-tls-kept-{uuid.uuid4().hex[:8]}"
    try:
        run(["docker", "run", "--rm", "-v", f"{self_signed.volume}:/kept:ro", "-v",
             f"{volume}:/etc/tfmp/tls", "--entrypoint", "bash", self_signed.image, "-c",
             "cp -a /kept/. /etc/tfmp/tls/"], timeout=60)
        yield volume
    finally:
        run(["docker", "volume", "rm", "-f", volume], check=False, timeout=60)


def test_kept_certificate_is_made_again_when_names_change_or_its_end_nears(self_signed,
                                                                          kept_volume):
    kept = fingerprint_of(self_signed.ca_file.read_text())
    line, changed = _start_and_read_tls_line(self_signed.image, kept_volume, "tfmp-other.test")
    assert "JUPYTER_TLS_HOSTNAMES changed: the kept one is for " + " ".join(SANS) in line, line
    assert "made a new self-signed certificate for DNS:localhost DNS:tfmp-other.test IP:127.0.0.1" in line
    assert changed != kept
    # A kept certificate that ends tomorrow (made here, as an old start would have left it).
    make = ("cd /etc/tfmp/tls && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1"
            " -nodes -days 1 -subj /CN=old -addext subjectAltName=DNS:localhost,IP:127.0.0.1"
            " -keyout jupyter.key -out jupyter.crt 2>/dev/null")
    run(["docker", "run", "--rm", "-v", f"{kept_volume}:/etc/tfmp/tls", "--entrypoint",
         "bash", self_signed.image, "-c", make], timeout=60)
    line, renewed = _start_and_read_tls_line(self_signed.image, kept_volume, "")
    assert "made a new self-signed certificate" in line and "(the kept one expires on " in line, line


# --- the user's own certificate --------------------------------------------------------------

@pytest.fixture(scope="module")
def user_certs(tmp_path_factory) -> Path:
    """A CA, a server certificate it signed for `localhost` only (not 127.0.0.1: the
    healthcheck must not depend on it), the full chain, a key of another pair, and a file
    that is no certificate.  Keys mode 600 and, as the tests run as root, root's."""
    d = tmp_path_factory.mktemp("certs")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run(["openssl", "req", "-x509", *ec, "-days", "30", "-subj", "/CN=tfmp test CA",
         "-keyout", str(d / "ca.key"), "-out", str(d / "ca.crt")])
    run(["openssl", "req", *ec, "-subj", "/CN=localhost", "-keyout", str(d / "server.key"),
         "-out", str(d / "server.csr")])
    (d / "server.ext").write_text("basicConstraints=critical,CA:FALSE\n"
                                  "extendedKeyUsage=serverAuth\nsubjectAltName=DNS:localhost\n")
    run(["openssl", "x509", "-req", "-in", str(d / "server.csr"), "-CA", str(d / "ca.crt"),
         "-CAkey", str(d / "ca.key"), "-CAcreateserial", "-days", "30",
         "-extfile", str(d / "server.ext"), "-out", str(d / "server.crt")])
    # As `openssl pkcs12 -nokeys` writes it from a certificate its user named with a non-ASCII
    # friendly name: text before the PEM block, in UTF-8 (issue 24, item 9: the healthcheck
    # read the file as ASCII, and the container stayed unhealthy).
    (d / "fullchain.pem").write_bytes(
        "Bag Attributes\n    friendlyName: Jupyter-Zertifikat für München ✓\n"
        "subject=CN = localhost\n".encode("utf-8")
        + (d / "server.crt").read_bytes() + (d / "ca.crt").read_bytes())
    # A token from a secret file: the log then shows the URL without it (JUPYTER_LOG_TOKEN's
    # default with JUPYTER_TOKEN_FILE; issue 24, item 12).
    (d / "token.txt").write_text(SECRET_TOKEN + "\n")
    run(["openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-out", str(d / "other.key")])
    (d / "not-a-cert.pem").write_text("hello\n")
    # Accepted by openssl's own checks, refused by Python's ssl (OpenSSL's security level 2,
    # the default of the stand-in's Debian and of Ubuntu 20.04), which is what the server uses.
    run(["openssl", "req", "-x509", "-newkey", "rsa:1024", "-nodes", "-days", "30",
         "-subj", "/CN=localhost", "-keyout", str(d / "weak.key"), "-out", str(d / "weak.crt")])
    for key in d.glob("*.key"):
        key.chmod(0o600)
    d.chmod(0o755)
    return d


def test_own_certificate_is_served_and_trusted_through_its_ca(image, user_certs, container):
    """The user's certificate (a non-ASCII friendly name before it), with the token from a
    secret file: healthy, the token kept out of the log."""
    port = free_port()
    name = container("-p", f"127.0.0.1:{port}:8888", "-v", f"{user_certs}:/certs:ro",
                     "-e", "ENABLE_SSH=0", "-e", "JUPYTER_CERTFILE=/certs/fullchain.pem",
                     "-e", "JUPYTER_KEYFILE=/certs/server.key",
                     "-e", "JUPYTER_TOKEN_FILE=/certs/token.txt")
    wait_healthy(name)   # over https to 127.0.0.1, which this certificate does not name
    token = exec_in(name, "cat", "/home/tf/.jupyter/token").stdout.strip()
    assert token == SECRET_TOKEN
    resp = requests.get(f"https://localhost:{port}/api/status", verify=str(user_certs / "ca.crt"),
                        headers={"Authorization": f"token {token}"}, timeout=30)
    assert resp.status_code == 200, resp.text[:200]
    logs = logs_of(name)
    printed = FINGERPRINT.findall(logs)
    assert printed == [fingerprint_of((user_certs / "server.crt").read_text())], printed
    # The healthcheck pins root's copy of the certificate it was given.
    services = json.loads(exec_in(name, "cat", "/run/tfmp/services").stdout)
    assert services["jupyter"]["certfile"] == "/run/tfmp/jupyter-pin.crt", services
    # JUPYTER_LOG_TOKEN's default with a token file: one line, the URL without the token and
    # where the token is; the token nowhere in the log.
    urls = lines_with(logs, "==> Jupyter URL: ")
    assert len(urls) == 1, urls
    assert urls[0].endswith("==> Jupyter URL: https://127.0.0.1:8888/lab   (token not logged, "
                            "JUPYTER_LOG_TOKEN=0: it is in JUPYTER_TOKEN_FILE='/certs/token.txt' "
                            "and /home/tf/.jupyter/token; open "
                            "https://127.0.0.1:8888/lab?token=<token>)"), urls
    assert SECRET_TOKEN not in logs


BAD_SETTINGS = {
    "missing certificate": (["JUPYTER_CERTFILE=/certs/nowhere.pem", "JUPYTER_KEYFILE=/certs/server.key"],
                            "JUPYTER_CERTFILE='/certs/nowhere.pem' does not exist"),
    "not a certificate": (["JUPYTER_CERTFILE=/certs/not-a-cert.pem", "JUPYTER_KEYFILE=/certs/server.key"],
                          "JUPYTER_CERTFILE='/certs/not-a-cert.pem' holds no PEM certificate"),
    "mismatched key": (["JUPYTER_CERTFILE=/certs/server.crt", "JUPYTER_KEYFILE=/certs/other.key"],
                       "JUPYTER_KEYFILE='/certs/other.key' is not the private key of JUPYTER_CERTFILE"),
    "certificate without key": (["JUPYTER_CERTFILE=/certs/server.crt"],
                                "JUPYTER_CERTFILE is set without JUPYTER_KEYFILE"),
    "key without certificate": (["JUPYTER_KEYFILE=/certs/server.key"],
                                "JUPYTER_KEYFILE is set without JUPYTER_CERTFILE"),
    "key too weak for the server": (["JUPYTER_CERTFILE=/certs/weak.crt", "JUPYTER_KEYFILE=/certs/weak.key"],
                                    "JUPYTER_CERTFILE/JUPYTER_KEYFILE: Python's ssl refuses the certificate and key"),
    "key in the home": (["JUPYTER_CERTFILE=/certs/server.crt", "JUPYTER_KEYFILE=/home/tf/server.key"],
                        "JUPYTER_KEYFILE='/home/tf/server.key' is in /home/tf, which the user controls"),
    "bad JUPYTER_TLS": (["JUPYTER_TLS=yes"], "JUPYTER_TLS must be self-signed or off"),
    "both kinds": (["JUPYTER_TLS=self-signed", "JUPYTER_CERTFILE=/certs/server.crt",
                    "JUPYTER_KEYFILE=/certs/server.key"],
                   "JUPYTER_TLS=self-signed and JUPYTER_CERTFILE/JUPYTER_KEYFILE are both set"),
    "bad host name": (["JUPYTER_TLS=self-signed", "JUPYTER_TLS_HOSTNAMES=gpu-box,bad_name!"],
                      "JUPYTER_TLS_HOSTNAMES: 'bad_name!' is neither a host name nor an IP address"),
}


@pytest.mark.parametrize("case", list(BAD_SETTINGS))
def test_a_bad_setting_stops_the_start_with_one_fatal_line(image, user_certs, case):
    env, says = BAD_SETTINGS[case]
    args = ["-v", f"{user_certs}:/certs:ro", "-e", "ENABLE_SSH=0"]
    for item in env:
        args += ["-e", item]
    proc = docker_run(image, *args, command=["serve"], timeout=120)
    fatal = lines_with(proc.stderr, " FATAL ")
    assert proc.returncode == 64 and len(fatal) == 1, (proc.returncode, proc.stderr[-2000:])
    assert says in fatal[0], fatal[0]
    assert "Jupyter URL" not in proc.stderr


def test_a_key_the_user_cannot_read_stops_the_start(image, user_certs):
    """Under --user the key must be readable by that UID (a root start copies it for tf)."""
    proc = docker_run(image, "--user", "4321:4321", "-v", f"{user_certs}:/certs:ro",
                      "-e", "JUPYTER_CERTFILE=/certs/server.crt",
                      "-e", "JUPYTER_KEYFILE=/certs/server.key", command=["serve"], timeout=120)
    fatal = lines_with(proc.stderr, " FATAL ")
    assert proc.returncode == 64 and len(fatal) == 1, proc.stderr[-2000:]
    assert "JUPYTER_KEYFILE='/certs/server.key' is not readable by UID 4321" in fatal[0], fatal


# --- without TLS ----------------------------------------------------------------------------

@pytest.mark.parametrize("address, warnings", [("0.0.0.0", 1), ("127.0.0.1", 0)])
def test_bind_address_beyond_loopback_without_tls_warns_once(image, address, warnings):
    # A token with a space stops the start right after the TLS part: no server is started.
    proc = docker_run(image, "-e", f"BIND_ADDRESS={address}", "-e", "ENABLE_SSH=0",
                      "-e", "JUPYTER_TOKEN=not valid", command=["serve"], timeout=120)
    assert proc.returncode == 64, proc.stderr[-2000:]
    warned = lines_with(proc.stderr, "clear text")
    assert len(warned) == warnings, warned
    if warned:
        assert " WARN " in warned[0] and f"BIND_ADDRESS={address}" in warned[0]
        assert "JUPYTER_TLS=self-signed" in warned[0] and "SSH tunnel" in warned[0]


def test_compose_passes_the_tls_settings_and_keeps_the_certificate_in_a_volume():
    env = dict(os.environ, BIND_ADDRESS="0.0.0.0", JUPYTER_TLS="self-signed",
               JUPYTER_TLS_HOSTNAMES="gpu-box.example.org", COMPOSE_PROJECT_NAME="tfmp-tls-config")
    out = run(["docker", "compose", "-f", str(REPO / "docker-compose.yml"), "config",
               "--format", "json"], env=env, timeout=60).stdout
    service = json.loads(out)["services"]["tfmp"]
    assert service["environment"]["BIND_ADDRESS"] == "0.0.0.0"
    assert service["environment"]["JUPYTER_TLS"] == "self-signed"
    assert service["environment"]["JUPYTER_TLS_HOSTNAMES"] == "gpu-box.example.org"
    mounts = {v["target"]: v for v in service["volumes"]}
    assert mounts["/etc/tfmp/tls"]["type"] == "volume", mounts
