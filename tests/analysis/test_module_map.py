"""One map of ``objreg.analysis``: docs/analysis.md's module table ("Where the code is") and each
room's docstring name every module of the package, and nothing that is not one."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

import objreg.analysis

ANALYSIS = Path(objreg.analysis.__file__).parent
DOCS = Path(__file__).resolve().parents[2] / "docs" / "analysis.md"
ROOMS = ("run", "probe", "math", "parallel")


def modules() -> set[str]:
    """Every module of objreg.analysis, dotted below it (``probe.engine``, ``records``), packages left out."""
    return {".".join(p.relative_to(ANALYSIS).with_suffix("").parts)
            for p in ANALYSIS.rglob("*.py") if p.name != "__init__.py"}


def docs_map(page: str) -> set[str]:
    """The modules docs/analysis.md's table names (the backticked names of its first column)."""
    section = page.split("## Where the code is", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return {name for row in rows for name in re.findall(r"`([\w.]+)`", row.split(" | ")[0])}


def room_map(room: str) -> set[str]:
    """The modules a room's docstring names (``:mod:`.name```)."""
    doc = importlib.import_module(f"objreg.analysis.{room}").__doc__ or ""
    return {f"{room}.{name}" for name in re.findall(r":mod:`\.(\w+)`", doc)}


def test_the_docs_table_names_every_module_and_only_modules():
    named = docs_map(DOCS.read_text(encoding="utf-8"))
    assert sorted(modules() - named) == [], "modules missing from docs/analysis.md's table"
    assert sorted(named - modules()) == [], "docs/analysis.md's table names modules that do not exist"


@pytest.mark.parametrize("room", ROOMS)
def test_each_room_docstring_names_its_modules_and_only_them(room):
    own = {m for m in modules() if m.startswith(f"{room}.")}
    named = room_map(room)
    assert sorted(own - named) == [], f"modules missing from objreg.analysis.{room}'s docstring"
    assert sorted(named - own) == [], f"objreg.analysis.{room}'s docstring names modules that do not exist"


def test_the_map_checks_see_a_missing_and_a_made_up_module():
    """The parsing finds names in a table row and in a docstring (else the tests above pass vacuously)."""
    page = "## Where the code is\n\n| module | what |\n|---|---|\n| `records`, `math.made_up` | x `not.this` |\n\n## Next"
    assert docs_map(page) == {"records", "math.made_up"}
    assert "math.made_up" not in modules() and "probe.engine" in modules()
    assert "probe.engine" in room_map("probe")
