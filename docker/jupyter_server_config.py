"""Jupyter Server settings for the training image (/etc/jupyter/).

The token is read from the file entrypoint.sh writes (only the user can read
it) instead of an environment variable or a command-line flag, so it shows up
neither in `ps` nor in the environment of kernels and terminals.
"""
import os

c = get_config()  # noqa: F821 (provided by Jupyter when it loads this file)

c.ServerApp.ip = "0.0.0.0"
c.ServerApp.port = 8888
c.ServerApp.open_browser = False
c.ServerApp.root_dir = "/workspace"
c.ServerApp.allow_root = False
c.ServerApp.allow_remote_access = True
c.ServerApp.terminado_settings = {"shell_command": ["/bin/bash", "-l"]}
# /nbconvert/ pages get `sandbox` in their CSP (CVE-2026-44727; jupyter_server
# on Python 3.8 predates the fix): docker/tfmp_nbconvert_csp.py.
c.ServerApp.jpserver_extensions.update({"tfmp_nbconvert_csp": True})
# A fresh cookie-signing secret at every start, never written to disk: login
# cookies end with the server (jupyter_server < 2.18 keeps one secret file
# forever, CVE-2026-40934).  Changing the token means a restart, so old cookies die.
c.ServerApp.cookie_secret = os.urandom(32)
# Never run without authentication, even if someone passes an empty token.
c.IdentityProvider.token = ""
_token_file = os.environ.get("TFMP_JUPYTER_TOKEN_PATH", "")
if _token_file:
    with open(_token_file, encoding="utf-8") as fh:
        c.IdentityProvider.token = fh.read().strip()
if not c.IdentityProvider.token:
    raise SystemExit("jupyter_server_config: no token; start the server through entrypoint.sh")
