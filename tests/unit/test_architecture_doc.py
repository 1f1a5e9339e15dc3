"""docs/architecture.md names every module of app/ and docker/python/, so that its lists of
"one job each" cannot fall behind the code again (17 modules were missing from them).

How the doc names them: a module at the top of app/ as ``cli.py`` in the tree under
"## `app/`"; a module of a folder as `` `name` `` in the table row of `` `folder/` `` (or a row
of its own, `` `machine/kernels` ``); a module of docker/python/ as `` `name` `` in that
folder's row of the ``docker/`` table.
"""
from __future__ import annotations

import re

import pytest

from tests.paths import ROOT

pytestmark = pytest.mark.host_only(reason="reads docs/, which the image does not ship")

DOC = ROOT / "docs" / "architecture.md"


def _rows(text: str) -> dict:
    """Each table row's first cell (``core/``, ``machine/kernels``) -> the rest of the row."""
    rows = {}
    for line in text.splitlines():
        m = re.match(r"\|\s*`([\w/]+)`\s*\|(.*)\|\s*$", line)
        if m:
            rows[m.group(1)] = m.group(2)
    return rows


def _tree(text: str) -> str:
    """The ``text`` block under "## `app/`": the folders and the top-level modules."""
    section = text.split("## `app/`", 1)[1]
    return section.split("```text", 1)[1].split("```", 1)[0]


def _named(row: str, module: str) -> bool:
    return f"`{module}`" in row


def unnamed_modules(text: str) -> list:
    """The modules of app/ and docker/python/ that the doc does not name, as paths."""
    rows, tree = _rows(text), _tree(text)
    missing = []
    for path in sorted((ROOT / "app").rglob("*.py")):
        rel = path.relative_to(ROOT / "app")
        if path.stem == "__init__" or "__pycache__" in rel.parts:
            continue
        if len(rel.parts) == 1:
            if not re.search(rf"^\s+{re.escape(path.name)}\s", tree, re.M):
                missing.append(f"app/{rel}")
            continue
        folder = "/".join(rel.parts[:-1])
        if not (_named(rows.get(f"{folder}/", ""), path.stem) or f"{folder}/{path.stem}" in rows):
            missing.append(f"app/{rel}")
    for path in sorted((ROOT / "docker" / "python").glob("*.py")):
        if not _named(rows.get("docker/python/", ""), path.stem):
            missing.append(f"docker/python/{path.name}")
    return missing


def test_every_module_is_named_in_the_architecture_doc():
    assert unnamed_modules(DOC.read_text(encoding="utf-8")) == []


def test_a_module_left_out_of_its_row_is_found():
    """The check itself: a module taken out of each kind of place is reported."""
    text = DOC.read_text(encoding="utf-8")
    for gone, path in [("`folders`: ", "app/core/folders.py"),
                       ("`tfmp_token_auth`: ", "docker/python/tfmp_token_auth.py"),
                       ("  __main__.py ", "app/__main__.py")]:
        assert gone in text
        assert unnamed_modules(text.replace(gone, "", 1)) == [path], gone
    # kernels has a row of its own; without it, machine/'s row does not name it
    assert unnamed_modules(text.replace("| `machine/kernels` |", "| kernels |")) == \
        ["app/machine/kernels.py"]
