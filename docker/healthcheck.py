#!/usr/bin/env python3
"""HEALTHCHECK: ask JupyterLab's API and sshd themselves.

Healthy when GET /api/status answers 200 with the token (so authentication
works too) and sshd on port 22 greets with an SSH banner.  Services the
entrypoint did not start (batch jobs, SSH disabled) are read from
/run/tfmp/services and skipped.

With TLS on (a "certfile" beside the token file) the question goes over https,
and the certificate the server presents must be that file's: the token is sent
only to the server the entrypoint configured.  The certificate is pinned rather
than verified by name because a user's own certificate need not name 127.0.0.1.
Both files it reads are root's (/run/tfmp, written at start): it runs as root, and
never reads a file the user could replace with a link to another.
"""
import hashlib
import http.client
import json
import socket
import ssl
import sys

STATE = "/run/tfmp/services"
PORT = 8888


def _pinned_context(certfile: str):
    """A TLS context that accepts any certificate (checked by its hash afterwards)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    # Bytes: text around the PEM blocks may be in any encoding (`openssl pkcs12` writes a
    # "friendlyName" as the user named the certificate, e.g. in UTF-8), and openssl and
    # the server skip it; only the base64 block itself is ASCII.
    with open(certfile, "rb") as fh:
        pem = fh.read()
    # The first certificate of the file is the server's own; any others are its chain.
    begin = pem.index(b"-----BEGIN CERTIFICATE-----")
    end = pem.index(b"-----END CERTIFICATE-----", begin) + len(b"-----END CERTIFICATE-----")
    first = pem[begin:end].decode("ascii")
    return ctx, hashlib.sha256(ssl.PEM_cert_to_DER_cert(first)).hexdigest()


def jupyter_status(token: str, certfile: str = "") -> str:
    """"" when /api/status answers 200 with the token, else what went wrong."""
    if certfile:
        ctx, expected = _pinned_context(certfile)
        conn = http.client.HTTPSConnection("127.0.0.1", PORT, timeout=3, context=ctx)
    else:
        conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=3)
    try:
        conn.connect()
        if certfile:
            served = hashlib.sha256(conn.sock.getpeercert(binary_form=True)).hexdigest()
            if served != expected:
                return f"the server presents a certificate other than {certfile}"
        conn.request("GET", "/api/status", headers={"Authorization": "token " + token})
        resp = conn.getresponse()
        resp.read()
        return "" if resp.status == 200 else f"answered {resp.status}"
    finally:
        conn.close()


def main() -> int:
    try:
        with open(STATE, encoding="utf-8") as fh:
            services = json.load(fh)
    except OSError:
        print("unhealthy: not in serve mode (no /run/tfmp/services)")
        return 1
    if "jupyter" in services:
        with open(services["jupyter"]["token_file"], encoding="utf-8") as fh:
            token = fh.read().strip()
        try:
            problem = jupyter_status(token, services["jupyter"].get("certfile", ""))
        except Exception as exc:  # any failure is "unhealthy", with the reason
            problem = str(exc) or type(exc).__name__
        if problem:
            print(f"unhealthy: jupyter /api/status: {problem}")
            return 1
    if "sshd" in services:
        try:
            with socket.create_connection(("127.0.0.1", 22), timeout=3) as sock:
                # Identify ourselves like a client: sshd then logs one
                # "[preauth]" line that entrypoint.sh filters from the logs.
                sock.sendall(b"SSH-2.0-tfmp-healthcheck\r\n")
                banner = sock.recv(64)
        except OSError as exc:
            print(f"unhealthy: sshd: {exc}")
            return 1
        if not banner.startswith(b"SSH-2.0-"):
            print(f"unhealthy: sshd greeted with {banner!r}")
            return 1
    print("healthy: " + ", ".join(sorted(services)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
