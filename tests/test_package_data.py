"""Data the library reads at run time ships in the package: every file under src/objreg/data is
matched by pyproject.toml's package-data patterns, so an installed copy finds it too."""

from __future__ import annotations

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "src" / "objreg"


def test_every_data_file_is_package_data():
    patterns = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["objreg"]
    files = [p for p in (PACKAGE / "data").rglob("*") if p.is_file()]
    assert files, "src/objreg/data holds the packaged results"
    unshipped = [str(p.relative_to(PACKAGE)) for p in files
                 if not any(p.relative_to(PACKAGE).match(pattern) for pattern in patterns)]
    assert unshipped == []
