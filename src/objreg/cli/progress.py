"""What ``objreg analyze`` shows on stderr while it runs.

On a terminal: one line per finished stage with its time (loading the corpus, the tokenizer and
the task data, building the model, fitting the downstream head, writing the report), and a live
area with a determinate bar (steps done of all, elapsed time, then the ETA and seconds per step
once the first step is timed) over the latest probe's key numbers: ``D`` before and after the
step, the improvement (positive: ``D`` fell) predicted to first and second order against the
actual one, and each
objective's dot and cosine with ``∇D``. Not on a terminal (``nohup``, CI, ``2> log``): the
same as plain lines, one per stage as it starts and one per probe, each stamped with the
elapsed time, so a log shows progress too.

Only the callbacks of :func:`objreg.analyze` (``on_status``, ``on_step``) feed it: it computes
nothing the report does not hold.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.spinner import Spinner
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from objreg.analysis.records import StepRecord

#: The status line that starts training (``objreg.analysis.run.analyze``).
TRAINING = "training with probes"


def clock_text(seconds: float) -> str:
    """``0:01:05`` for 65.2 seconds."""
    seconds = max(0, int(seconds + 0.5))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def probe_summary(record: StepRecord) -> str:
    """The downstream loss and the actual and predicted improvement of one probe record (the
    report's sign: positive where ``D`` fell), one line."""
    predicted = record["predicted_delta"]
    first, second = -predicted["first_order"], -(predicted["first_order"] + predicted["second_order"])
    return (f"D {record['downstream_loss']:.4f} → {record['downstream_loss_after']:.4f}: "
            f"improvement {-record['actual_delta']:+.4g}, predicted {first:+.4g} (first order), "
            f"{second:+.4g} (with second order)")


def cosine_text(value: float) -> str:
    """A cosine to three decimals, or to one significant digit where that would read ``±0.000``
    (``-3e-04``, not a signed zero)."""
    text = f"{value:+.3f}"
    return f"{value:+.0e}" if value != 0 and float(text) == 0 else text


def alignment_summary(record: StepRecord) -> str:
    """Each objective's dot and cosine with ∇D at one probe, one line."""
    return "; ".join(f"{name} dot {a['dot']:+.4g} cosine {cosine_text(a['cosine'])}"
                     for name, a in record["alignment"].items())


class RunDisplay:
    """Progress of one run on ``console`` (stderr), fed by :meth:`status` and :meth:`step`.

    Args:
        console: Where to draw (stderr).
        total: Steps in the run, when known up front (a resumed run reads its config).
        live: Draw a live display (a terminal) rather than plain lines.
        clock: Seconds, monotonic (tests pass their own).
        lines: Print the finished stages and events (False: the live display alone, which
            leaves nothing behind; what ``--json`` shows on a terminal).
    """

    def __init__(self, console: Console, total: int | None, live: bool,
                 clock: Callable[[], float] = time.monotonic, lines: bool = True):
        self.console = console
        self.total = total
        self.live = live
        self.lines = lines
        self.clock = clock
        self.started = clock()
        self.stage: tuple[str, float] | None = None
        self.training_since: float | None = None
        self.first_step: int | None = None
        self.done = 0  # steps finished, counted from the start of the run
        self.rate: float | None = None  # seconds per step, once the first step of this process is timed
        self.latest: StepRecord | None = None
        self.note: str | None = None
        self._spinner = Spinner("dots")  # one for the run, so its frames advance
        self._live = Live(get_renderable=self._render, console=console, transient=True, refresh_per_second=4) \
            if live else None

    # -- the context and the callbacks ----------------------------------------------------------

    def __enter__(self) -> RunDisplay:
        if self._live is not None:
            self._live.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, *rest: Any) -> None:
        if kind is None:
            self._close_stage()
            self._close_training()
        if self._live is not None:
            self._live.stop()

    def status(self, message: str) -> None:
        """A stage starts (``on_status``)."""
        self._close_stage()
        if message.startswith("resuming at step"):
            self._line(message)
            return
        if message == TRAINING:
            self.training_since = self.clock()
            if not self.live:
                self._line(f"{TRAINING}: {self._steps_text()} steps")
            return
        self._close_training()
        self.stage = (message, self.clock())
        if not self.live:
            self._line(message)

    def step(self, step: int, record: StepRecord | None) -> None:
        """A training step finished (``on_step``); ``record``: its probe, if it was probed."""
        if self.first_step is None:
            self.first_step = step
        self.done = step + 1
        if self.training_since is not None:
            self.rate = (self.clock() - self.training_since) / (self.done - self.first_step)
        if record is not None:
            self.latest = record
            if not self.live:
                self._line(f"step {self._steps_text()} {self._timing_text()} | {probe_summary(record)} | "
                           f"{alignment_summary(record)}")

    def event(self, message: str) -> None:
        """A line that is neither a stage nor a step (the threads chosen, say)."""
        self._line(message)

    def notify(self, message: str) -> None:
        """A note under the bar (live) or a line (plain): e.g. that the run stops after this step."""
        self.note = message
        if not self.live:
            self._line(message)

    # -- drawing --------------------------------------------------------------------------------

    def _close_training(self) -> None:
        if self.training_since is None:
            return
        steps = self._steps_text() if not self.first_step else f"{self.first_step + 1} to {self._steps_text()}"
        self._line(f"trained steps {steps}, {self._rate_text()}", self.clock() - self.training_since)
        self.training_since = None

    def _close_stage(self) -> None:
        if self.stage is None:
            return
        message, since = self.stage
        self.stage = None
        if self.live:
            self._line(message, self.clock() - since)

    def _line(self, message: str, took: float | None = None) -> None:
        """Live: a finished stage with the seconds it took (or an event, without). Plain: a line
        stamped with the time since the start."""
        if not self.lines:
            return
        if self.live and took is None:
            self.console.print(Text("·", style="dim") + Text(" " * 10) + Text(message))
        elif self.live:
            self.console.print(Text("✓ ", style="green") + Text(f"{took:6.1f} s  ", style="dim") + Text(message))
        else:
            self.console.print(Text(f"[{clock_text(self.clock() - self.started)}] {message}"), soft_wrap=True)

    def _steps_text(self) -> str:
        return f"{self.done}/{self.total}" if self.total else f"{self.done}"

    def _rate_text(self) -> str:
        return "timing the first step" if self.rate is None else f"{self.rate:.2f} s/step"

    def _timing_text(self) -> str:
        if self.rate is None or not self.total:
            return self._rate_text()
        return f"{self._rate_text()}, ETA {clock_text(self.rate * (self.total - self.done))}"

    def _render(self) -> RenderableType:
        parts: list[RenderableType] = []
        now = self.clock()
        if self.stage is not None:
            message, since = self.stage
            self._spinner.update(text=Text(f"{message}  {clock_text(now - since)}"))
            parts.append(self._spinner)
        elif self.training_since is not None:
            bar = Table.grid(padding=(0, 1))
            bar.add_row(
                Text("training", style="bold"),
                # Narrower on a narrow terminal, so the row (ETA and rate included) never wraps.
                ProgressBar(total=self.total or None, completed=self.done,
                            width=max(10, min(40, self.console.width - 60))),
                Text(self._steps_text() + " steps"),
                Text(clock_text(now - self.training_since)),
                Text("ETA after the first step" if self.rate is None else
                     f"ETA {clock_text(self.rate * ((self.total or self.done) - self.done))}", style="cyan"),
                Text("" if self.rate is None else f"{self.rate:.2f} s/step", style="cyan"),
            )
            parts.append(bar)
            if self.latest is not None:
                parts.append(self._latest(self.latest))
        if self.note:
            parts.append(Text(self.note, style="yellow"))
        return Group(*parts)

    @staticmethod
    def _latest(record: StepRecord) -> RenderableType:
        grid = Table.grid(padding=(0, 2))
        grid.add_row(Text(f"probe at step {record['step']}", style="bold"), Text(probe_summary(record)))
        for name, a in record["alignment"].items():
            grid.add_row(Text(f"  {name}"), Text(
                f"dot {a['dot']:+.4g} [{a['ci95'][0]:+.3g}, {a['ci95'][1]:+.3g}]  cosine {cosine_text(a['cosine'])}  "
                f"conflicting {a['conflict_fraction']:.0%}  weight {record['weights'][name]:g}"))
        return grid
