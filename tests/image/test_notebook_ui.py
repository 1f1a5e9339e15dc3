"""The Notebook interface (/tree, /notebooks/..., /edit/...) beside JupyterLab, driven from the
host: a headless Chromium over the DevTools protocol, Jupyter's REST and kernel API.  Uses the
shared compose stack (JUPYTER_UI unset = lab); one small extra container checks
JUPYTER_UI=notebook."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import requests

from image_helpers import (HOST_GID, HOST_UID, exec_in, free_port, health, run, run_on_kernel,
                           wait_until)
from test_tensorboard import DevTools  # the image tests' one DevTools client

pytestmark = pytest.mark.docker

GUIDE = "notebooks/01_policy_and_fit.ipynb"
TOKEN_HELP = "docker compose logs tfmp | grep 'Jupyter URL' | tail -n 1"
LISTING = "[...document.querySelectorAll('.jp-DirListing-itemText')].map(e => e.innerText.trim())"
NEW_MENU = "document.querySelector('[data-jp-item-name=\"new-dropdown\"] .lm-MenuBar-item')"


@pytest.fixture
def browser(tmp_path):
    chrome = DevTools(tmp_path / "profile", tmp_path / "chromium.log")
    try:
        yield chrome
    finally:
        chrome.close()


def _click(browser: DevTools, element_js: str) -> None:
    """A real mouse click (press and release) on the middle of the element."""
    x, y = browser.eval(f"(() => {{ const r = ({element_js}).getBoundingClientRect();"
                        " return [r.x + r.width / 2, r.y + r.height / 2]; })()")
    browser.call("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)
    for kind in ("mousePressed", "mouseReleased"):
        browser.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)


def _keep(shot: Path, name: str) -> None:
    keep = os.environ.get("TFMP_SCREENSHOT_DIR")
    if keep:
        shutil.copy(shot, Path(keep) / name)


def _session_kernel(stack, path: str) -> str | None:
    sessions = requests.get(stack.base_url + "/api/sessions", timeout=10,
                            headers={"Authorization": f"token {stack.token()}"}).json()
    return next((s["kernel"]["id"] for s in sessions if s["path"] == path), None)


# --- the tree, a guide notebook, the New menu ------------------------------------------------

def test_tree_with_the_token_shows_the_notebooks_folder(stack, browser, tmp_path):
    browser.call("Page.navigate", url=f"{stack.base_url}/tree?token={stack.token()}")
    names = wait_until(lambda: "notebooks" in (browser.eval(LISTING) or []) and browser.eval(LISTING),
                       timeout=90, interval=0.5, what="the notebooks folder in /tree")
    assert browser.eval("location.pathname") == "/tree", names
    shot = tmp_path / "tree.png"
    browser.screenshot(shot)
    _keep(shot, "notebook-tree.png")
    from PIL import Image

    with Image.open(shot) as img:
        assert len(img.convert("RGB").getcolors(maxcolors=1_000_000) or []) > 20, "blank page"


def test_guide_notebook_opens_in_the_notebook_interface_and_its_kernel_runs_a_cell(
        stack, browser):
    """The page starts the notebook's kernel; its first code cells run on that kernel."""
    browser.call("Page.navigate", url=f"{stack.base_url}/notebooks/{GUIDE}?token={stack.token()}")
    text = "(document.querySelector('.jp-Notebook') || {}).innerText || ''"
    # The title cell rendered from its Markdown, and the code cells below it.
    wait_until(lambda: "1. Mixed precision with" in browser.eval(text)
               and browser.eval("document.querySelectorAll('.jp-Notebook .jp-Cell').length") >= 5,
               timeout=90, interval=0.5, what=f"{GUIDE} rendered in the Notebook interface")
    kernel = wait_until(lambda: _session_kernel(stack, GUIDE), timeout=90, interval=0.5,
                        what=f"a kernel session for {GUIDE}")
    cells = json.loads((stack.workspace / GUIDE).read_text())["cells"]
    parameters, imports = [("".join(c["source"])) for c in cells if c["cell_type"] == "code"][:2]
    code = f"{parameters}\n{imports}\nprint('GUIDE-CELLS-RAN', tf.__version__, precision)\n"
    messages = run_on_kernel(stack.base_url, stack.token(), kernel, code, timeout=240)
    errors = ["\n".join(m["content"]["traceback"]) for m in messages if m["msg_type"] == "error"]
    assert not errors, errors
    out = "".join(m["content"]["text"] for m in messages if m["msg_type"] == "stream")
    assert "GUIDE-CELLS-RAN 2.9.3 auto" in out, out[-2000:]


def test_new_menu_of_the_tree_opens_tensorboard(stack, browser):
    browser.call("Page.navigate", url=f"{stack.base_url}/tree?token={stack.token()}")
    wait_until(lambda: browser.eval(f"!!{NEW_MENU}"), timeout=90, interval=0.5,
               what="the New menu in /tree")
    entry = ("[...document.querySelectorAll('.lm-Menu .lm-Menu-item')]"
             ".find(e => e.innerText.trim() === 'TensorBoard')")

    def open_menu():
        if browser.eval("!!document.querySelector('.lm-Menu')"):
            _click(browser, NEW_MENU)  # closes the menu opened by the last try
        _click(browser, NEW_MENU)
        return wait_until(lambda: browser.eval(f"!!({entry})"), timeout=5, interval=0.25,
                          what="TensorBoard in the New menu")

    # The server-proxy entries are added once the page has asked the server for them.
    wait_until(open_menu, timeout=60, interval=1, what="TensorBoard in the New menu")
    _click(browser, entry)

    def tensorboard_tab():
        tabs = browser.call("Target.getTargets")["targetInfos"]
        return next((t for t in tabs if t["type"] == "page" and "/tensorboard/" in t["url"]
                     and t["title"] == "TensorBoard"), None)

    tab = wait_until(tensorboard_tab, timeout=120, interval=1,
                     what="a browser tab with TensorBoard at /tensorboard/")
    assert tab["url"].startswith(f"{stack.base_url}/tensorboard/"), tab


