"""TensorBoard inside JupyterLab behind the token, `%tensorboard` through the proxy, and the
IDE / file-sync workflows over SSH, driven from the host against the shared compose stack:
TensorBoard's own HTTP data API, a headless Chromium driven over the DevTools protocol, the
Jupyter kernel API, paramiko, and the real `ssh` and `rsync` clients.

The first request to /tensorboard/ starts TensorBoard; how long that takes is a figure of
tests/benchmarks/bench_image.sh, not a timed assertion (this machine is small and shared)."""
from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
import requests
import websocket

from image_helpers import (HOST_GID, HOST_UID, REPO, docker_run, exec_in, free_port,
                           kernel_session, run, wait_until)
from test_stack import CHROMIUM, ssh_client, ssh_run  # the image tests' one SSH client

pytestmark = pytest.mark.docker

# Tags `python -m app train` writes today (more are coming; these two are what this checks).
EXPECTED_TAGS = {"step/loss", "step/loss_scale"}
REFUSED = (301, 302, 303, 307, 401, 403)


def _headers(stack) -> dict:
    return {"Authorization": f"token {stack.token()}"}


def _refused(status: int, location: str = "") -> bool:
    """Jupyter refuses a request without the token with 401/403, or a redirect to its login."""
    return status in (401, 403) or (status in REFUSED and "/login" in location)


# --- fixtures ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def first_open(stack) -> requests.Response:
    """The first request to /tensorboard/ (it starts TensorBoard); its answer.  The timeout
    only guards against a hang."""
    return requests.get(stack.base_url + "/tensorboard/", headers=_headers(stack), timeout=300)


@pytest.fixture(scope="module")
def trained_run(stack) -> str:
    """A short run trained over SSH into the default run folder; its TensorBoard run name."""
    runs = stack.workspace / "runs"
    before = set(p.name for p in runs.iterdir()) if runs.is_dir() else set()
    cmd = ("cd /workspace && python -m app train --dataset synthetic --model mlp --epochs 1 "
           "--precision float32 --max-train-samples 256 --max-val-samples 64 --batch-size 64 "
           "--log-every 1 --no-save-model --progress lines --profile-steps 2-3")
    with ssh_client(stack) as client:
        status, out, err = ssh_run(client, cmd, timeout=300)
    assert status == 0, out[-2000:] + err[-3000:]
    new = sorted(set(p.name for p in runs.iterdir()) - before)
    assert len(new) == 1, new
    assert list((runs / new[0] / "tensorboard").glob("events.out.tfevents.*")), new[0]
    # --profile-steps: a trace of steps 2-3 where the Profile tab looks.
    assert list((runs / new[0] / "tensorboard" / "plugins" / "profile").glob("*/*.xplane.pb"))
    return f"{new[0]}/tensorboard"   # TensorBoard names a run by its folder below the logdir


# --- TensorBoard behind the token ----------------------------------------------------------

def test_first_open_starts_tensorboard(stack, first_open):
    """The tile's URL opens TensorBoard's own page, served by a TensorBoard it started."""
    assert first_open.status_code == 200, first_open.text[:500]
    assert "<title>TensorBoard</title>" in first_open.text and "<tb-webapp" in first_open.text
    ps = exec_in(stack.container, "pgrep", "-f", "-a", "tfmp-tensorboard").stdout
    assert "tfmp-tensorboard" in ps, ps


def test_tensorboard_listens_on_loopback_only_and_has_no_host_port(stack, first_open):
    # Every TensorBoard in the container: its --port and the address that port listens on.
    probe = r"""
import glob, json
socks = {}
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    for line in open(table).read().splitlines()[1:]:
        f = line.split()
        if f[3] == "0A":  # LISTEN
            addr, port = f[1].rsplit(":", 1)
            socks.setdefault(int(port, 16), []).append(addr)
found = []
for path in glob.glob("/proc/[0-9]*/cmdline"):
    try:
        argv = open(path, "rb").read().decode().split("\0")
    except OSError:
        continue
    if any("tensorboard" in a for a in argv[:3]) and "--port" in argv:
        port = int(argv[argv.index("--port") + 1])
        found.append({"argv": argv, "port": port, "listen": socks.get(port, [])})
print(json.dumps(found))
"""
    found = json.loads(exec_in(stack.container, "python3", "-c", probe).stdout)
    named = [f for f in found if "/usr/local/bin/tfmp-tensorboard" in f["argv"]]
    assert named, found
    for server in named:
        assert server["listen"] == ["0100007F"], server  # 127.0.0.1 only, no 0.0.0.0 or ::
    published = run(["docker", "port", stack.container]).stdout
    assert {int(line.split("/")[0]) for line in published.splitlines() if line} == {8888, 22}


