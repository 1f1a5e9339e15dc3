"""Jupyter Server settings for the training image (/etc/jupyter/).

The token is read from the file entrypoint.sh writes (only the user can read
it) instead of an environment variable or a command-line flag, so it shows up
neither in `ps` nor in the environment of kernels and terminals.

Under JupyterHub (docker/start/serve/10-jupyter.sh runs `jupyterhub-singleuser` with
TFMP_JUPYTER_MODE=jupyterhub) the hub authenticates and gives the address, port and base
URL (JUPYTERHUB_SERVICE_URL, JUPYTERHUB_SERVICE_PREFIX): none of them is set here.
"""
import os

c = get_config()  # noqa: F821 (provided by Jupyter when it loads this file)

_hub = os.environ.get("TFMP_JUPYTER_MODE") == "jupyterhub"
if not _hub:
    # "": every address of the container, IPv4 and IPv6 (where it has IPv6) alike.
    c.ServerApp.ip = ""
    # JUPYTER_PORT (docker-stacks' name), checked by the entrypoint; a --port wins.
    c.ServerApp.port = int(os.environ.get("TFMP_JUPYTER_PORT") or 8888)
c.ServerApp.open_browser = False
c.ServerApp.root_dir = "/workspace"
c.ServerApp.allow_root = False
c.ServerApp.allow_remote_access = True
c.ServerApp.terminado_settings = {"shell_command": ["/bin/bash", "-l"]}
# /nbconvert/ pages get `sandbox` in their CSP (CVE-2026-44727; jupyter_server
# on Python 3.8 predates the fix): docker/python/tfmp_nbconvert_csp.py.
c.ServerApp.jpserver_extensions.update({"tfmp_nbconvert_csp": True})
# A fresh cookie-signing secret at every start, never written to disk: login
# cookies end with the server (jupyter_server < 2.18 keeps one secret file
# forever, CVE-2026-40934).  Changing the token means a restart, so old cookies die.
c.ServerApp.cookie_secret = os.urandom(32)
# The login page says where this image's token is: docker/config/jupyter-templates/login.html
# extends jupyter_server's own page, reached as templates/login.html through the package's
# folder (the same name in the first folder would only find itself).
import jupyter_server  # noqa: E402

c.ServerApp.extra_template_paths = ["/usr/local/share/tfmp/jupyter-templates",
                                    os.path.dirname(jupyter_server.__file__)]
# Never run without authentication, even if someone passes an empty token.  Under the hub
# the hub's OAuth is the authentication, and a `jupyter lab` a user starts there in a terminal
# keeps Jupyter's own random token.
if not _hub:
    # The file entrypoint.sh wrote, read as the identity provider the start names on the
    # server's command line reads it (docker/python/tfmp_token_auth.py): no token, no server.
    # A `jupyter lab` run by hand has neither, and stops here.
    from tfmp_token_auth import image_token

    c.IdentityProvider.token = image_token()

# TLS: the certificate and key copies docker/start/serve/08-jupyter-tls.sh made for this user.
# Tornado then speaks only TLS on 8888: a plain-HTTP request fails its handshake and the
# connection is closed without an answer (no page, no redirect carrying the token).
_certfile = os.environ.get("TFMP_JUPYTER_CERTFILE", "")
if _certfile:
    c.ServerApp.certfile = _certfile
    c.ServerApp.keyfile = os.environ["TFMP_JUPYTER_KEYFILE"]

# --- TensorBoard, behind the token (jupyter-server-proxy) ---------------------------
# A named server: a "TensorBoard" tile in JupyterLab's launcher, and the first request to
# <base_url>/tensorboard/ starts it (tfmp-tensorboard: 127.0.0.1 only, on a free port the
# proxy picks, over $TFMP_TENSORBOARD_LOGDIR or <workspace>/runs).  Every request and
# websocket to it passes Jupyter's authentication; TensorBoard has no port of its own
# outside the container.
_TENSORBOARD = {
    "command": ["/usr/local/bin/tfmp-tensorboard", "--port", "{port}"],
    # Seconds to wait for the first answer; it comes in 1-5 s on 2 cores.
    "timeout": 60,
    # Opens as a JupyterLab tab beside the notebooks rather than a new browser tab.
    "new_browser_tab": False,
    "launcher_entry": {
        "title": "TensorBoard",
        "icon_path": "/usr/local/share/tfmp/tensorboard-icon.svg",
        "category": "Other",
    },
}


