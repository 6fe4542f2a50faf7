"""A failed atomic write leaves the old file whole and no temporary file behind."""

from __future__ import annotations

import pytest

from objreg.analysis.atomic import atomic_file


def test_success_replaces_and_failure_keeps_the_old_file(tmp_path):
    path = tmp_path / "report.json"
    with atomic_file(path, "w") as f:
        f.write("old")
    with pytest.raises(RuntimeError), atomic_file(path, "w") as f:
        f.write("half of the new")
        raise RuntimeError("killed mid-write")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]
    with atomic_file(path) as f:
        f.write(b"new")
    assert path.read_bytes() == b"new"