def test_run_trained_over_ssh_is_in_tensorboard(stack, first_open, trained_run):
    """TensorBoard's own data API, through the proxy: the run and its loss / loss-scale tags."""
    headers = _headers(stack)

    def runs():
        resp = requests.get(stack.base_url + "/tensorboard/data/runs", headers=headers, timeout=30)
        resp.raise_for_status()
        return trained_run in resp.json()

    # TensorBoard rescans its logdir every few seconds.
    wait_until(runs, timeout=90, interval=1, what=f"run {trained_run} in /tensorboard/data/runs")

    def tags():
        resp = requests.get(stack.base_url + "/tensorboard/data/plugin/scalars/tags",
                            headers=headers, timeout=30)
        resp.raise_for_status()
        have = set(resp.json().get(trained_run, {}))
        return EXPECTED_TAGS <= have and have

    have = wait_until(tags, timeout=90, interval=1, what=f"scalar tags of {trained_run}")
    resp = requests.get(stack.base_url + "/tensorboard/data/plugin/scalars/scalars", timeout=30,
                        headers=headers, params={"run": trained_run, "tag": "step/loss_scale"})
    assert resp.status_code == 200 and resp.json(), resp.text[:300]
    print(f"{trained_run}: tags {sorted(have)}")


@pytest.mark.parametrize("path", ["/tensorboard/", "/tensorboard/data/runs",
                                  "/tensorboard/data/plugin/scalars/tags", "/proxy/8888/api/status"])
@pytest.mark.parametrize("token", [None, "not-the-token"])
def test_tensorboard_without_the_token_is_refused(stack, first_open, path, token):
    headers = {"Authorization": f"token {token}"} if token else {}
    resp = requests.get(stack.base_url + path, headers=headers, allow_redirects=False, timeout=30)
    assert _refused(resp.status_code, resp.headers.get("Location", "")), \
        (resp.status_code, resp.headers, resp.text[:200])


@pytest.mark.parametrize("path", ["/tensorboard/", "/tensorboard/data/runs",
                                  "/proxy/8888/api/events/subscribe"])
def test_tensorboard_websocket_without_the_token_is_refused(stack, first_open, path):
    with pytest.raises(websocket.WebSocketBadStatusException) as err:
        websocket.create_connection(f"ws://127.0.0.1:{stack.jupyter_port}{path}", timeout=30)
    location = (err.value.resp_headers or {}).get("location", "")
    assert _refused(err.value.status_code, location), (err.value.status_code, location)


@pytest.mark.parametrize("value, says", [("runs", "must be an absolute path"),
                                         ("/etc/passwd", "is a file, not a folder")])
def test_a_bad_logdir_stops_the_start_with_one_line(image, value, says):
    proc = docker_run(image, "-e", f"TFMP_TENSORBOARD_LOGDIR={value}", "-e", "ENABLE_SSH=0",
                      command=["serve"], timeout=180)
    assert proc.returncode == 64, proc.stderr[-2000:]
    fatal = [line for line in proc.stderr.splitlines() if " FATAL " in line]
    assert len(fatal) == 1 and says in fatal[0] and "TFMP_TENSORBOARD_LOGDIR" in fatal[0], fatal


# --- `%tensorboard` in a kernel ---------------------------------------------------------------

