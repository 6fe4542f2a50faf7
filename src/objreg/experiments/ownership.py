"""An experiment's ``--out`` directory has one owner, as ``objreg analyze``'s run directory does
(:mod:`objreg.analysis.run.rundir`): locked for the run's life, so a second experiment on it is
refused at once; a directory that already holds an experiment's result (``result.json``) is
refused rather than overwritten; one holding files an experiment writes but no objreg lock
file is someone else's and left alone; one where an experiment started and did not finish is
taken over. No result is written through a symbolic link.
"""

from __future__ import annotations

import re
from pathlib import Path

from objreg import InvalidParameterError
from objreg.analysis.run.rundir import LOCK_FILE, RunDirectory, check_no_links, lock

RESULT = "result.json"


def _written_by_an_experiment(name: str) -> bool:
    return name == RESULT or name.endswith("-seeds.png") or re.fullmatch(r"seed-\d+", name) is not None


def claim_output(directory: Path, option: str = "--out") -> RunDirectory:
    """Lock ``directory`` for one experiment (created if needed); :meth:`RunDirectory.release` at the end.

    Raises:
        InvalidParameterError: another experiment holds it, it holds a finished experiment's
            result, someone else's files, or a symbolic link in the result's place.
        DataError: it cannot be created or locked.
    """
    shown = str(directory)
    check_no_links(directory, (RESULT, LOCK_FILE), option)
    present = sorted(e.name for e in directory.iterdir() if _written_by_an_experiment(e.name)) \
        if directory.is_dir() else []
    if present and not (directory / LOCK_FILE).exists():
        raise InvalidParameterError(f"{option} {shown!r} holds files objreg did not write there "
                                    f"({', '.join(present[:5])}); choose an empty or new directory")
    held = lock(directory, option, what="objreg experiment")
    if (directory / RESULT).exists():
        held.release()
        raise InvalidParameterError(f"{option} {shown!r} already holds an experiment's result ({RESULT}); choose "
                                    f"another directory or remove it")
    return held
