"""The image under a real JupyterHub on this machine: the hub (`jupyterhub`, `dockerspawner`
from PyPI, its proxy `configurable-http-proxy` from npm; .ci/run installs all three) spawns
the image with DockerSpawner, a user logs in through the hub with a password
(DummyAuthenticator), and a cell runs in a kernel of that user's server, reached through the
hub's proxy with the hub's OAuth cookie: no Jupyter token anywhere.

The spawned container uses the host's network, so every connection (hub, proxy, the
single-user server, the server's calls to the hub's API) stays on 127.0.0.1.  The
DockerSpawner and KubeSpawner snippets in docs/image.md ("Under JupyterHub") use a bridge
network as a real hub does; the container's side is the same."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import textwrap
import uuid
from pathlib import Path

import pytest
import requests
import websocket

from image_helpers import REPO, free_port, run, wait_until

pytestmark = pytest.mark.docker

USER, PASSWORD = "ann", "hub-test-password-1"


def _need(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.fail(f"{tool} is not installed on this host (.ci/run installs it)")
    return path


@pytest.fixture(scope="module")
def hub(image, tmp_path_factory):
    """A JupyterHub on 127.0.0.1 with DockerSpawner and the test image; yields its URL."""
    _need("jupyterhub")
    _need("configurable-http-proxy")
    try:
        import dockerspawner  # noqa: F401
    except ImportError:
        pytest.fail("dockerspawner is not installed on this host (.ci/run installs it)")
    folder = tmp_path_factory.mktemp("hub")
    port, hub_port, api_port, user_port = free_port(), free_port(), free_port(), free_port()
    prefix = f"tfmp-hub-{uuid.uuid4().hex[:8]}"
    (folder / "jupyterhub_config.py").write_text(textwrap.dedent(f"""
        from dockerspawner import DockerSpawner

        class HostNetworkSpawner(DockerSpawner):
            # The container shares the host's network: the server is on 127.0.0.1:{user_port}.
            async def get_ip_and_port(self):
                return "127.0.0.1", self.port

        c = get_config()
        c.JupyterHub.bind_url = "http://127.0.0.1:{port}"
        c.JupyterHub.hub_ip = "127.0.0.1"
        c.JupyterHub.hub_port = {hub_port}
        c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{api_port}"
        c.JupyterHub.db_url = "sqlite:///{folder}/jupyterhub.sqlite"
        c.JupyterHub.cookie_secret_file = "{folder}/cookie_secret"
        c.ConfigurableHTTPProxy.pid_file = "{folder}/proxy.pid"
        c.JupyterHub.authenticator_class = "dummy"
        c.DummyAuthenticator.password = "{PASSWORD}"  # (SharedPasswordAuthenticator from 5.3 on)
        c.Authenticator.allowed_users = {{"{USER}"}}
        c.JupyterHub.spawner_class = HostNetworkSpawner
        c.DockerSpawner.image = "{image}"
        c.DockerSpawner.network_name = "host"
        c.DockerSpawner.extra_host_config = {{"network_mode": "host"}}
        c.DockerSpawner.use_internal_ip = True  # no port bindings: host networking has none
        c.DockerSpawner.ip = "127.0.0.1"
        c.DockerSpawner.port = {user_port}
        c.DockerSpawner.prefix = "{prefix}"
        c.DockerSpawner.remove = True
        c.DockerSpawner.environment = {{"TF_CPP_MIN_LOG_LEVEL": "2"}}
        c.Spawner.start_timeout = 180
        c.Spawner.http_timeout = 150
    """))
    log = open(folder / "hub.log", "w")
    proc = subprocess.Popen(["jupyterhub", "-f", str(folder / "jupyterhub_config.py")],
                            cwd=folder, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: requests.get(url + "/hub/health", timeout=5).status_code == 200,
                   timeout=90, interval=0.5, what="JupyterHub to answer /hub/health")
        yield {"url": url, "prefix": prefix, "log": folder / "hub.log"}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
        log.close()
        print((folder / "hub.log").read_text()[-4000:])
        names = run(["docker", "ps", "-aq", "--filter", f"name={prefix}"], check=False).stdout.split()
        for cid in names:
            print(run(["docker", "logs", "--tail", "40", cid], check=False).stderr[-3000:])
            run(["docker", "rm", "-f", "-v", cid], check=False, timeout=60)


def _xsrf(session: requests.Session, path: str) -> str:
    return next(c.value for c in session.cookies if c.name == "_xsrf" and path.startswith(c.path))


def test_hub_spawns_the_image_and_a_user_runs_a_cell_through_it(hub):
    url, s = hub["url"], requests.Session()
    # Log in with the password, as the browser's form does.
    page = s.get(url + "/hub/login", timeout=30)
    assert page.status_code == 200, page.text[:300]
    resp = s.post(url + "/hub/login?next=", timeout=60, allow_redirects=False,
                  data={"username": USER, "password": PASSWORD, "_xsrf": _xsrf(s, "/hub/")})
    assert resp.status_code == 302, (resp.status_code, resp.text[:300])
    wrong = requests.post(url + "/hub/login", data={"username": USER, "password": "nope"},
                          timeout=30, allow_redirects=False)
    assert wrong.status_code != 302, "a wrong password logged in"
    # Start the server (the spawn page does this) and wait until the hub says it is ready.
    s.get(url + f"/hub/spawn/{USER}", timeout=180)
    api = {"X-XSRFToken": _xsrf(s, "/hub/"), "Referer": url + "/hub/home"}

    def ready():
        info = s.get(url + "/hub/api/user", headers=api, timeout=30).json()
        server = info.get("servers", {}).get("", {})
        if not server:   # neither pending nor running: the spawn failed
            pytest.fail("the hub did not start the server:\n" + hub["log"].read_text()[-3000:])
        return server.get("ready") and server

    server = wait_until(ready, timeout=240, interval=1, what="the hub's report that the server is ready")
    base = url + server["url"].rstrip("/")
    assert server["url"] == f"/user/{USER}/", server
    # The user's server behind the hub's OAuth: JupyterLab's page, then the kernel API.
    lab = s.get(base + "/lab", timeout=60)
    assert lab.status_code == 200 and "JupyterLab" in lab.text, (lab.status_code, lab.url)
    # Without the hub's cookie: no way in (a redirect to the hub's login, never the page).
    bare = requests.get(base + "/api/contents", timeout=30, allow_redirects=False)
    assert bare.status_code in (302, 401, 403), bare.status_code
    xsrf = _xsrf(s, f"/user/{USER}/")
    headers = {"X-XSRFToken": xsrf, "Referer": base + "/lab"}
    kernel = s.post(base + "/api/kernels", json={"name": "python3"}, headers=headers, timeout=60)
    assert kernel.status_code == 201, (kernel.status_code, kernel.text[:300])
    kernel_id = kernel.json()["id"]
    cookie = "; ".join(f"{c.name}={c.value}" for c in s.cookies)
    ws = websocket.create_connection(
        "ws" + base[len("http"):] + f"/api/kernels/{kernel_id}/channels",
        header=[f"Cookie: {cookie}", f"X-XSRFToken: {xsrf}"], origin=url, timeout=120)
    try:
        msg_id = uuid.uuid4().hex
        code = ("import os, getpass, tensorflow as tf, app\n"
                "print('USER', getpass.getuser(), 'TF', tf.__version__, 'HUB', "
                "os.environ['JUPYTERHUB_USER'], 'CWD', os.getcwd())\n")
        ws.send(json.dumps({
            "header": {"msg_id": msg_id, "username": USER, "session": uuid.uuid4().hex,
                       "msg_type": "execute_request", "version": "5.3"},
            "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
            "content": {"code": code, "silent": False, "store_history": False,
                        "user_expressions": {}, "allow_stdin": False, "stop_on_error": True}}))
        out = []

        def idle():
            msg = json.loads(ws.recv())
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                return False
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])
            if msg["msg_type"] == "error":
                out.append("\n".join(msg["content"]["traceback"]))
            return msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle"

        wait_until(idle, timeout=120, interval=0, what="the cell to run")
    finally:
        ws.close()
    text = "".join(out)
    assert re.search(rf"USER tf TF 2\.9\.3 HUB {USER} CWD /workspace", text), text
    # The same extensions as without the hub: the TensorBoard tile's server and the guide notebooks.
    tb = s.get(base + "/tensorboard/", timeout=120)
    assert tb.status_code == 200 and "tensorboard" in tb.text.lower(), (tb.status_code, tb.text[:200])
    listing = s.get(base + "/api/contents/notebooks", headers=headers, timeout=30).json()
    assert any(item["name"].endswith(".ipynb") for item in listing["content"]), listing
    # The container: jupyterhub-singleuser as tf, no sshd, no token file; healthy.
    cid = run(["docker", "ps", "-q", "--filter", f"name={hub['prefix']}"]).stdout.split()
    assert len(cid) == 1, cid
    procs = run(["docker", "exec", cid[0], "ps", "-eo", "user:12,args"]).stdout
    assert re.search(r"^tf .*jupyterhub-singleuser", procs, re.M), procs
    assert "sshd" not in procs, procs
    logs = run(["docker", "logs", cid[0]]).stderr
    assert f"==> JupyterHub single-user server for {USER}" in logs, logs[-3000:]
    assert "Jupyter URL" not in logs, logs[-3000:]   # no token was made
    wait_until(lambda: run(["docker", "inspect", "-f", "{{.State.Health.Status}}", cid[0]]).stdout.strip()
               == "healthy", timeout=90, what="the spawned container's healthcheck")
    # Stopped by the hub like any server.
    stop = s.delete(url + f"/hub/api/users/{USER}/server", headers=api, timeout=120)
    assert stop.status_code in (202, 204), stop.status_code
