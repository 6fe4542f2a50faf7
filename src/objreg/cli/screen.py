"""``objreg screen``: parse options, call ``objreg.screen``, render the ranking. No math here.

The model, corpus, data, device and optimizer options are ``objreg analyze``'s own (the same
option objects, so their names, help and checks cannot drift apart). Progress with an ETA goes to
stderr (:mod:`objreg.cli.progress`); the ranked table, the baselines and the validity line to
stdout, or the report alone with ``--json``.
"""

from __future__ import annotations

import copy
import json
import math
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import click
from rich import box
from rich.console import Console

import objreg
from objreg.analysis.run.naming import command_line
from objreg.analysis.run.rundir import SCREEN_FILES, claim_for
from objreg.cli import render, screen_assessment, threads
from objreg.cli.analyze import analyze as _analyze
from objreg.cli.interrupt import SIGNALS, Interrupts, Stopped, distributed, exit_code
from objreg.cli.progress import TRAINING, RunDisplay
from objreg.toolkit.atomic import atomic_file

#: analyze's options the screen takes as they are.
SHARED_OPTIONS = ("downstream", "model", "corpus", "downstream_data", "device", "dtype", "seed", "optimizer", "lr",
                  "batch_size", "seq_len", "eval_size", "head_fit_size", "thread_count")


#: The signals the second table shows (the score and the lookahead are in the ranking, the
#: baselines in the third), by column header.
SIGNAL_COLUMNS = {"first_order_sum": "Σ1st", "second_order_sum": "Σ2nd", "cosine": "cos", "step_cosine": "step cos",
                  "speed": "speed"}


#: analyze's options whose help speaks of what the screen does not have (--resume, a frozen head).
OWN_HELP = {
    "thread_count": "CPU threads torch computes with (default: auto: the CPUs this process may use less the "
                    "one-minute load average, at least 1; or OMP_NUM_THREADS where it is set).",
    "head_fit_size": "Examples the re-fitted downstream head is fitted on, apart from the evaluation set "
                     "(default: 256).",
}


def _shared(command: click.Command) -> click.Command:
    by_name = {p.name: p for p in _analyze.params}
    options = []
    for name in SHARED_OPTIONS:
        option = by_name[name]
        if name in OWN_HELP:  # the same option (name, type, checks) with the screen's own help
            option = copy.copy(option)
            option.help = OWN_HELP[name]
        options.append(option)
    command.params[:0] = options
    return command


@_shared
@click.command()
@click.option("--candidates", required=True, metavar="CAND,...",
              help="Objectives to compare, comma-separated: an objective (mlm), one with parameters "
                   "(mlm:mask_prob=0.4, several joined by ':'), or an equal-weight mixture (mlm+sop).")
@click.option("--budget", default=None, metavar="N|Ns",
              help="Training per candidate: N steps, or Ns seconds (default: 8 steps).")
@click.option("--probe-every", type=int, default=1, show_default=True,
              help="Score every N steps (each probe re-fits the head and takes the gradient of D*).")
@click.option("--out", "out_dir", default=None, metavar="DIR",
              help="Write screen.json and the forest plot screen.png here (default: write nothing). The "
                   "directory is locked and checked before any training; an earlier screen.json there is never "
                   "overwritten.")
@click.option("--second-order", is_flag=True,
              help="Also take the second-order term ½ Δθᵀ∇²D*Δθ at every probe (the signal Σ2nd): one "
                   "Hessian-vector product of D* per probe, about 1.6x a probed step's time on the default model.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout and nothing else.")