def _quick_ready_server(name, settings):
    """The named server, noticing sooner that TensorBoard is up.

    The proxy asks "is it up yet?" with doubling pauses (0.01 s, 0.02 s, ...), so asks fall at
    about 2.6, 5.1 and 10.2 s: a TensorBoard ready after 5.2 s was first shown after 10.2 s.
    Here each ask keeps trying every 0.2 s for up to 4 s (the proxy gives one ask 5 s), so the
    first page follows TensorBoard's start by at most ~0.2 s.  Uses a method of
    jupyter-server-proxy 4.x (pinned <5); without it, the proxy's own timing is kept.
    """
    import asyncio
    import time

    from jupyter_server_proxy.config import ServerProcess

    class QuickReadyServerProcess(ServerProcess):
        def get_proxy_base_class(self):
            base, kwargs = super().get_proxy_base_class()
            if base is None or not hasattr(base, "_http_ready_func"):
                return base, kwargs

            class QuickReadyHandler(base):
                async def _http_ready_func(self, p):
                    deadline = time.monotonic() + 4.0
                    while not await super()._http_ready_func(p):
                        if time.monotonic() > deadline:
                            return False
                        await asyncio.sleep(0.2)
                    return True

            return QuickReadyHandler, kwargs

    return QuickReadyServerProcess(name=name, **settings)


# --- The GPU view, behind the token --------------------------------------------------------
# A "GPU" tile: utilisation, memory per process, temperature and power of each GPU (NVML),
# redrawn every 2 s; "no GPU" and why on a box without one.  tfmp-gpu-view: 127.0.0.1 only,
# started on the first request to <base_url>/gpu/.
_GPU_VIEW = {
    "command": ["/usr/local/bin/tfmp-gpu-view", "--port", "{port}"],
    "timeout": 30,
    "new_browser_tab": False,
    "launcher_entry": {
        "title": "GPU",
        "icon_path": "/usr/local/share/tfmp/gpu-icon.svg",
        "category": "Other",
    },
}

try:
    c.ServerProxy.servers = {"tensorboard": _quick_ready_server("tensorboard", _TENSORBOARD),
                             "gpu": _quick_ready_server("gpu", _GPU_VIEW)}
except ImportError:  # jupyter-server-proxy is missing or changed: plain settings still work
    c.ServerProxy.servers = {"tensorboard": _TENSORBOARD, "gpu": _GPU_VIEW}

# `%tensorboard` in notebooks starts its own TensorBoard on a port inside the container and
# shows it in an iframe.  Without this the iframe would ask the browser's host for that
# port, which is not published; with it, the frame loads <base_url>/proxy/<port>/, through
# Jupyter and its token.  Set here, in the server's environment, so every kernel inherits it.
# The base URL comes from the entrypoint, which read it from the server's options
# (--ServerApp.base_url) or the hub's prefix: a command-line option is not in `c` yet here.
_base = (os.environ.get("TFMP_JUPYTER_BASE_URL")
         or (c.ServerApp.base_url if "base_url" in c.ServerApp else "/")).strip("/")
os.environ.setdefault("TENSORBOARD_PROXY_URL", f"/{_base}/proxy/%PORT%/" if _base else "/proxy/%PORT%/")
# Its TensorBoard is tfmp-tensorboard, which starts without TensorFlow for local folders
# (up in 1.5-3.5 s on 2 cores, where importing TensorFlow first took 5-11 s; the magic waits
# 60 s at most, and a box busy training makes that import slower still).  `%env TENSORBOARD_BINARY=tensorboard` in a notebook gives the full feature set.
os.environ.setdefault("TENSORBOARD_BINARY", "/usr/local/bin/tfmp-tensorboard")
