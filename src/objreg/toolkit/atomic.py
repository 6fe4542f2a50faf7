"""Atomic file writes: a run killed mid-write leaves the old file or the new one, never half of one."""

from __future__ import annotations

import contextlib
import glob
import os
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary path beside ``path`` for the caller to write (e.g. a library that saves to a
    path); on success the file is synced and renamed over ``path``, on any error removed."""
    path = Path(path)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    try:
        # mkstemp makes the file private (0600); the result should have the mode an ordinary
        # open() would give it, as every other output of a run has.
        os.chmod(tmp, 0o666 & ~_umask())
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as error:
        tmp.unlink(missing_ok=True)
        if isinstance(error, OSError) and error.filename in (None, str(tmp), tmp):
            error.filename = str(path)  # a full disk is reported for the file being written, not its temporary
        raise


@contextlib.contextmanager
def atomic_file(path: Path, mode: str = "wb") -> Iterator[IO[Any]]:
    """:func:`atomic_path` opened for writing: ``mode`` ``"wb"`` or ``"w"`` (UTF-8)."""
    with atomic_path(path) as tmp, open(tmp, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
        yield f


def _umask() -> int:
    """The process's umask (reading it means setting it, so it is set straight back)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def temporary_name_pattern(name: str) -> str:
    """The glob pattern of :func:`atomic_path`'s temporary files for a file called ``name``."""
    return f".{glob.escape(name)}.*.tmp"


def remove_stale_temporaries(directory: Path, names: Iterable[str] | None = None, older_than: float = 0.0) -> list[Path]:
    """Remove temporary files an interrupted :func:`atomic_path` left in ``directory``: those of
    the files ``names`` (every ``.NAME.*.tmp`` when None) last modified more than ``older_than``
    seconds ago. Only call it where no other process may be writing them (a locked run directory),
    or with an age no write takes (a shared cache). Returns what was removed."""
    removed = []
    patterns = [temporary_name_pattern(n) for n in names] if names is not None else [".*.tmp"]
    now = time.time()
    for pattern in patterns:
        for path in sorted(Path(directory).glob(pattern)):
            try:
                if path.is_file() and not path.is_symlink() and now - path.stat().st_mtime >= older_than:
                    path.unlink()
                    removed.append(path)
            except OSError:
                continue  # gone already, or not ours to remove: leave it
    return removed
