"""A run directory (``--out DIR``): one owner at a time.

Besides the outputs (:mod:`objreg.analysis.probe.writer`) and the fingerprint
(:mod:`objreg.analysis.run.fingerprint`: ``run.json`` and ``tokenizer.json``), a run directory holds
``.objreg.lock``: locked (``fcntl.flock``, exclusive) by the process running in the directory, for
the life of the run; a second run or resume on it is refused at once. The kernel drops the lock
when the process ends, however it ends. An unfinished run leaves the file (removing a lock file
races with a process about to lock it; its presence also marks the directory as one objreg ran
in); a finished run removes it, with the lock still held, as its last act
(:meth:`RunDirectory.release` with ``finished``): a racing process could then lock only a
directory that every run refuses (it holds ``report.json``), and the fingerprint ``run.json``
marks the directory as objreg's.

A fresh run (:func:`claim`) refuses a directory that holds a finished run, an interrupted run
(pointing to ``--resume``) or files objreg did not write; it may take over a directory where an
objreg run stopped before finishing its first step (nothing there can be resumed). Stale
temporary files of an interrupted atomic write are removed once the lock is held. No file of a
run is written through a symbolic link: a directory where one stands in a run file's place (or the
lock file's) is refused, fresh or resumed.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path

from objreg.core.errors import DataError, InvalidParameterError
from objreg.toolkit.atomic import remove_stale_temporaries

LOCK_FILE = ".objreg.lock"
#: Every file a run writes into its directory (the lock file aside).
RUN_FILES = ("config.json", "steps.jsonl", "checkpoint.pt", "report.json", "report.csv", "alignment.png",
             "taylor.png", "spectrum.png", "run.json", "tokenizer.json", "model")

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: runs are not locked
    fcntl = None  # type: ignore[assignment]


# -- ownership --------------------------------------------------------------------------------------


class RunDirectory:
    """A run directory this process holds the lock of (:func:`claim`); :meth:`release` at the end."""

    def __init__(self, path: Path, lock: int | None):
        self.path = path
        self._lock = lock

    def release(self, finished: bool = False, result: str = "report.json") -> None:
        """Drop the lock; ``finished`` (the run wrote its ``result``): remove the lock file first."""
        if self._lock is None:
            return
        if finished and (self.path / result).is_file():
            with contextlib.suppress(OSError):
                (self.path / LOCK_FILE).unlink()
        os.close(self._lock)  # closing the descriptor drops the flock
        self._lock = None

    def __enter__(self) -> RunDirectory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def claim(path: str | os.PathLike[str], *, resume: bool, option: str = "--out") -> RunDirectory:
    """Create (if needed) and lock the run directory ``path``; for a fresh run (``resume`` False),
    check that it holds no other run; then remove stale temporary files.

    Raises:
        InvalidParameterError: another process holds it; it holds a finished or interrupted run
            or foreign files (fresh run); it is not a directory.
        DataError: it cannot be created or locked.
    """
    directory = Path(path)
    shown = str(directory)
    if directory.exists() and not directory.is_dir():
        raise InvalidParameterError(f"{option} {shown!r} exists and is not a directory")
    check_no_links(directory, (LOCK_FILE, *RUN_FILES), option)
    if not resume:
        # Before anything is created there: a directory of someone else's files stays untouched.
        _check_not_foreign(directory, option)
    run_dir = lock(directory, option)
    try:
        if not resume:
            _check_fresh(directory, option)
        remove_stale_temporaries(directory, RUN_FILES)
    except BaseException:
        run_dir.release()
        raise
    return run_dir


#: The files ``objreg screen --out`` writes (its result first).
SCREEN_FILES = ("screen.json", "screen.png")


def claim_for(path: str | os.PathLike[str], files: tuple[str, ...], what: str, option: str = "--out") -> RunDirectory:
    """Create (if needed) and lock ``path`` for a command that writes ``files`` there (its result
    first), before it does any work: refused where one of them is a link, where a result is
    already there (never overwritten), or where nothing can be written (checked by writing).

    Raises:
        InvalidParameterError: it is not a directory, in use, holds a link or an earlier result.
        DataError: it cannot be created, locked or written.
    """
    directory = Path(path)
    shown = str(directory)
    if directory.exists() and not directory.is_dir():
        raise InvalidParameterError(f"{option} {shown!r} exists and is not a directory")
    check_no_links(directory, (LOCK_FILE, *files), option)
    run_dir = lock(directory, option, what)
    try:
        present = [name for name in files if (directory / name).exists()]
        if present:
            raise InvalidParameterError(f"{option} {shown!r} already holds {', '.join(present)} of an earlier "
                                        f"{what}; choose another directory or remove them")
        remove_stale_temporaries(directory, files)
        try:  # a read-only or forbidden directory, now rather than after the work
            with tempfile.TemporaryFile(dir=directory):
                pass
        except OSError as e:
            raise DataError(f"cannot write in {option} {shown!r}: {e.strerror or e}") from None
    except BaseException:
        run_dir.release()
        raise
    return run_dir


def lock(directory: Path, option: str = "--out", what: str = "objreg run") -> RunDirectory:
    """Create ``directory`` (if needed) and hold its lock file, exclusively, until released.

    Raises:
        InvalidParameterError: another process holds it.
        DataError: it cannot be created or locked (the lock file a symbolic link, say).
    """
    shown = str(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
        fd = os.open(directory / LOCK_FILE, flags, 0o644)
    except OSError as e:
        raise DataError(f"cannot use {option} {shown!r}: {e.strerror or e}") from None
    if fcntl is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = _read_pid(fd)
            os.close(fd)
            who = f" (pid {holder})" if holder else ""
            raise InvalidParameterError(
                f"{option} {shown!r} is in use by another {what}{who}; wait for it to end or choose another directory"
            ) from None
        _write_pid(fd)
    return RunDirectory(directory, fd)


def check_no_links(directory: Path, names: tuple[str, ...], option: str) -> None:
    """No file a run writes may be a symbolic link: it would be written through, outside the directory.

    Raises:
        InvalidParameterError: naming the link.
    """
    if not directory.is_dir():
        return
    for name in names:
        if (directory / name).is_symlink():
            raise InvalidParameterError(
                f"{option} {str(directory)!r}: {name} is a symbolic link; objreg writes no file of a run through a "
                f"link (it would change a file outside the directory): remove it, or choose another directory")


def _present(directory: Path) -> list[str]:
    return [name for name in RUN_FILES if (directory / name).exists()] if directory.is_dir() else []


def _check_not_foreign(directory: Path, option: str) -> None:
    """Files a run writes, in a directory objreg never ran in (no lock file, no fingerprint of
    objreg's): someone else's."""
    present = _present(directory)
    if present and not (directory / LOCK_FILE).exists() and not _fingerprinted(directory):
        raise InvalidParameterError(
            f"{option} {str(directory)!r} holds files objreg did not write there ({', '.join(present)}); "
            f"choose an empty or new directory"
        )


def _fingerprinted(directory: Path) -> bool:
    """Whether ``run.json`` is an objreg run's fingerprint (it names the objreg version it ran)."""
    try:
        data = json.loads((directory / "run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and {"objreg", "settings"} <= set(data)


def _check_fresh(directory: Path, option: str) -> None:
    """With the lock held: a fresh run's directory must hold no other run (module docstring)."""
    present = _present(directory)
    shown = str(directory)
    if "report.json" in present:
        raise InvalidParameterError(
            f"{option} {shown!r} already holds a finished run (report.json); choose another directory or remove it"
        )
    if "checkpoint.pt" in present:
        raise InvalidParameterError(
            f"{option} {shown!r} holds an interrupted run: continue it with `objreg analyze --resume {shown}`, "
            f"or choose another directory"
        )
    # Otherwise an objreg run started here and finished no step: nothing to resume; take it over.


def _read_pid(fd: int) -> str:
    """The holder's pid from the lock file's first line, or "" (another program may have written a
    shorter pid over a longer one without truncating, or anything else)."""
    try:
        first = os.pread(fd, 32, 0).decode("ascii", "replace").split("\n", 1)[0].strip()
    except OSError:
        return ""
    return first if first.isdigit() else ""


def _write_pid(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