def test_tensorboard_magic_shows_a_frame_through_the_proxy(stack):
    code = "%load_ext tensorboard\n%tensorboard --logdir /workspace/runs\n"
    with kernel_session(stack.base_url, stack.token(), code, timeout=240) as messages:
        errors = ["\n".join(m["content"]["traceback"]) for m in messages
                  if m["msg_type"] == "error"]
        assert not errors, errors
        # The magic shows "Launching TensorBoard..." and then replaces it with the frame.
        html = "\n".join(m["content"].get("data", {}).get("text/html", "") for m in messages
                         if m["msg_type"] in ("display_data", "update_display_data",
                                              "execute_result"))
        assert "<iframe" in html, [(m["msg_type"], m["content"]) for m in messages][-5:]
        # TENSORBOARD_PROXY_URL=/proxy/%PORT%/: the frame loads through Jupyter, not a port.
        found = re.search(r'"/proxy/(\d+)/"', html)
        assert found, html[-1000:]
        frame = f"{stack.base_url}/proxy/{found.group(1)}/"
        resp = requests.get(frame, headers=_headers(stack), timeout=30)
        assert resp.status_code == 200 and "tensorboard" in resp.text.lower(), resp.text[:300]
        bare = requests.get(frame, allow_redirects=False, timeout=30)
        assert _refused(bare.status_code, bare.headers.get("Location", "")), bare.status_code


# --- a real browser: the launcher tile ---------------------------------------------------------

class DevTools:
    """Just enough of the Chrome DevTools protocol: evaluate, navigate, screenshot."""

    def __init__(self, user_data: Path, log: Path, extra_flags: tuple = ()):
        if not Path(CHROMIUM).exists():
            pytest.fail(f"{CHROMIUM} is missing (.ci/run installs Debian's chromium)")
        port = free_port()
        self._log = open(log, "w")
        self.proc = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--no-first-run", "--hide-scrollbars", f"--user-data-dir={user_data}",
             "--window-size=1280,800", f"--remote-debugging-port={port}",
             "--remote-allow-origins=*", *extra_flags, "about:blank"],
            stdout=self._log, stderr=subprocess.STDOUT)
        self._id = 0
        try:
            pages = wait_until(lambda: [t for t in requests.get(
                f"http://127.0.0.1:{port}/json/list", timeout=5).json() if t["type"] == "page"],
                timeout=60, what="Chromium's DevTools endpoint")
            self.ws = websocket.create_connection(pages[0]["webSocketDebuggerUrl"], timeout=60,
                                                  suppress_origin=True)
        except BaseException:
            self.close()
            raise

    def call(self, method: str, **params):
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self._id:
                if "error" in msg:
                    raise AssertionError(f"{method}: {msg['error']}")
                return msg["result"]

    def eval(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression[:80]}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self, path: Path) -> None:
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"]))

    def close(self) -> None:
        if getattr(self, "ws", None):
            self.ws.close()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=20)
        self._log.close()


FIND_TILE = """[...document.querySelectorAll('.jp-LauncherCard')]
    .find(card => card.innerText.trim() === 'TensorBoard')"""
TENSORBOARD_FRAME = "document.querySelector('iframe[src*=\"/tensorboard/\"]')"
# All text in TensorBoard's page, including its (Polymer) shadow DOM, which innerText skips.
DEEP_TEXT = """((root) => {
  const parts = [];
  const walk = (node) => {
    if (node.nodeType === Node.TEXT_NODE) { parts.push(node.textContent); return; }
    if (node.shadowRoot) walk(node.shadowRoot);
    for (const child of node.childNodes) walk(child);
  };
  if (root) walk(root);
  return parts.join(' ').replace(/\\s+/g, ' ');
})"""


