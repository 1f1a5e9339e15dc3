"""Bad input to the Python API in a notebook: IPython shows the one ``error:`` line the
command line prints (docs/your-model.md), not 20-40 lines of traceback through the
package (a QA pass).  IPython shows what an exception's ``_render_traceback_()`` returns;
plain Python ignores it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.paths import ROOT, USER_MODELS

pytest.importorskip("IPython")

# Each cell run in one IPython shell, as a notebook's kernel runs it; what it shows is printed
# after a marker, and the exception's str() and a plain interpreter's last line beside it.
_SHELL = textwrap.dedent("""
    import contextlib, io, json, sys, traceback
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance(colors="NoColor")
    shell.run_cell("import app")
    results = []
    for cell in json.loads(sys.argv[1]):
        shown = io.StringIO()
        with contextlib.redirect_stdout(shown):
            outcome = shell.run_cell(cell)
        exc = outcome.error_in_exec
        plain = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        results.append({"shown": shown.getvalue(), "str": str(exc),
                        "plain_last": plain.strip().splitlines()[-1]})
    print(json.dumps(results))
""")


def _in_ipython(cells, tmp_path) -> list:
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    env = {k: v for k, v in env.items() if not k.startswith("TFMP_")}
    proc = subprocess.run([sys.executable, "-c", _SHELL, json.dumps(cells)], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_an_api_error_in_ipython_is_its_one_line(tmp_path):
    ws = repr(str(tmp_path / "ws"))
    cells = [
        'app.train(model="mlp", data="synthetic", max_train_samples=100.5)',
        'app.train(model="mlp", data="synthetic", epochz=3)',
        'app.train(model="nosuch", data="synthetic")',
        f'app.train(model="mlp", data="cifar10", offline=True, workspace={ws})',
        'app.tune(model="mlp", data="synthetic", no_such_keyword=1)',
        # what app.tune raises when no batch size fits: a UsageError of its own
        'from app.tuner.tuning import NothingFits\n'
        'raise NothingFits("no batch size fits the memory budget", "a larger --memory-budget")',
    ]
    results = _in_ipython(cells, tmp_path)
    for cell, result in zip(cells, results):
        shown = [line for line in result["shown"].splitlines() if line.strip()]
        assert len(shown) == 1 and shown[0].startswith("error: "), (cell, result["shown"])
        # the line the command line prints; plain Python's traceback still ends in it
        assert shown[0] == result["str"], cell
        assert result["plain_last"].endswith(f": {result['str']}"), cell
    assert results[1]["shown"].startswith("error: unknown setting(s) epochz; allowed: ")
    assert results[3]["shown"].startswith("error: ") and "cifar10" in results[3]["shown"]
    assert results[5]["shown"] == ("error: no batch size fits the memory budget; allowed: a "
                                   "larger --memory-budget\n")


def test_the_users_own_code_raising_keeps_their_traceback_in_ipython(tmp_path):
    """Their traceback names their line (as the command line prints it), then the line."""
    spec = os.path.join(str(USER_MODELS), "datasets.py") + ":raises"
    [result] = _in_ipython([f'app.train(model="mlp", data={spec!r}, offline=True, '
                            f'workspace={str(tmp_path / "ws")!r})'], tmp_path)
    shown = result["shown"].strip().splitlines()
    assert shown[0] == "Traceback (most recent call last):", result["shown"]
    assert 'raise RuntimeError("the bucket is not mounted")' in result["shown"]
    assert shown[-2] == "RuntimeError: the bucket is not mounted", result["shown"]
    assert shown[-1] == result["str"] and shown[-1].startswith("error: your code raised ")
