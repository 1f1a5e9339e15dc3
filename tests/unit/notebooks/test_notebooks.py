"""The guide notebooks: stored clean, seeded into a workspace without overwriting edits, and
executed top to bottom with small parameters on whatever TensorFlow this is: Keras 2 / TF 2.9.3
in the image's self-test, and Keras 3 on the host when the session does not run the self-test
(``image_self_tested``: a full run executes them once, in the image).

Execution tests inject a cell after the one tagged ``parameters`` (papermill's convention), run
the notebook in a real kernel with nbclient, then read back the ``summary`` dict the notebook
builds and check the values in it: the policy is the one asked for, dtypes, loss-scale
behaviour, an accuracy floor, the benchmark's files.

Precision choices: this 2-core CPU runs mixed_float16 about 60x slower than float32, so fp16
runs here use a few hundred samples; the bigger runs use mixed_bfloat16.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from app import notebooks
from app.core.errors import UsageError

from tests.paths import ROOT

NAMES = ["01_policy_and_fit.ipynb", "02_custom_loop_loss_scaling.ipynb", "03_benchmark.ipynb",
         "04_your_own_model.ipynb", "05_tune_batch_size.ipynb", "06_when_training_goes_nan.ipynb"]
SUMMARY_MARK = "__NOTEBOOK_SUMMARY__"
# The executions run once a session: in the image's self-test when the session runs it (the
# notebooks are the image's, for its TF 2.9), else here (tests/conftest.py).
IN_THE_IMAGE = pytest.mark.image_self_tested(
    reason="the guide notebooks ship in the image and run on its TensorFlow")


def _read(name):
    nbformat = pytest.importorskip("nbformat")
    return nbformat.read(str(notebooks.SOURCE_DIR / name), as_version=4)


def _parameters_index(nb) -> int:
    tagged = [i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, "exactly one cell must be tagged 'parameters'"
    return tagged[0]


# ---- what is shipped --------------------------------------------------------------------------

def test_the_guide_notebooks_are_shipped():
    assert list(notebooks.shipped()) == NAMES


def test_pyproject_ships_them_as_package_data():
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    if "[tool.setuptools.package-data]" not in text:  # the image has no pyproject at ROOT
        pytest.skip("pyproject.toml not beside the tests")
    assert '"app.notebooks" = ["*.ipynb"]' in text


@pytest.mark.parametrize("name", NAMES)
def test_stored_clean_with_a_parameters_cell(name):
    nbformat = pytest.importorskip("nbformat")
    nb = _read(name)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [], f"{name}: a code cell has stored outputs"
            assert cell.execution_count is None, f"{name}: a code cell has an execution count"
    params = nb.cells[_parameters_index(nb)].source
    for key in ("epochs", "dataset", "workspace"):
        assert f"{key} = " in params
    assert nb.metadata["kernelspec"]["name"] == "python3"
    # They call the package rather than copying it.
    sources = "".join(c.source for c in nb.cells if c.cell_type == "code")
    assert "from app" in sources or "import app" in sources


@pytest.mark.host_only(reason="docs/ is not shipped in the image")
def test_the_docs_parameter_table_names_the_notebooks_that_have_each_parameter():
    """docs/notebooks.md's table of parameters, row by row: the notebooks it names (or "all")
    are those whose parameters cell sets the name (a QA pass found "all" for parameters four
    of the six lack)."""
    docs = ROOT / "docs" / "notebooks.md"
    rows = re.findall(r"^\| ((?:`\w+`(?:, )?)+) \| ([\d, ]+|all) \|", docs.read_text(), re.M)
    assert rows, "no parameter rows found"
    cells = {int(n[:2]): _read(n).cells[_parameters_index(_read(n))].source for n in NAMES}
    for names, which in rows:
        said = set(cells) if which == "all" else {int(n) for n in which.split(",")}
        for name in re.findall(r"`(\w+)`", names):
            have = {i for i, src in cells.items() if re.search(rf"^{name}\s*=", src, re.M)}
            assert have == said, (name, sorted(have), which)


@pytest.mark.parametrize("name", ["01_policy_and_fit.ipynb", "02_custom_loop_loss_scaling.ipynb"])
def test_training_notebooks_default_to_auto_precision(name):
    assert 'precision = "auto"' in _read(name).cells[_parameters_index(_read(name))].source


# ---- install: copy missing, refresh unedited, never overwrite edits ----------------------------

@pytest.fixture
def source(tmp_path):
    src = tmp_path / "shipped"
    src.mkdir()
    (src / "a.ipynb").write_text('{"v": 1}')
    (src / "b.ipynb").write_text('{"b": 1}')
    return src


def _actions(outcomes):
    return {o.name: o.action for o in outcomes}


def test_install_copies_into_a_fresh_folder(tmp_path, source):
    target = tmp_path / "ws" / "notebooks"
    assert _actions(notebooks.install(target, source)) == {"a.ipynb": "copied", "b.ipynb": "copied"}
    assert (target / "a.ipynb").read_text() == '{"v": 1}'
    manifest = notebooks.read_manifest(target)
    assert manifest["a.ipynb"] == notebooks.sha256(b'{"v": 1}')
    assert not [p for p in target.iterdir() if p.name.startswith(".tmp-")]


def test_install_again_changes_nothing(tmp_path, source):
    target = tmp_path / "nb"
    notebooks.install(target, source)
    before = (target / "a.ipynb").stat().st_mtime_ns
    assert set(_actions(notebooks.install(target, source)).values()) == {"up to date"}
    assert (target / "a.ipynb").stat().st_mtime_ns == before


def test_an_edited_notebook_is_never_overwritten(tmp_path, source):
    target = tmp_path / "nb"
    notebooks.install(target, source)
    (target / "a.ipynb").write_text('{"v": 1, "mine": true}')
    (source / "a.ipynb").write_text('{"v": 2}')          # a newer image ships a new version
    for _ in range(2):                                  # and stays kept on every later start
        assert _actions(notebooks.install(target, source))["a.ipynb"] == "kept"
        assert (target / "a.ipynb").read_text() == '{"v": 1, "mine": true}'


def test_an_unedited_old_copy_is_refreshed(tmp_path, source):
    target = tmp_path / "nb"
    notebooks.install(target, source)
    (source / "a.ipynb").write_text('{"v": 2}')
    assert _actions(notebooks.install(target, source)) == {"a.ipynb": "refreshed",
                                                           "b.ipynb": "up to date"}
    assert (target / "a.ipynb").read_text() == '{"v": 2}'
    assert notebooks.read_manifest(target)["a.ipynb"] == notebooks.sha256(b'{"v": 2}')


def test_a_users_own_file_of_the_same_name_is_kept(tmp_path, source):
    target = tmp_path / "nb"
    target.mkdir()
    (target / "a.ipynb").write_text("my own notebook")  # no manifest: not ours
    assert _actions(notebooks.install(target, source))["a.ipynb"] == "kept"
    assert (target / "a.ipynb").read_text() == "my own notebook"


def test_a_folder_or_an_unreadable_file_in_a_notebooks_place_is_kept(tmp_path, source):
    """A folder named like a notebook stopped the install with IsADirectoryError."""
    target = tmp_path / "nb"
    (target / "a.ipynb").mkdir(parents=True)
    (target / "a.ipynb" / "mine.txt").write_text("x")
    assert _actions(notebooks.install(target, source)) == {"a.ipynb": "kept", "b.ipynb": "copied"}
    assert (target / "a.ipynb" / "mine.txt").read_text() == "x"


def test_a_link_to_a_missing_folder_is_one_line(tmp_path, source):
    """It stopped with FileExistsError from mkdir."""
    target = tmp_path / "dangling"
    target.symlink_to(tmp_path / "gone")
    with pytest.raises(UsageError) as caught:
        notebooks.install(target, source)
    assert str(caught.value) == (
        f"error: notebook folder {str(target)!r} cannot be created: {str(target)!r} is a link "
        f"to {str(tmp_path / 'gone')!r}, which does not exist (a volume or folder that is not "
        "there now?); allowed: a writable directory path, or a link to an existing folder")
    assert target.is_symlink() and not (tmp_path / "gone").exists()


def test_a_deleted_notebook_comes_back(tmp_path, source):
    target = tmp_path / "nb"
    notebooks.install(target, source)
    (target / "b.ipynb").unlink()
    assert _actions(notebooks.install(target, source))["b.ipynb"] == "copied"


def test_a_corrupt_manifest_keeps_everything_that_differs(tmp_path, source):
    target = tmp_path / "nb"
    notebooks.install(target, source)
    (target / notebooks.MANIFEST).write_text("{not json")
    (source / "a.ipynb").write_text('{"v": 2}')
    assert _actions(notebooks.install(target, source))["a.ipynb"] == "kept"


def test_cli_installs_the_real_notebooks_and_rejects_a_file(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    target = tmp_path / "notebooks"
    cmd = [sys.executable, "-m", "app", "notebooks", "--install", str(target)]
    first = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
    assert first.returncode == 0, first.stderr
    assert sorted(p.name for p in target.glob("*.ipynb")) == NAMES
    assert first.stdout.count(": copied") == len(NAMES)
    second = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
    assert second.stdout.count(": up to date") == len(NAMES)

    a_file = tmp_path / "file"
    a_file.write_text("x")
    bad = subprocess.run(cmd[:-1] + [str(a_file / "sub")], capture_output=True, text=True,
                         env=env, timeout=60)
    assert bad.returncode == 2
    assert bad.stderr.startswith("error: notebook folder") and len(bad.stderr.splitlines()) == 1


# ---- execution -----------------------------------------------------------------------------------

def execute(name: str, params: dict, tmp_path: Path, monkeypatch, timeout: int = 600,
            prelude: str = ""):
    """Run notebook ``name`` with ``params`` injected (and ``prelude``, code run right after
    them); return (executed notebook, summary)."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = _read(name)
    at = _parameters_index(nb) + 1
    injected = "\n".join(f"{k} = {v!r}" for k, v in params.items()) + "\n" + prelude
    nb.cells.insert(at, nbformat.v4.new_code_cell(injected, metadata={"tags": ["injected-parameters"]}))
    nb.cells.append(nbformat.v4.new_code_cell(
        f"import json as _json\nprint({SUMMARY_MARK!r} + _json.dumps(summary))"))
    # The kernel must import this checkout's `app` (in the image it is on sys.path already).
    monkeypatch.setenv("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    monkeypatch.delenv("TFMP_WORKSPACE", raising=False)
    client = nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    try:
        client.execute()
    finally:
        _stop_tensorboards_under(tmp_path)
    text = "".join(o.get("text", "") for o in nb.cells[-1].outputs if o.output_type == "stream")
    line = next(ln for ln in text.splitlines() if ln.startswith(SUMMARY_MARK))
    summary = json.loads(line[len(SUMMARY_MARK):])
    print(f"{name} {params}: {summary}")  # shown when a check below fails
    return nb, summary


def _stop_tensorboards_under(folder: Path) -> None:
    """``%tensorboard`` leaves its server running after the kernel exits: stop the ones it
    started for this test (TensorBoard's own registry of running servers)."""
    try:
        from tensorboard import manager
    except ImportError:
        return
    for info in manager.get_all():
        if info.logdir.startswith(str(folder)):
            try:
                os.kill(info.pid, signal.SIGTERM)
            except OSError:
                pass


def _html(nb) -> str:
    return "\n".join(str(o.get("data", {}).get("text/html", ""))
                     for c in nb.cells for o in c.get("outputs", []))


def _tensorboard_tags(logdir: str) -> set:
    from tensorboard.backend.event_processing import event_accumulator

    acc = event_accumulator.EventAccumulator(logdir)
    acc.Reload()
    tags = acc.Tags()
    return set(tags.get("tensors", [])) | set(tags.get("scalars", []))


def _all_text(nb) -> str:
    out = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            out.append(o.get("text", ""))
            out.append(str(o.get("data", {}).get("text/plain", "")))
    return "\n".join(out)


def _small(tmp_path, **kw):
    base = dict(dataset="synthetic", model_name="mlp", epochs=2, batch_size=32,
                max_train_samples=1024, max_val_samples=256, workspace=str(tmp_path / "ws"))
    base.update(kw)
    return base


@pytest.mark.slow
@IN_THE_IMAGE
def test_01_bfloat16_fit_dtypes_and_accuracy(tmp_path, monkeypatch):
    nb, s = execute(NAMES[0], _small(tmp_path, precision="mixed_bfloat16"), tmp_path, monkeypatch)
    assert s["policy"] == "mixed_bfloat16"
    assert s["compute_dtype"] == "bfloat16"
    assert s["variable_dtypes"] == ["float32"]
    assert s["output_dtype"] == "float32"
    assert s["loss_scaled"] is False and s["final_loss_scale"] == 1.0
    assert s["val_accuracy"] >= 0.80   # the synthetic classes are easy: float32 reaches ~1.0
    shown = _all_text(nb)
    assert "policy mixed_bfloat16: computes in bfloat16, keeps variables in float32" in shown
    assert "dense" in shown and "bfloat16 shape" in shown


@pytest.mark.slow
@IN_THE_IMAGE
def test_01_float16_uses_loss_scaling(tmp_path, monkeypatch):
    # A few hundred samples only: float16 has no fast kernels on a CPU.
    nb, s = execute(NAMES[0], _small(tmp_path, precision="mixed_float16", epochs=1,
                                     max_train_samples=256, max_val_samples=128),
                    tmp_path, monkeypatch)
    assert s["policy"] == "mixed_float16" and s["compute_dtype"] == "float16"
    assert s["variable_dtypes"] == ["float32"] and s["output_dtype"] == "float32"
    assert s["loss_scaled"] is True and s["final_loss_scale"] > 1
    assert s["val_accuracy"] >= 0.50   # after 8 steps; guessing gives 10%
    assert "WARNING: mixed_float16 on a CPU is very slow" in _all_text(nb)


@pytest.mark.slow
@IN_THE_IMAGE
def test_02_custom_loop_records_the_loss_scale_backing_off(tmp_path, monkeypatch):
    # Start at 2**24: the first gradients overflow float16, so steps are skipped and the
    # scale halves until they fit; the live view must have been drawn and updated.
    params = _small(tmp_path, precision="mixed_float16", epochs=1, max_train_samples=384,
                    max_val_samples=128, initial_loss_scale=2.0 ** 24, growth_steps=2000,
                    plot_every=4)
    nb, s = execute(NAMES[1], params, tmp_path, monkeypatch)
    assert s["policy"] == "mixed_float16" and s["loss_scaled"] is True
    assert s["steps"] == 12
    assert s["skipped_steps"] >= 1
    assert s["final_loss_scale"] < 2.0 ** 24
    assert s["initial_loss_scale"] <= 2.0 ** 24
    assert s["final_loss"] is not None and s["final_loss"] < 2.0  # chance is ln(10) = 2.30
    assert s["val_accuracy"] >= 0.50
    outputs = [o for c in nb.cells for o in c.get("outputs", [])]
    pngs = [o.data["image/png"] for o in outputs
            if o.output_type == "display_data" and "image/png" in o.data]
    assert pngs, "the live view drew nothing"
    # nbclient applies update_display_data in place, so the view holds its last render.  Only
    # a render after steps were skipped has red in it (the loss-scale panel's marks); the first
    # one, drawn before any step, has none: red means the view was updated during training.
    import base64
    import io

    from PIL import Image

    def red_pixels(png: str) -> int:
        image = Image.open(io.BytesIO(base64.b64decode(png))).convert("RGB")
        colors = image.getcolors(maxcolors=image.width * image.height)
        return sum(n for n, (r, g, b) in colors if r > 200 and g < 80 and b < 80)

    assert max(red_pixels(png) for png in pngs) > 0, "the live view was never updated"
    # TensorBoard beside the plot: the run is under <workspace>/runs, with the plotted numbers.
    assert Path(s["tensorboard_logdir"]).parent.parent == tmp_path / "ws" / "runs"
    assert {"step/loss", "step/grad_norm", "step/loss_scale"} <= _tensorboard_tags(
        s["tensorboard_logdir"])
    assert "<iframe" in _html(nb), "%tensorboard showed no frame"


@pytest.mark.slow
@IN_THE_IMAGE
def test_02_bfloat16_has_no_loss_scale(tmp_path, monkeypatch):
    # As in the image's JupyterLab: the %tensorboard frame goes through Jupyter's proxy.
    monkeypatch.setenv("TENSORBOARD_PROXY_URL", "/proxy/%PORT%/")
    nb, s = execute(NAMES[1], _small(tmp_path, precision="mixed_bfloat16", plot_every=16),
                    tmp_path, monkeypatch)
    assert re.search(r'"/proxy/\d+/"', _html(nb)), _html(nb)[-1000:]
    assert s["policy"] == "mixed_bfloat16" and s["loss_scaled"] is False
    assert s["steps"] == 2 * 1024 // 32
    assert s["skipped_steps"] == 0
    assert s["initial_loss_scale"] == s["final_loss_scale"] == 1.0
    assert s["val_accuracy"] >= 0.80


@pytest.mark.slow
@IN_THE_IMAGE
def test_03_benchmark_table_chart_and_json(tmp_path, monkeypatch):
    params = dict(model_name="mlp", dataset="synthetic", policies="float32,mixed_bfloat16",
                  epochs=2, warmup_epochs=1, repeats=1, batch_size=64, max_train_samples=512,
                  max_val_samples=128, workspace=str(tmp_path / "ws"))
    nb, s = execute(NAMES[2], params, tmp_path, monkeypatch, timeout=900)
    assert s["status"] == "ok"
    assert s["policies_run"] == ["float32", "mixed_bfloat16"]
    assert all(v and v > 0 for v in s["samples_per_second"].values())
    assert s["speedup_vs_float32"]["float32"] == pytest.approx(1.0)
    out = Path(s["output"])
    assert out.parent == tmp_path / "ws" / "benchmarks"
    report = json.loads((out / "benchmark.json").read_text())
    assert report["settings"]["model"] == "mlp" and report["settings"]["repeats"] == 1
    # The notebook rendered the table and the chart.
    data = [o.get("data", {}) for c in nb.cells for o in c.get("outputs", [])]
    assert any("mixed_bfloat16" in d.get("text/markdown", "") for d in data)
    assert any("image/png" in d for d in data)


@pytest.mark.slow
@IN_THE_IMAGE
def test_04_check_names_the_layer_and_the_fixed_model_trains(tmp_path, monkeypatch):
    from app.machine import kernels

    # Its model has a Conv2D: trained in bfloat16 where this TensorFlow runs bfloat16
    # convolutions here (app.machine.kernels), else in float32 (check under mixed_float16 proves
    # the fix either way).
    policy = "mixed_bfloat16" if kernels.support("mixed_bfloat16").runs("Conv2D") else "float32"
    params = dict(workspace=str(tmp_path / "ws"), train_precision=policy, epochs=3)
    nb, s = execute(NAMES[3], params, tmp_path, monkeypatch)
    assert s["check_policy"] == "mixed_float16"
    assert s["verdict_before"] == "blocked" and s["blocked_layers"] == ["center"]
    assert s["verdict_after"] in ("ready", "ready with warnings")
    assert s["train_policy"] == policy and s["status"] == "completed"
    assert s["val_accuracy"] >= 0.9
    assert "self.compute_dtype" in _all_text(nb)   # the fix, as check printed it


@pytest.mark.slow
@IN_THE_IMAGE
def test_05_tune_then_train_with_the_result(tmp_path, monkeypatch):
    params = dict(model_name="mlp", dataset="synthetic", precisions="float32,mixed_bfloat16",
                  memory_budget="1GiB", max_batch=32, steps=1, epochs=1,
                  max_train_samples=512, workspace=str(tmp_path / "ws"))
    nb, s = execute(NAMES[4], params, tmp_path, monkeypatch, timeout=900)
    assert Path(s["output"]).parent == tmp_path / "ws" / "tune"
    assert set(s["precisions"]) == {"float32", "mixed_bfloat16"}
    assert all(e["max_batch"] == 32 for e in s["precisions"].values())   # the cap fits
    assert s["verified"] is True
    assert (s["trained_policy"], s["trained_batch_size"]) == (s["choice"]["precision"],
                                                              s["choice"]["batch_size"])
    assert s["learning_rate"] == pytest.approx(1e-3 * s["trained_batch_size"] / 128)
    assert (Path(s["output"]) / "tune.png").exists()
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
              if "image/png" in o.get("data", {})]
    assert images, "the curves were not shown"