def test_browser_opens_the_tensorboard_tile_and_shows_the_run(stack, trained_run, tmp_path):
    browser = DevTools(tmp_path / "profile", tmp_path / "chromium.log")
    shot = tmp_path / "tensorboard-tile.png"
    try:
        browser.call("Page.navigate", url=f"{stack.base_url}/lab?token={stack.token()}")
        wait_until(lambda: browser.eval(f"!!({FIND_TILE})"), timeout=90, interval=0.5,
                   what="the TensorBoard tile in JupyterLab's launcher")
        browser.eval(f"({FIND_TILE}).click(), true")
        wait_until(lambda: browser.eval(f"!!{TENSORBOARD_FRAME}"), timeout=60, interval=0.5,
                   what="a JupyterLab tab with TensorBoard's frame")
        body = f"(({TENSORBOARD_FRAME}).contentDocument || {{}}).body"

        def shows_run():
            text = browser.eval(f"{DEEP_TEXT}({body})") or ""
            # The run in the run selector, the "step" tag group among the charts.
            return trained_run in text and re.search(r"\bstep\b", text) and text

        try:
            text = wait_until(shows_run, timeout=120, interval=1,
                              what=f"TensorBoard's scalars page with run {trained_run}")
        finally:
            browser.screenshot(shot)
            keep = os.environ.get("TFMP_SCREENSHOT_DIR")
            if keep:
                shutil.copy(shot, Path(keep) / "tensorboard-tile.png")
        frame_url = browser.eval(f"({TENSORBOARD_FRAME}).contentWindow.location.href")
    finally:
        browser.close()
    assert frame_url.startswith(f"{stack.base_url}/tensorboard/"), frame_url
    assert "scalars" in frame_url or "Scalars" in text or "SCALARS" in text, (frame_url, text[:500])
    from PIL import Image

    with Image.open(shot) as img:
        assert img.width == 1280 and img.height >= 600, img.size
        assert len(img.convert("RGB").getcolors(maxcolors=1_000_000) or []) > 20, "blank page"
    print(f"screenshot: {shot}")


# --- SSH: rsync and the docs' ~/.ssh/config block ---------------------------------------------

def _ssh_options(stack, known_hosts: Path) -> list[str]:
    return ["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=accept-new",
            "-o", f"UserKnownHostsFile={known_hosts}", "-o", "ConnectTimeout=15"]


def test_rsync_over_ssh_round_trip(stack, tmp_path):
    if not shutil.which("rsync"):
        pytest.fail("rsync is not installed on this host (.ci/run installs it)")
    src = tmp_path / "project"
    (src / "data").mkdir(parents=True)
    (src / "train.py").write_text("print('hello from rsync')\n")
    (src / "data" / "blob.bin").write_bytes(os.urandom(200_000))
    ssh = " ".join(["ssh", "-F", "none", "-p", str(stack.ssh_port), "-i", str(stack.private_key),
                    *_ssh_options(stack, tmp_path / "known_hosts")])
    name = f"rsync-{uuid.uuid4().hex[:8]}"
    run(["rsync", "-a", "-e", ssh, f"{src}/", f"tf@127.0.0.1:/workspace/{name}/"], timeout=120)
    landed = stack.workspace / name
    assert (landed / "train.py").read_text() == "print('hello from rsync')\n"
    assert (landed / "data" / "blob.bin").read_bytes() == (src / "data" / "blob.bin").read_bytes()
    st = (landed / "data" / "blob.bin").stat()
    assert (st.st_uid, st.st_gid) == (HOST_UID, HOST_GID)
    # Changed in the container, synced back.
    with ssh_client(stack) as client:
        status, _, err = ssh_run(client, f"echo trained > /workspace/{name}/result.txt")
    assert status == 0, err
    back = tmp_path / "back"
    run(["rsync", "-a", "-e", ssh, f"tf@127.0.0.1:/workspace/{name}/", f"{back}/"], timeout=120)
    assert (back / "result.txt").read_text() == "trained\n"
    assert (back / "data" / "blob.bin").read_bytes() == (src / "data" / "blob.bin").read_bytes()


def _docs_ssh_config() -> str:
    text = (REPO / "docs/image.md").read_text()
    blocks = re.findall(r"```ssh-config\n(.*?)```", text, re.S)
    assert len(blocks) == 1, "docs/image.md should hold one ```ssh-config block"
    return blocks[0]


