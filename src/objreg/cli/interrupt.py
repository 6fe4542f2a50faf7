"""Ctrl-C (SIGINT) and SIGTERM during ``objreg analyze``: stop cleanly, say how to continue.

During training the first signal asks the run to stop once the step in flight has finished (its
checkpoint written, with ``--out``); a second one stops at once, abandoning that step (the
previous step's checkpoint stays: checkpoints are replaced atomically). Before training (while
loading) the first signal stops at once. Either way the command then prints the exact
``objreg analyze --resume DIR`` that continues the run, or says why there is nothing to resume,
and exits with ``128 + the signal's number`` (130 for Ctrl-C, 143 for SIGTERM).

Under ``torchrun`` (several processes) the handlers are not installed: the processes could stop
after different steps and leave each other waiting in a collective; torchrun's own handling
stops them all, and ``--resume`` continues from the last checkpoint as after ``kill -9``.
"""

from __future__ import annotations

import os
import shlex
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stopped(KeyboardInterrupt):
    """The run was stopped by a signal (a ``KeyboardInterrupt``, so whatever cleans up after one
    cleans up after this). ``signum``: the signal; ``abandoned``: the step in flight was dropped."""

    def __init__(self, signum: int, abandoned: bool):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.abandoned = abandoned


class Interrupts:
    """Installs the handlers for the ``with`` block (see the module docstring).

    Args:
        notify: Told, in a sentence, that the run will stop after the step in flight.
        installed: Install the handlers (False under torchrun, or off the main thread).
        unit: What the first signal lets finish (``objreg screen``: a candidate's run).
    """

    def __init__(self, notify: Callable[[str], None], installed: bool = True, unit: str = "step"):
        self.notify = notify
        self.unit = unit
        self.installed = installed and threading.current_thread() is threading.main_thread()
        self.training = False
        self.requested: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> Interrupts:
        if self.installed:
            for signum in SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.training and self.requested is None:
            self.requested = signum
            name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
            self.notify(f"{name}: stopping once the {self.unit} in flight has finished; {name} again stops at once "
                        f"(that {self.unit} is then lost)")
            return
        raise Stopped(signum, abandoned=self.training)

    def after_step(self, step: int, total: int) -> None:
        """Called after every finished step: stop here if a stop was asked for (unless this was the
        last step; the report is then moments away)."""
        if self.requested is not None and step < total - 1:
            raise Stopped(self.requested, abandoned=False)


def stopped_message(stop: Stopped, out_dir: str | None, finished: int, total: int | None) -> str:
    """What the command prints when a run was stopped: where it stopped and how to continue."""
    from objreg.analysis.run.resume import CHECKPOINT  # with the trainer's modules, loaded by then

    of = f" of {total}" if total else ""
    if stop.abandoned:
        where = f"Stopped with {finished}{of} steps done (the step in flight was abandoned)."
    elif finished:
        where = f"Stopped with {finished}{of} steps done."
    else:
        where = "Stopped before training started."
    if out_dir is None:
        return f"{where} Nothing to resume: the run had no --out DIR (give one to make a run resumable)."
    if not (Path(out_dir) / CHECKPOINT).is_file():
        return (f"{where} Nothing to resume: no step had finished, so {out_dir} has no checkpoint; "
                f"start the run again.")
    return f"{where} Continue the run with:\n  objreg analyze --resume {shlex.quote(out_dir)}"


def exit_code(stop: Stopped) -> int:
    """The shell's convention for a process ended by a signal."""
    return 128 + stop.signum


def distributed() -> bool:
    """Whether torchrun started several processes."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1") or 1) > 1
    except ValueError:  # malformed: the library refuses it in one line
        return False