@click.pass_context
def screen(ctx: click.Context, candidates: str, budget: str | None, probe_every: int, out_dir: str | None,
           thread_count: int | None, second_order: bool, as_json: bool, **settings_given: Any) -> None:
    """Rank pre-training objectives for a downstream task from short runs off one shared start:
    each candidate's score is the predicted first-order drop of D* (the re-fitted downstream
    head's loss) per step, averaged over the run with an interval; candidates whose intervals
    overlap are tied (=). Beside it: the actual drop of D* (lookahead), the run's first- and
    second-order predicted drop, the gradients' cosines, a training-speed integral, and the
    baselines (gradient norm, the objective's own loss decrease, a random order). It ends with
    what the ranking tells, what it cannot, and what to run next."""
    settings = {k: v for k, v in settings_given.items() if v is not None}
    downstream = settings.pop("downstream", None)
    registry = render.registry(ctx)
    chosen = threads.for_this_machine(thread_count)
    errors = render.console(stderr=True)
    display = RunDisplay(errors, None, live=errors.is_terminal, lines=not as_json) \
        if not as_json or errors.is_terminal else None
    notify = display.notify if display is not None else (lambda message: click.echo(message, err=True))
    interrupts = Interrupts(notify, installed=not distributed(), unit="candidate")
    done = [0]

    def on_status(message: str) -> None:
        if message.startswith("screening"):
            interrupts.training = True  # from here a first Ctrl-C stops after the candidate in flight
        if display is None:
            return
        if message.startswith("screening"):
            if display.training_since is None:
                display.status(TRAINING)
            display.event(message)
        else:
            display.status(message)

    def on_step(candidate: str, steps: int, of: int | None) -> None:
        done[0] += 1
        if display is not None:
            display.step(done[0] - 1, None)

    def on_plan(runnable: int, steps: int | None) -> None:
        if display is not None and steps is not None:
            display.total = runnable * steps

    from objreg.analysis.run.screen import STOPPED_DURING  # the run's modules, loaded when a screen starts
    from objreg.analysis.run.validation import check_directory_argument

    with command_line():
        # Before any work: an empty, impossible, linked, locked or already written --out.
        check_directory_argument("out_dir", out_dir)
        directory = claim_for(out_dir, SCREEN_FILES, "objreg screen") if out_dir is not None else None
    try:
        if display is not None:
            display.event(f"computing with {chosen.describe()}; --threads N to change")
        stop: Stopped | None = None
        try:
            with interrupts, display or nullcontext(), threads.using(chosen), command_line():
                report = objreg.screen(candidates, downstream, budget=budget, probe_every=probe_every,
                                       second_order=second_order, registry=registry, on_status=on_status, on_step=on_step, on_plan=on_plan,
                                       stop=lambda: interrupts.requested is not None, **settings)
        except Stopped as stopped_at_once:
            stop = stopped_at_once
            report = getattr(stopped_at_once, "screen_report", None)
            if report is None:  # still loading: nothing ran
                click.echo("Stopped before any candidate was trained; nothing written.", err=True)
                ctx.exit(exit_code(stopped_at_once))
        if stop is None and report.stopped:
            stop = Stopped(interrupts.requested or signal.SIGINT, abandoned=False)
        with _signals_held():  # what finished is shown and written whole, whatever signal comes now
            _deliver(report.to_dict(), out_dir, as_json)
        if directory is not None:
            directory.release(finished=True, result=SCREEN_FILES[0])
    finally:
        if directory is not None:
            directory.release()
    if stop is not None:
        finished = sum(e["steps"] > 0 and e["reason"] != STOPPED_DURING for e in report.candidates)
        click.echo(f"Stopped with {finished} candidate(s) screened; the others are listed as not run"
                   + (f"; written to {out_dir}/" if out_dir is not None else "") + ".", err=True)
        ctx.exit(exit_code(stop))


@contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM ignored inside (the few moments the result takes to print and write)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, signal.SIG_IGN) for signum in SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _deliver(data: dict[str, Any], out_dir: str | None, as_json: bool) -> None:
    """Print the ranking (or the JSON), then write the files: a failed write loses nothing shown."""
    console = render.console()
    if as_json:
        click.echo(json.dumps(data, indent=2, allow_nan=True))
    else:
        _render(data, console)
    if out_dir is None:
        return
    from objreg.analysis.probe.plots import write_screen_plot  # matplotlib only when a plot is written
    from objreg.analysis.run.failures import describe

    out = Path(out_dir)
    try:
        with atomic_file(out / SCREEN_FILES[0], "w") as f:
            f.write(json.dumps(data, indent=2, allow_nan=True))
        write_screen_plot(data, out / SCREEN_FILES[1])
    except OSError as error:
        described = describe(error, out_dir)
        raise click.ClickException(str(described) if described is not None else f"cannot write {out_dir}: {error}") \
            from error
    if not as_json:
        console.print(f"Wrote {out_dir}/: screen.json, screen.png", markup=False)


def _render(report: dict[str, Any], console: Console) -> None:
    config = report["config"]
    render.fields(console, ["objreg screen", f"downstream={report['downstream']}", f"model={config['model']}",
                            f"budget={report['budget']} per candidate", f"optimizer={config['optimizer']} "
                            f"lr={config['lr']}", f"{report['seconds']:.0f} s"], style="bold")
    ranked = [e for e in report["candidates"] if e["runnable"]]
    numbers = ("score", "95% interval", "lookahead", "D* drop")
    table = render.table("Ranking: predicted drop of D* per step (−∇D*·Δθ, mean over probes)", "rank",
                         "candidate", *numbers, numbers=("rank", *numbers), box=box.SIMPLE_HEAD, show_edge=False,
                         pad_edge=False, padding=(0, 0, 0, 1))
    for e in ranked:
        s = e["score"]
        table.add_row(f"{'=' if e['tied'] else ''}{e['rank']}", render.text(e["candidate"]), f"{s['mean']:+.3g}",
                      f"[{s['low']:+.2g}, {s['high']:+.2g}]", f"{e['lookahead']['mean']:+.3g}",
                      f"{e['actual_improvement']:+.3g}")
    render.show(console, table)
    render.prose(console, "=: tied (intervals overlap); interval: 95% batch means over the probed steps; lookahead: "
                 "the actual drop of D* per step; D* drop: over the whole short run (+: D* fell)", style="dim")
    second = any(math.isfinite(e["signals"]["second_order_sum"]) for e in ranked)
    shown = {k: v for k, v in SIGNAL_COLUMNS.items() if second or k != "second_order_sum"}
    signals = render.table("Other signals (higher predicts more transfer)", "candidate", *shown.values(),
                           numbers=tuple(shown.values()), box=box.SIMPLE, show_edge=False)
    for e in ranked:
        signals.add_row(render.text(e["candidate"]), *(f"{e['signals'][k]:+.3g}" for k in shown))
    render.show(console, signals)
    render.prose(console, "Σ1st, Σ2nd: the first-order (and with --second-order the second-order) prediction of the "
                 "run's whole drop of D*; cos: cosine of ∇D* with the training gradient; step cos: with the step "
                 "taken; speed: the mean of D*₀ − D*ₜ over the run", style="dim")
    numbers = ("per 1k tok", "‖∇L‖", "own loss drop", "random")
    baselines = render.table("Baselines: score per 1,000 input tokens, and what needs no D*", "candidate", *numbers,
                             numbers=numbers, box=box.SIMPLE, show_edge=False)
    for e in ranked:
        baselines.add_row(render.text(e["candidate"]), f"{e['score_per_1k_tokens']['mean']:+.3g}",
                          f"{e['signals']['grad_norm']:.3g}", f"{e['signals']['loss_decrease']:+.3g}",
                          str(e["random_rank"]))
    render.show(console, baselines)
    for e in report["candidates"]:
        if not e["runnable"]:
            what = "not run" if e["probes"] == 0 and e.get("diverged_at") is None else "not ranked"
            render.prose(console, f"{what}: {e['candidate']}: {e['reason']}", first="- ", indent="  ")
    render.prose(console, report["validity"])
    for heading, items in screen_assessment.assess(report):
        console.print(heading, markup=False, style="bold")
        for item in items:
            render.prose(console, item, first="- ", indent="  ")