def test_docs_ssh_config_block_logs_in_and_forwards_tensorboard(stack, first_open, tmp_path):
    block = _docs_ssh_config()
    for line in ("Host tfmp", "User tf", "Port 2222", "LocalForward"):
        assert line in block, f"the docs' block lacks {line!r}:\n{block}"
    # What the docs tell users to change: the port, the key, free local forward ports.
    jupyter_fwd, spare_fwd = free_port(), free_port()
    config = (block.replace("Port 2222", f"Port {stack.ssh_port}")
              .replace("~/.ssh/id_ed25519", str(stack.private_key))
              .replace("LocalForward 18888 ", f"LocalForward {jupyter_fwd} ")
              .replace("LocalForward 16006 ", f"LocalForward {spare_fwd} "))
    assert str(stack.private_key) in config and f"LocalForward {jupyter_fwd} " in config, config
    cfg = tmp_path / "ssh_config"
    cfg.write_text(config)
    cfg.chmod(0o600)
    base = ["ssh", "-F", str(cfg), *_ssh_options(stack, tmp_path / "known_hosts")]
    out = run(base + ["tfmp", "whoami; echo $TFMP_WORKSPACE"], timeout=60).stdout.split()
    assert out == ["tf", "/workspace"], out
    # The LocalForward for TensorBoard: JupyterLab's /tensorboard/ on this side of the tunnel.
    tunnel = subprocess.Popen(base + ["-N", "-o", "ExitOnForwardFailure=yes", "tfmp"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        def through_tunnel():
            assert tunnel.poll() is None, tunnel.stderr.read()
            return requests.get(f"http://127.0.0.1:{jupyter_fwd}/tensorboard/data/runs",
                                headers=_headers(stack), timeout=10).status_code == 200

        wait_until(through_tunnel, timeout=60, interval=0.5,
                   what="TensorBoard through the docs' LocalForward")
    finally:
        tunnel.terminate()
        tunnel.wait(timeout=20)


# --- the Profile tab (tfmp train --profile-steps) ---------------------------------------------

# All text of a page and of the same-origin frames inside it (TensorBoard shows a plugin with
# its own frontend, as the profile plugin, in an iframe), shadow DOM included.
DEEP_TEXT_FRAMES = """((root) => {
  const parts = [];
  const walk = (node) => {
    if (!node) return;
    if (node.nodeType === Node.TEXT_NODE) { parts.push(node.textContent); return; }
    if (node.shadowRoot) walk(node.shadowRoot);
    if (node.tagName === 'IFRAME') { try { walk(node.contentDocument); } catch (e) {} }
    for (const child of node.childNodes || []) walk(child);
  };
  walk(root);
  return parts.join(' ').replace(/\\s+/g, ' ');
})"""


def test_profile_of_cpu_steps_opens_in_the_profile_tab(stack, first_open, trained_run, tmp_path):
    """The trace of the run's --profile-steps in TensorBoard's Profile tab: the plugin's data
    API lists the run's tools (TensorFlow converts the trace on the first request), and a
    real browser shows the tab with the run and its tools."""
    headers = _headers(stack)

    def tools():
        resp = requests.get(stack.base_url + "/tensorboard/data/plugin/profile/tools",
                            headers=headers, timeout=120)
        resp.raise_for_status()
        return {run: t for run, t in resp.json().items() if run.startswith(trained_run + "/")}

    found = wait_until(tools, timeout=120, interval=2, what=f"profile tools of {trained_run}")
    (session, names), = found.items()
    assert {"overview_page@", "trace_viewer#"} <= set(names), names
    resp = requests.get(stack.base_url + "/tensorboard/data/plugin/profile/tools", timeout=30,
                        allow_redirects=False)
    assert _refused(resp.status_code, resp.headers.get("Location", "")), resp.status_code
    browser = DevTools(tmp_path / "profile", tmp_path / "chromium.log")
    shot = tmp_path / "tensorboard-profile.png"
    try:
        browser.call("Page.navigate",
                     url=f"{stack.base_url}/tensorboard/?token={stack.token()}#profile")

        def shows_profile():
            text = browser.eval(f"{DEEP_TEXT_FRAMES}(document)") or ""
            # The run and its tools in the selectors, the overview page drawn from the trace
            # (its "Performance Summary"; before, the tab says "No profile data" a moment).
            return ("Tools" in text and trained_run.split("/")[0] in text
                    and "overview_page" in text and "Performance Summary" in text and text)

        try:
            text = wait_until(shows_profile, timeout=150, interval=1,
                              what=f"the Profile tab listing {session}")
        finally:
            browser.screenshot(shot)
            keep = os.environ.get("TFMP_SCREENSHOT_DIR")
            if keep:
                shutil.copy(shot, Path(keep) / "tensorboard-profile.png")
    finally:
        browser.close()
    assert "No profile data was found" not in text, text[:800]
    # Whole steps in the trace: Keras 2 marks them, the Profile tab measures the step time.
    assert "No step marker observed" not in text, text[:800]
    print(f"screenshot: {shot}")
