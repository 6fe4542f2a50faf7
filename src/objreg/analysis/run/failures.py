"""Resource failures as one line that says what to change.

A full disk, a read-only or forbidden directory, or running out of memory are not bugs: each
becomes a :class:`objreg.ResourceError` naming the file or the sizes involved. An exception from
an installed plugin's code is not objreg's bug either: it becomes a :class:`objreg.PluginFailure`
naming the plugin, hook and distribution (:mod:`objreg.core.guard`). The library raises them
from :func:`objreg.analyze` (:func:`resource_errors`); the CLI turns the same failures met
elsewhere (another command) into the same line (:func:`describe`).
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from objreg.core.errors import ObjregError, ResourceError
from objreg.core.guard import failure as plugin_failure

_MEMORY_MARKERS = ("out of memory", "can't allocate memory", "cannot allocate memory", "CUDA error: out of memory")
MEMORY_HINT = "lower --batch-size, --seq-len, --eval-size, --head-fit-size or --spectrum, or use a smaller --model"


def describe(
    error: BaseException, out_dir: str | os.PathLike[str] | None = None, pm: Any = None
) -> ObjregError | None:
    """The one-line error for ``error``: a :class:`ResourceError`, or (with the plugin manager
    ``pm``) the :class:`PluginFailure` of a third-party plugin's exception; None for anything
    else (an :class:`ObjregError` already is one line; other exceptions are bugs)."""
    if isinstance(error, ObjregError):
        return None
    resource = _resource(error, out_dir)
    return resource if resource is not None else plugin_failure(pm, error)


def _resource(error: BaseException, out_dir: str | os.PathLike[str] | None) -> ResourceError | None:
    if isinstance(error, MemoryError) or (
        isinstance(error, RuntimeError) and any(m in str(error) for m in _MEMORY_MARKERS)
    ):
        return ResourceError(f"out of memory: {MEMORY_HINT}")
    if isinstance(error, OSError) and error.errno is not None:
        where = _where(error, out_dir)
        resumable = out_dir is not None and (Path(out_dir) / "checkpoint.pt").is_file()
        resume = f"; then continue with --resume {out_dir}" if resumable else "; then run again"
        if error.errno in (errno.ENOSPC, errno.EDQUOT):
            return ResourceError(f"no space left on the device writing {where}: free some space or choose another "
                                 f"--out{resume}")
        if error.errno == errno.EFBIG:
            return ResourceError(f"file too large writing {where}: a limit on file size stops it (ulimit -f); raise "
                                 f"the limit or choose another --out{resume}")
        if error.errno == errno.ENOMEM:
            return ResourceError(f"out of memory: {MEMORY_HINT}")
        if error.errno == errno.EROFS:
            return ResourceError(f"cannot write {where}: the file system is read-only; choose another directory")
        if error.errno in (errno.EACCES, errno.EPERM):
            return ResourceError(f"cannot write {where}: permission denied; choose a directory you can write")
        if error.errno == errno.EMFILE or error.errno == errno.ENFILE:
            return ResourceError("too many open files: raise the limit (ulimit -n) or close other programs")
        if error.errno == errno.EIO:
            return ResourceError(f"input/output error at {where}: the disk or network file system failed")
    return None


def _where(error: OSError, out_dir: str | os.PathLike[str] | None) -> str:
    if error.filename is not None:
        name = os.fsdecode(error.filename) if isinstance(error.filename, (bytes, str, os.PathLike)) else str(error.filename)
        return repr(_readable(name))
    return repr(str(out_dir)) if out_dir is not None else "a file"


def _readable(name: str) -> str:
    """A temporary file of an atomic write (``.report.json.x1y2.tmp``) is named as the file it replaces."""
    path = Path(name)
    if path.name.startswith(".") and path.name.endswith(".tmp") and path.name.count(".") >= 3:
        return str(path.with_name(path.name[1:].rsplit(".", 2)[0]))
    return name


@contextlib.contextmanager
def resource_errors(out_dir: str | os.PathLike[str] | None = None, pm: Any = None) -> Iterator[None]:
    """Re-raise resource failures met inside as :class:`ResourceError`, and a third-party plugin's
    exception as its :class:`PluginFailure` (the original as cause)."""
    try:
        yield
    except Exception as error:
        translated = describe(error, out_dir, pm)
        if translated is None:
            raise
        raise translated from error