@pytest.mark.slow
@IN_THE_IMAGE
def test_06_the_sentinel_names_the_rows_and_the_layer_and_both_fixes_train(tmp_path, monkeypatch):
    nb, s = execute(NAMES[5], dict(workspace=str(tmp_path / "ws")), tmp_path, monkeypatch)
    assert s["data_blocker"] == "2 of the 512 training rows hold NaN or inf: rows 97, 301 of x_train"
    assert (s["data_status"], s["data_verdict"], s["rows_named"]) == ("diverged", "data", [97, 301])
    assert s["repaired_status"] == "completed" and s["repaired_val_accuracy"] >= 0.75
    assert (s["overflow_policy"], s["overflow_status"]) == ("mixed_float16", "diverged")
    assert (s["overflow_layer"], s["overflow_verdict"], s["flag"]) == (
        "amplify", "precision", "--float32-layers amplify")
    assert (s["fixed_status"], s["fixed_float32_layers"], s["fixed_epochs"]) == (
        "completed", "amplify", 2)
    assert s["fixed_val_accuracy"] >= 0.75   # float32 holds the output and the model learns
    shown = _all_text(nb)   # the sentinel's block, as a notebook shows a run's stderr
    assert re.search(r"where it began: the input batch: .*rows 97, 301 of x_train", shown), shown
    assert "where it began: layer 'amplify' (Amplify, computing in float16)" in shown


