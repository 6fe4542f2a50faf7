"""A failed atomic write leaves the old file whole and no temporary file behind."""

from __future__ import annotations

import os
import stat

import pytest

from objreg.toolkit.atomic import atomic_file


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


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_written_file_has_the_mode_an_ordinary_open_gives(tmp_path, umask):
    previous = os.umask(umask)
    try:
        with atomic_file(tmp_path / "report.json", "w") as f:
            f.write("{}")
        (tmp_path / "plain.json").write_text("{}")
    finally:
        os.umask(previous)
    mode = stat.S_IMODE((tmp_path / "report.json").stat().st_mode)
    assert mode == stat.S_IMODE((tmp_path / "plain.json").stat().st_mode) == 0o666 & ~umask
