"""docs/training.md's table of flags and variables says what ``app.core.settings`` declares:
every setting's flag in one row, beside exactly its ``TFMP_`` variable.  The table said six
flags had no variable ("–": --initial-loss-scale, --max-skipped-steps, --image-size,
--resume, --no-save-model, --progress) while train read, and refused, all six."""
from __future__ import annotations

import re

import pytest

from app.core import settings
from tests.paths import ROOT

pytestmark = pytest.mark.host_only(reason="docs/ is not shipped in the image")


def _without_parentheses(text: str) -> str:
    """A cell without its explanations, ``(what `--early-stop` watches ...)``: the flags a
    row is about are the code spans left (innermost parentheses first, links included)."""
    while True:
        shorter = re.sub(r"\([^()]*\)", "", text)
        if shorter == text:
            return text
        text = shorter


def flag_table_rows():
    """(flags, variables) of each row of the "Flags and environment variables" table."""
    text = (ROOT / "docs" / "training.md").read_text(encoding="utf-8")
    section = text.split("## Flags and environment variables", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) < 2 or not cells[0].startswith("`--"):
            continue
        flags = re.findall(r"`(--[a-z0-9-]+)", _without_parentheses(cells[0]))
        rows.append((flags, re.findall(r"TFMP_[A-Z0-9_]+", cells[1])))
    return rows


def test_every_flag_has_one_row_with_exactly_its_variable():
    rows = flag_table_rows()
    by_flag = {s.flag: s for s in settings.SETTINGS}
    listed = [flag for flags, _ in rows for flag in flags]
    assert sorted(listed) == sorted(by_flag), "flags missing or extra in docs/training.md"
    for flags, variables in rows:
        assert variables == [by_flag[f].env for f in flags], (flags, variables)
