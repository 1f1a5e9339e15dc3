"""The architecture as rules that fail when broken (docs/architecture.md, "Import rules").

* import-linter's contracts in pyproject.toml: layers import only downward, the features never
  import each other, no command imports another; a rule broken on purpose (an upward import,
  one command importing another) must make them fail;
* no module imports another module's ``_private`` name;
* the modules that run before TensorFlow may be imported (the command line, the GPU probe, the
  pure planning and search modules) load no TensorFlow, checked in a fresh interpreter;
* docs/architecture.md lists the same layers as the contract.
"""
from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.paths import ROOT

pytestmark = pytest.mark.host_only(reason="reads the source tree and pyproject.toml with "
                                          "import-linter, which the image does not ship")


def _tomllib():
    try:
        import tomllib  # novermin  (3.11+; tomli below, as pyproject's test extra says)
    except ModuleNotFoundError:  # Python < 3.11
        import tomli as tomllib
    return tomllib


def contracts(root: Path = ROOT) -> list:
    with open(root / "pyproject.toml", "rb") as fh:
        return _tomllib().load(fh)["tool"]["importlinter"]["contracts"]


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    exe = shutil.which("lint-imports")
    assert exe, "import-linter is not installed (pip install -e '.[test]')"
    return subprocess.run([exe, "--no-cache"], cwd=root, capture_output=True, text=True,
                          timeout=120, env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})


def test_the_import_contracts_hold():
    proc = lint_imports(ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    kept = re.findall(r"^(.+) KEPT$", proc.stdout, re.M)
    assert len(kept) == len(contracts()) >= 2, proc.stdout


@pytest.mark.parametrize("where, line, contract", [
    # the core importing a command: upward
    ("app/core/catalog.py", "from app.commands import train as _upward", "layers"),
    # one feature importing another
    ("app/doctor/report.py", "from app.tuner import search as _sideways", "layers"),
    # the core importing training, precision importing machine: upward, from modules the
    # layers once left out (only training.job and precision.policy were named)
    ("app/core/files.py", "from app.training import tuned as _upward", "layers"),
    ("app/precision/loss_scale.py", "from app.machine import memory as _upward", "layers"),
    # one command importing another
    ("app/commands/check.py", "from app.commands import train as _other_command", "commands"),
])
def test_a_broken_rule_fails_the_contract(tmp_path, where, line, contract):
    shutil.copytree(ROOT / "app", tmp_path / "app",
                    ignore=shutil.ignore_patterns("__pycache__", "*.ipynb"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / where
    target.write_text(target.read_text() + f"\n{line}\n")
    proc = lint_imports(tmp_path)
    assert proc.returncode != 0, proc.stdout
    name = next(c["name"] for c in contracts() if c["id"] == contract)
    assert f"{name} BROKEN" in proc.stdout, proc.stdout


def test_every_part_of_the_package_is_in_a_layer():
    """A module no layer names is checked by nothing: import-linter leaves it free."""
    [layers] = [c["layers"] for c in contracts() if c["id"] == "layers"]
    named = {m.strip() for layer in layers for m in layer.split("|")}
    parts = {f"app.{p.stem if p.is_file() else p.name}" for p in (ROOT / "app").iterdir()
             if (p.is_dir() and (p / "__init__.py").exists())
             or (p.suffix == ".py" and p.stem not in ("__init__", "__main__"))}
    assert parts - named == set(), "in no layer of pyproject.toml"
    assert named - parts == set(), "layers naming what app/ does not hold"


def _private_imports():
    for path in sorted((ROOT / "app").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("app"):
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        yield f"{path.relative_to(ROOT)}: from {node.module} import {alias.name}"


def test_no_module_imports_another_modules_private_name():
    assert list(_private_imports()) == []


# Imported before TensorFlow is (tfmp --help, the benchmark's and the tuner's parent
# processes, the GPU banner at container start): they must not load it themselves.
TF_FREE = [
    "app.cli", "app.core.args", "app.core.catalog", "app.core.errors", "app.core.exit_codes",
    "app.core.files", "app.core.launch", "app.core.settings", "app.task.float32_layers",
    "app.commands.benchmark", "app.commands.check", "app.commands.env",
    "app.commands.flags", "app.commands.notebooks", "app.commands.train", "app.commands.tune",
    "app.machine.gpu_probe", "app.machine.gpu_problems", "app.machine.hardware",
    "app.precision.policy", "app.training.config", "app.training.tuned",
    "app.run_folder.lock", "app.numerics.limits", "app.numerics.rules",
    "app.numerics.diagnosis",
    "app.tuner.search", "app.tuner.budget", "app.tuner.report", "app.tuner.runner",
    "app.tuner.arguments", "app.tuner.tuning", "app.benchmark.plan", "app.benchmark.stats",
    "app.benchmark.diagnose", "app.benchmark.runner", "app.benchmark.suite",
]

_CHECK_EACH = """
import importlib, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
    if "tensorflow" in sys.modules:
        print(name)
        break
"""


def test_modules_that_run_before_tensorflow_do_not_import_it():
    proc = subprocess.run([sys.executable, "-c", _CHECK_EACH, *TF_FREE], cwd="/",
                          capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "", f"{proc.stdout.strip()} imports TensorFlow"


def _documented_layers() -> list:
    text = (ROOT / "docs/architecture.md").read_text()
    block = re.search(r"<!-- layers -->\n```text\n(.*?)```", text, re.S)
    assert block, "docs/architecture.md has no '<!-- layers -->' block"
    return [line.split("#")[0].strip() for line in block.group(1).splitlines()
            if line.split("#")[0].strip()]


def test_the_documented_layers_are_the_contracts_layers():
    layers = next(c["layers"] for c in contracts() if c["id"] == "layers")
    assert _documented_layers() == layers
