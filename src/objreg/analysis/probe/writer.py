"""A run directory's files, written as they become available.

``config.json`` at the start; ``steps.jsonl`` gets one line per finished probe, flushed and
fsynced as it is written, so a crash keeps every finished step; ``report.csv`` and
``report.json`` are written to a temporary file and renamed into place, so each is either absent
or complete; the PNG plots follow (:mod:`objreg.analysis.probe.plots`), and ``report.json`` comes last.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from objreg.analysis.probe.report import AlignmentReport, report_csv
from objreg.analysis.records import StepRecord
from objreg.core.errors import DataError
from objreg.toolkit.atomic import atomic_file


class RunWriter:
    """Writes a run's outputs into ``out_dir`` as they become available (see the module docstring).

    Raises:
        DataError: ``out_dir`` cannot be created or is not writable.
    """

    def __init__(self, out_dir: Path | str):
        self.out_dir = Path(out_dir)
        try:
            self.out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise DataError(f"cannot create output directory {str(self.out_dir)!r}: {e.strerror}") from None
        if not os.access(self.out_dir, os.W_OK):
            raise DataError(f"output directory {str(self.out_dir)!r} is not writable")
        self.steps_path = self.out_dir / "steps.jsonl"

    def write_config(self, config: dict[str, Any]) -> None:
        write_atomic(self.out_dir / "config.json", json.dumps(config, indent=2, allow_nan=False))

    def start_steps(self) -> None:
        """Begin a fresh ``steps.jsonl`` for this run (a new file: a link in its place is replaced,
        never written through)."""
        write_atomic(self.steps_path, "")

    def rewrite_steps(self, steps: list[StepRecord]) -> None:
        """Replace ``steps.jsonl`` with ``steps`` (atomically): a resumed run's finished probes."""
        write_atomic(self.steps_path, "".join(json.dumps(step, allow_nan=False) + "\n" for step in steps))

    def append_step(self, step: StepRecord) -> None:
        """One line more in ``steps.jsonl``, synced (never through a symbolic link).

        Raises:
            DataError: ``steps.jsonl`` is a symbolic link.
        """
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
        try:
            fd = os.open(self.steps_path, flags, 0o666)
        except OSError as e:
            if not self.steps_path.is_symlink():
                raise
            raise DataError(f"{str(self.steps_path)!r} is a symbolic link: objreg writes no run file through a "
                            f"link") from e
        with os.fdopen(fd, "a", encoding="utf-8") as f:
            f.write(json.dumps(step, allow_nan=False) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def write_report(self, report: AlignmentReport, plots: bool = True) -> list[Path]:
        """``report.csv``, the PNG plots, then ``report.json`` (the files atomically); returns every path."""
        write_atomic(self.out_dir / "report.csv", report_csv(report))
        written = [self.out_dir / "report.csv"]
        if plots:
            from objreg.analysis.probe.plots import write_plots  # matplotlib: only when plots are written

            written += write_plots(report.to_dict(), self.out_dir)
        # Last, so a complete report.json means every other output is in place.
        write_atomic(self.out_dir / "report.json", report.to_json())
        return [self.out_dir / "report.json", *written]


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a synced temporary file and an atomic rename."""
    with atomic_file(path, "w") as f:
        f.write(text)
