"""What the image brings for a GPU box, checked here on a CPU (the shared stack): the GPU
view behind the token saying "no GPU", and tqdm's notebook bar (ipywidgets) in a kernel.
On a GPU box tests/gpu checks the view with the GPU in it."""
from __future__ import annotations

import json

import pytest
import requests

from image_helpers import kernel_session

pytestmark = pytest.mark.docker


def test_gpu_view_serves_its_page_behind_the_token_and_says_no_gpu(stack):
    headers = {"Authorization": f"token {stack.token()}"}
    # The first request starts tfmp-gpu-view through jupyter-server-proxy.
    page = requests.get(stack.base_url + "/gpu/", headers=headers, timeout=120)
    assert page.status_code == 200, page.text[:500]
    assert "<title>GPU</title>" in page.text and "no GPU:" in page.text, page.text[:800]
    assert "libnvidia-ml.so.1" in page.text      # the reason, not a traceback
    api = requests.get(stack.base_url + "/gpu/api", headers=headers, timeout=30)
    assert api.status_code == 200 and api.json()["gpus"] == [], api.text[:300]
    fragment = requests.get(stack.base_url + "/gpu/fragment", headers=headers, timeout=30)
    assert "no GPU:" in fragment.text
    for path in ("/gpu/", "/gpu/api"):
        anon = requests.get(stack.base_url + path, timeout=30, allow_redirects=False)
        assert anon.status_code in (302, 401, 403), (path, anon.status_code)
        assert "no GPU" not in anon.text
    lab = requests.get(stack.base_url + "/lab/api/settings", headers=headers, timeout=30)
    launcher = requests.get(stack.base_url + "/server-proxy/servers-info", headers=headers,
                            timeout=30)
    assert launcher.status_code == 200, launcher.text[:300]
    names = {s["name"]: s for s in launcher.json()["server_processes"]}
    assert names["gpu"]["launcher_entry"]["title"] == "GPU", names
    assert lab.status_code == 200


def test_tqdm_notebook_bar_renders_as_a_widget_in_a_kernel(stack):
    """tqdm.auto and the package's own progress (app.core.progress, the tuner's and the
    benchmark's bar) draw an ipywidgets progress bar in a notebook, not "IProgress not found"."""
    code = ("from tqdm.auto import tqdm\n"
            "for _ in tqdm(range(3), desc='auto'):\n    pass\n"
            "from app.core.progress import Bar, mode\n"
            "import sys\n"
            "print('MODE', mode(sys.stderr))\n"
            "b = Bar(2, 'run', desc='tfmp')\n"
            "b.advance(); b.line('one line above the bar'); b.advance(); b.close()\n")
    with kernel_session(stack.base_url, stack.token(), code, timeout=120) as messages:
        widgets = [m for m in messages if m["msg_type"] in ("display_data", "update_display_data")
                   and "application/vnd.jupyter.widget-view+json" in m["content"]["data"]]
        text = json.dumps([m["content"] for m in messages])
        errors = [m for m in messages if m["msg_type"] == "error"]
    assert not errors, errors
    assert "IProgress" not in text, text[:2000]
    assert len(widgets) >= 2, text[:2000]        # one bar per loop
    assert "MODE widget" in text and "one line above the bar" in text, text[:2000]


def test_the_gpu_tile_opens_the_view_in_jupyterlab(stack, tmp_path):
    """A real browser: the launcher's GPU tile opens a tab with the view, which says "no GPU"."""
    import os
    import shutil
    from pathlib import Path

    from image_helpers import wait_until
    from test_tensorboard import DevTools

    tile = ("[...document.querySelectorAll('.jp-LauncherCard')]"
            ".find(card => card.innerText.trim() === 'GPU')")
    frame = "document.querySelector('iframe[src*=\"/gpu/\"]')"
    browser = DevTools(tmp_path / "profile", tmp_path / "chromium.log")
    shot = tmp_path / "gpu-tile.png"
    try:
        # A workspace of its own (reset): the shared stack's default layout stays as it was,
        # so later tests find the launcher, not this test's GPU tab restored.
        browser.call("Page.navigate", url=f"{stack.base_url}/lab/workspaces/tfmp-gpu-tile"
                                          f"?reset&token={stack.token()}")
        wait_until(lambda: browser.eval(f"!!({tile})"), timeout=90, interval=0.5,
                   what="the GPU tile in JupyterLab's launcher")
        browser.eval(f"({tile}).click(), true")
        wait_until(lambda: browser.eval(f"!!{frame}"), timeout=60, interval=0.5,
                   what="a JupyterLab tab with the GPU view's frame")
        body = f"((({frame}).contentDocument || {{}}).body || {{}}).innerText"
        try:
            text = wait_until(lambda: "no GPU" in (browser.eval(body) or "")
                              and browser.eval(body), timeout=60, interval=0.5,
                              what="the GPU view saying no GPU")
        finally:
            browser.screenshot(shot)
            keep = os.environ.get("TFMP_SCREENSHOT_DIR")
            if keep:
                shutil.copy(shot, Path(keep) / "gpu-tile.png")
    finally:
        browser.close()
    assert "libnvidia-ml.so.1" in text and "--gpus all" in text, text