def test_tensorboard_magic_renders_in_the_notebook_interface(stack, browser):
    """`%tensorboard` run from the Notebook interface's toolbar shows TensorBoard in its frame,
    loaded through Jupyter's /proxy/<port>/."""
    path = "tensorboard-magic.ipynb"
    notebook = {"nbformat": 4, "nbformat_minor": 5, "cells": [{
        "cell_type": "code", "id": "magic", "metadata": {}, "execution_count": None,
        "outputs": [], "source": "%load_ext tensorboard\n%tensorboard --logdir /workspace/runs"}],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)",
                                    "language": "python"}}}
    (stack.workspace / path).write_text(json.dumps(notebook))
    os.chown(stack.workspace / path, HOST_UID, HOST_GID)
    browser.call("Page.navigate", url=f"{stack.base_url}/notebooks/{path}?token={stack.token()}")
    run_button = "document.querySelector('[data-command=\"notebook:run-cell-and-select-next\"]')"
    wait_until(lambda: browser.eval(f"!!{run_button}") and _session_kernel(stack, path),
               timeout=90, interval=0.5, what="the notebook, its Run button and its kernel")
    _click(browser, run_button)  # the first cell is the active one
    frame = "document.querySelector('.jp-OutputArea iframe')"

    def tensorboard_in_frame():
        src = browser.eval(f"({frame} || {{}}).src || ''")
        title = browser.eval(f"((({frame} || {{}}).contentDocument) || {{}}).title || ''")
        return "/proxy/" in src and title == "TensorBoard" and src

    try:
        src = wait_until(tensorboard_in_frame, timeout=120, interval=1,
                         what="TensorBoard in the output frame")
    except AssertionError as exc:  # what the cell printed says why (e.g. the magic's timeout)
        shown = browser.eval("(document.querySelector('.jp-OutputArea') || {}).innerText || ''")
        raise AssertionError(f"{exc}; the cell's output: {shown!r}") from None
    assert src.startswith(f"{stack.base_url}/proxy/"), src
    # The magic's TensorBoard is the image's quick one (TENSORBOARD_BINARY), not TensorFlow's.
    ps = exec_in(stack.container, "pgrep", "-a", "-f", "tfmp-tensorboard --logdir").stdout
    assert "/usr/local/bin/tfmp-tensorboard --logdir /workspace/runs" in ps, ps


# --- authentication and the login page --------------------------------------------------------

@pytest.mark.parametrize("path", ["/tree", f"/notebooks/{GUIDE}", f"/edit/{GUIDE}"])
def test_notebook_pages_without_the_token_are_refused(stack, path):
    resp = requests.get(stack.base_url + path, allow_redirects=False, timeout=10)
    assert resp.status_code in (301, 302, 303, 307), (resp.status_code, resp.text[:200])
    assert "/login" in resp.headers["Location"], resp.headers["Location"]
    page = requests.get(stack.base_url + path, timeout=10)
    assert "jp-DirListing" not in page.text and "Mixed precision with" not in page.text


def test_login_page_at_root_says_where_the_token_is(stack, tmp_path):
    resp = requests.get(stack.base_url + "/", allow_redirects=False, timeout=10)
    assert resp.status_code == 302 and resp.headers["Location"].startswith("/lab"), resp.headers
    chromium = run(["/usr/bin/chromium", "--headless", "--no-sandbox", "--disable-gpu",
                    "--disable-dev-shm-usage", "--no-first-run",
                    f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=10000",
                    "--dump-dom", stack.base_url + "/"], timeout=120)
    dom = chromium.stdout
    assert 'id="tfmp-token-help"' in dom and "/login" in dom, dom[-2000:]
    assert TOKEN_HELP.replace("'", "&#39;") in dom or TOKEN_HELP in dom, dom[-2000:]
    assert "/home/tf/.jupyter/token" in dom
    assert stack.token() not in dom


# --- JUPYTER_UI=notebook ---------------------------------------------------------------------

def test_jupyter_ui_notebook_lands_on_tree_and_prints_its_url(container):
    port = free_port()
    name = container("--shm-size=256m", "-e", "JUPYTER_UI=notebook", "-e", "ENABLE_SSH=0",
                     "-e", "JUPYTER_TOKEN=test-token-123", "-p", f"127.0.0.1:{port}:8888")
    wait_until(lambda: health(name).startswith("healthy"), 90, what=f"{name} healthy")
    base = f"http://127.0.0.1:{port}"
    resp = requests.get(base + "/?token=test-token-123", allow_redirects=False, timeout=10)
    assert resp.status_code == 302 and resp.headers["Location"].startswith("/tree"), resp.headers
    tree = requests.get(base + "/?token=test-token-123", timeout=10)
    assert tree.url.startswith(base + "/tree") and tree.status_code == 200
    logs = run(["docker", "logs", name]).stderr
    lines = [line for line in logs.splitlines() if "==> Jupyter URL: " in line]
    assert len(lines) == 1 and "/tree?token=test-token-123" in lines[0], lines
    assert requests.get(base + "/lab?token=test-token-123", timeout=10).status_code == 200
