"""A file in the current folder named like one of Python's modules (``glob.py``), which
``python -m app`` would import in that module's place, for TensorFlow too: one line, exit 2,
before anything runs."""
import os
import sys

import pytest

from app.core import shadowing
from tests.unit.helpers import ONCE_IN_THE_IMAGE, error_lines, run_app

KERAS_FIRST = "import tensorflow as tf\n\nMODEL = tf.keras.Sequential()\n"


def test_the_standard_library_is_listed_on_every_python(monkeypatch):
    names = shadowing.stdlib_names()
    assert {"glob", "json", "math", "os", "types"} <= names and "numpy" not in names
    # Before 3.10 there is no sys.stdlib_module_names: the library's folders are read.
    monkeypatch.delattr(sys, "stdlib_module_names", raising=False)
    shadowing.stdlib_names.cache_clear()    # it is read once a process
    try:
        read = shadowing.stdlib_names()
    finally:
        shadowing.stdlib_names.cache_clear()
    assert {"glob", "json", "math", "os", "types", "collections"} <= read
    assert not {"numpy", "tensorflow", "site-packages"} & read


def test_namesakes_are_module_files_and_packages_only(tmp_path):
    (tmp_path / "glob.py").write_text("")
    (tmp_path / "json").mkdir()
    (tmp_path / "json" / "__init__.py").write_text("")
    (tmp_path / "types").mkdir()            # a folder that is no package: never imported
    (tmp_path / "mymodel.py").write_text("")
    (tmp_path / "math.txt").write_text("")
    (tmp_path / "keras.py").write_text("")  # a first experiment's name: TensorFlow's own
    assert shadowing.namesakes(str(tmp_path)) == [("glob.py", "glob"), ("json", "json"),
                                                  ("keras.py", "keras")]
    assert shadowing.namesakes(str(tmp_path / "nowhere")) == []


@ONCE_IN_THE_IMAGE
def test_a_file_taking_a_modules_place_is_one_line_and_nothing_runs(tmp_path):
    (tmp_path / "glob.py").write_text("print('my own glob')\n")
    proc = run_app("train", "--dataset", "synthetic", "--epochs", "1", "--output", "run",
                   cwd=str(tmp_path))
    assert proc.returncode == 2, proc.stderr
    assert error_lines(proc.stderr) == [
        f"error: {tmp_path / 'glob.py'} was imported in place of Python's own module 'glob' "
        "(the current folder comes first on the import path); allowed: rename the file, or "
        "run from another folder"]
    assert not (tmp_path / "run").exists()


def test_a_file_that_breaks_tensorflows_import_is_named(tmp_path):
    (tmp_path / "glob.py").write_text(KERAS_FIRST)   # imported by TensorFlow, imports it
    proc = run_app("env", cwd=str(tmp_path))
    assert proc.returncode == 2, proc.stderr
    [line] = error_lines(proc.stderr)
    assert line.startswith("error: TensorFlow failed to import (")
    assert line.endswith(f"with glob.py in {tmp_path}, named like a module it imports, first "
                         "on the import path; allowed: rename the file, or run from another "
                         "folder")
    assert "Traceback" not in proc.stderr


@ONCE_IN_THE_IMAGE
@pytest.mark.parametrize("name", ["test.py", "mymodel.py"])
def test_a_namesake_nothing_imports_is_left_alone(tmp_path, name):
    (tmp_path / name).write_text("raise SystemExit('imported')\n")
    proc = run_app("env", "--json", cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert not error_lines(proc.stderr)


def test_a_console_script_has_no_user_folder_first(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [os.path.dirname(sys.executable)] + sys.path[1:])
    assert shadowing.user_folder() is None
    monkeypatch.setattr(sys, "path", [""] + sys.path[1:])
    assert shadowing.user_folder() == os.getcwd()


def test_a_keras_py_of_ones_own_is_named_as_tensorflows_module(tmp_path):
    (tmp_path / "keras.py").write_text("print('my experiment')\n")
    proc = run_app("env", cwd=str(tmp_path))
    assert proc.returncode == 2, proc.stderr
    [line] = error_lines(proc.stderr)
    assert "keras.py" in line and "rename the file" in line, line
    assert "Traceback" not in proc.stderr


def test_a_notebooks_folder_is_checked_by_the_python_api(tmp_path):
    """A kernel's import path starts with the notebook's folder, as `python -c` does."""
    import subprocess

    from tests.paths import ROOT
    (tmp_path / "glob.py").write_text("x = 1\n")
    script = ("import app\nfrom app.core.errors import UsageError\ntry:\n"
              "    app.train(model='mlp', data='synthetic', epochs=1, output='run')\n"
              "except UsageError as exc:\n    print(exc)\n")
    proc = subprocess.run([sys.executable, "-c", script], cwd=str(tmp_path), text=True,
                          capture_output=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == (
        f"error: {tmp_path / 'glob.py'} was imported in place of Python's own module 'glob' "
        "(the current folder comes first on the import path); allowed: rename the file, or "
        "run from another folder")
    assert not (tmp_path / "run").exists()