# Trials stood in for (no TensorFlow, no child processes): sizes up to 16 fit in the search,
# and the longer verification run of every one of them goes over the budget.
FAILED_VERIFICATION = """
from app.tuner import tuning as _api
from app.tuner.search import Outcome as _Outcome


class _Runner:
    def __init__(self, base, workdir, **kw):
        pass

    def __call__(self, policy, batch, any_fit, phase="search", **kw):
        if batch <= 16:
            return _Outcome(True, (100 + batch) * 2**20, 100.0 * batch, "", 0.1)
        return _Outcome(False, None, None, "resident memory passed the budget", 0.1)

    def verify(self, policy, batch, steps):
        return _Outcome(False, None, None, "killed by SIGKILL (the kernel's out-of-memory killer)", 0.1)


_api.TrialRunner = _Runner
_api.collect_environment = lambda: {"hardware": {"gpus": []}, "auto_precision": {"policy": "float32"}}
"""


def test_05_a_failed_verification_is_reported_in_words(tmp_path, monkeypatch):
    params = dict(model_name="mlp", dataset="synthetic", precisions="float32",
                  memory_budget="1GiB", max_batch=32, steps=1, epochs=1,
                  max_train_samples=512, workspace=str(tmp_path / "ws"))
    nb, s = execute(NAMES[4], params, tmp_path, monkeypatch, timeout=300,
                    prelude=FAILED_VERIFICATION)
    assert s["choice"] is None and s["verified"] is False and s["trained_policy"] is None
    text = _all_text(nb)
    assert "verification failed: no float32 size held the budget" in text
    assert "did not hold over" in text and "not training" in text
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
