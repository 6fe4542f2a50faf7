"""``objreg screen``: parse options, call ``objreg.screen``, render the ranking. No math here.

The model, corpus, data, device and optimizer options are ``objreg analyze``'s own (the same
option objects, so their names, help and checks cannot drift apart). Progress with an ETA goes to
stderr (:mod:`objreg.cli.progress`); the ranked table, the baselines and the validity line to
stdout, or the report alone with ``--json``.
"""

from __future__ import annotations

import json
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import click
from rich import box
from rich.console import Console

import objreg
from objreg.analysis.run.naming import command_line
from objreg.cli import render, threads
from objreg.cli.analyze import analyze as _analyze
from objreg.cli.progress import TRAINING, RunDisplay

#: analyze's options the screen takes as they are.
SHARED_OPTIONS = ("downstream", "model", "corpus", "downstream_data", "device", "dtype", "seed", "optimizer", "lr",
                  "batch_size", "seq_len", "eval_size", "head_fit_size", "thread_count")


def _shared(command: click.Command) -> click.Command:
    by_name = {p.name: p for p in _analyze.params}
    command.params[:0] = [by_name[name] for name in SHARED_OPTIONS]
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
@click.option("--out", "out_dir", default=None, type=click.Path(file_okay=False), metavar="DIR",
              help="Write screen.json and the forest plot screen.png here (default: write nothing).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout and nothing else.")
@click.pass_context
def screen(ctx: click.Context, candidates: str, budget: str | None, probe_every: int, out_dir: str | None,
           thread_count: int | None, as_json: bool, **settings_given: Any) -> None:
    """Rank pre-training objectives for a downstream task from short runs off one shared start:
    each candidate's score is the predicted first-order drop of D* (the re-fitted downstream
    head's loss) per step, averaged over the run with an interval; candidates whose intervals
    overlap are tied (=). Gradient norm, the objective's own loss decrease and a random order are
    shown beside it, with the actual change of D* over the short run."""
    settings = {k: v for k, v in settings_given.items() if v is not None}
    downstream = settings.pop("downstream", None)
    registry = render.registry(ctx)
    chosen = threads.for_this_machine(thread_count)
    errors = render.console(stderr=True)
    display = RunDisplay(errors, None, live=errors.is_terminal, lines=not as_json) \
        if not as_json or errors.is_terminal else None
    done = [0]

    def on_status(message: str) -> None:
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

    if display is not None:
        display.event(f"computing with {chosen.describe()}; --threads N to change")
    with display or nullcontext(), threads.using(chosen), command_line():
        report = objreg.screen(candidates, downstream, budget=budget, probe_every=probe_every, registry=registry,
                               on_status=on_status, on_step=on_step, on_plan=on_plan, **settings)
    data = report.to_dict()
    if out_dir:
        from objreg.analysis.probe.plots import write_screen_plot  # matplotlib only when a plot is written

        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "screen.json").write_text(json.dumps(data, indent=2))
        write_screen_plot(data, out / "screen.png")
    if as_json:
        click.echo(report.to_json())
        return
    console = render.console()
    _render(data, console)
    if out_dir:
        console.print(f"Wrote {out_dir}/: screen.json, screen.png", markup=False)


def _render(report: dict[str, Any], console: Console) -> None:
    config = report["config"]
    render.fields(console, ["objreg screen", f"downstream={report['downstream']}", f"model={config['model']}",
                            f"budget={report['budget']} per candidate", f"optimizer={config['optimizer']} "
                            f"lr={config['lr']}", f"{report['seconds']:.0f} s"], style="bold")
    ranked = [e for e in report["candidates"] if e["runnable"]]
    numbers = ("score", "95% interval", "D* drop")
    table = render.table("Ranking: predicted drop of D* per step (−∇D*·Δθ, mean over probes)", "rank",
                         "candidate", *numbers, numbers=("rank", *numbers), box=box.SIMPLE_HEAD, show_edge=False,
                         pad_edge=False, padding=(0, 0, 0, 1))
    for e in ranked:
        s = e["score"]
        table.add_row(f"{'=' if e['tied'] else ''}{e['rank']}", render.text(e["candidate"]), f"{s['mean']:+.3g}",
                      f"[{s['low']:+.2g}, {s['high']:+.2g}]", f"{e['actual_improvement']:+.3g}")
    render.show(console, table)
    render.prose(console, "=: tied (intervals overlap); interval: 95% batch means over the probed steps; D* drop: "
                 "the actual change of D* over the short run (+: D* fell)", style="dim")
    numbers = ("per 1k tok", "‖∇L‖", "own loss drop", "random")
    baselines = render.table("Beside it: score per 1,000 input tokens, and the baselines", "candidate", *numbers,
                             numbers=numbers, box=box.SIMPLE, show_edge=False)
    for e in ranked:
        baselines.add_row(render.text(e["candidate"]), f"{e['score_per_1k_tokens']['mean']:+.3g}",
                          f"{e['grad_norm']:.3g}", f"{e['loss_decrease']:+.3g}", str(e["random_rank"]))
    render.show(console, baselines)
    for e in report["candidates"]:
        if not e["runnable"]:
            what = "not run" if e["probes"] == 0 and e.get("diverged_at") is None else "not ranked"
            render.prose(console, f"{what}: {e['candidate']}: {e['reason']}", first="- ", indent="  ")
    render.prose(console, report["validity"])
