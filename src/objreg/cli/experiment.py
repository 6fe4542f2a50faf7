"""``objreg experiment``: list the literature's claims and check one with a verdict. No math here."""

from __future__ import annotations

import click

import objreg
from objreg.cli import render

_STYLE = {"confirmed": "bold green", "refuted": "bold red", "inconclusive": "bold yellow"}


@click.group()
def experiment() -> None:
    """Runnable experiments that check claims of the pre-training objective literature."""


@experiment.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def list_experiments(as_json: bool) -> None:
    """List the experiments, one line each: its name, source and claim, the claims of the literature
    first and the software checks after them (`objreg experiment show NAME` gives the claim whole,
    the source and the verdict rule; --json all of them)."""
    described = objreg.experiments.describe()
    if as_json:
        render.echo_json(described)
        return
    console = render.console()
    width = max(len(row["name"]) for row in described)
    for i, row in enumerate(described):
        if row["kind"] != "claim" and (i == 0 or described[i - 1]["kind"] == "claim"):
            console.print(render.text("software checks, not claims of the literature:", "dim"))
        line = f"{row['name']:<{width}}  {_short_source(row['source'])}: {row['claim']}"
        # A line per experiment: a terminal's ends at its edge (the claim cut short), a file's holds it whole.
        if len(line) > console.width:
            line = line[: console.width - 1] + "…"
        console.print(render.text(line))
    console.print(render.text("objreg experiment show NAME: the claim, its source and the verdict rule", "dim"))


@experiment.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def show_experiment(name: str, as_json: bool) -> None:
    """Show experiment NAME: the claim it tests, its source and its verdict rule."""
    described = {row["name"]: row for row in objreg.experiments.describe()}
    if name not in described:
        raise objreg.UnknownNameError("experiment", name, described)
    row = described[name]
    if as_json:
        render.echo_json(row)
        return
    console = render.console()
    console.print(render.text(row["name"], "bold"))
    for label, key in (("claim", "claim"), ("source", "source"), ("verdict rule", "rule"), ("kind", "kind")):
        render.prose(console, f"{label}: {row[key]}", indent="    ")


def _short_source(source: str) -> str:
    """``Lan et al. 2020`` of ``Lan et al. 2020, ALBERT: ...``."""
    return source.split(",", 1)[0]


@experiment.command("run", help="Run experiment NAME (or every one with --all) for one or more seeds and print its "
                    "figures and overall verdict. NAME: " + ", ".join(objreg.experiments.names())
                    + " (`objreg experiment list` gives each one's claim, source and verdict rule).")
@click.argument("name", required=False)
@click.option("--all", "run_all", is_flag=True, help="Run every experiment; needs --out (each one goes to OUT/NAME).")
@click.option("--quick", is_flag=True,
              help="The small setting: under about a minute per seed on a 2-core CPU (docs/experiments.md).")
@click.option("--seeds", type=int, default=None,
              help="Independent seeds to run, SEED to SEED+N-1 (1 to 64; default: 1 with --quick, 3 without).")
@click.option("--seed", type=int, default=0, show_default=True, help="The first seed.")
@click.option("--device", default="auto", show_default=True, help="auto, cpu or cuda[:N].")
@click.option("--out", "out_dir", type=click.Path(), default=None,
              help="Directory for result.json and the plots; one that holds an earlier result is refused, never "
                   "overwritten (default: write nothing).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def run(name: str | None, run_all: bool, quick: bool, seeds: int | None, seed: int, device: str,
        out_dir: str | None, as_json: bool) -> None:
    """Run experiment NAME and print its figures and verdict."""
    status = (lambda _message: None) if as_json else (lambda message: click.echo(f"· {message}", err=True))
    if run_all:
        if name is not None:
            raise click.UsageError("give NAME or --all, not both")
        if out_dir is None:
            raise click.UsageError("--all needs --out DIR (each experiment's result goes to DIR/NAME)")
        results = objreg.experiments.run_all(out_dir, seeds=seeds, seed=seed, quick=quick, device=device,
                                             status=status)
        if as_json:
            render.echo_json([r.to_dict() for r in results.values()])
            return
        grid = render.table("Experiments", "name", "verdict", "effect", "reason")
        for result in results.values():
            grid.add_row(render.text(result.name), render.text(result.verdict, _STYLE[result.verdict]),
                         render.text(_format(result.figures.get("effect"))), render.text(result.reason))
        render.console().print(grid)
        return
    if name is None:
        raise click.UsageError("give an experiment NAME or --all (`objreg experiment list` names them)")
    result = objreg.experiments.run(name, seeds=seeds, seed=seed, quick=quick, out_dir=out_dir, device=device,
                                    status=status)
    if as_json:
        render.echo_json(result.to_dict())
        return
    console = render.console()
    console.print(render.text(f"{result.name}: {result.claim}"))
    console.print(render.text(f"source: {result.source}"))
    console.print(render.text(f"rule: {result.rule}"))
    grid = render.table("Figures", "figure", "value")
    for key, value in _flatten(result.figures):
        grid.add_row(render.text(key), render.text(_format(value)))
    console.print(grid)
    seeds_grid = render.table("Seeds (intervals inside one seed are within-seed)", "seed", "verdict", "effect",
                              "reason")
    for replicate in result.replicates:
        seeds_grid.add_row(render.text(str(replicate["setting"].get("seed", ""))),
                           render.text(replicate["verdict"], _STYLE[replicate["verdict"]]),
                           render.text(_format(replicate["figures"].get("effect"))),
                           render.text(replicate["reason"]))
    console.print(seeds_grid)
    console.print(render.text(result.verdict.upper(), _STYLE[result.verdict]), render.text(result.reason))
    for plot in result.plots:
        console.print(render.text(f"plot: {plot}"))


def _flatten(figures: dict, prefix: str = "") -> list[tuple[str, object]]:
    rows: list[tuple[str, object]] = []
    for key, value in figures.items():
        if isinstance(value, dict):
            rows += _flatten(value, f"{prefix}{key}.")
        else:
            rows.append((f"{prefix}{key}", value))
    return rows


def _format(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list) and len(value) > 8:
        return "[" + ", ".join(_format(v) for v in value[:8]) + f", … ({len(value)} values)]"
    if isinstance(value, list):
        return "[" + ", ".join(_format(v) for v in value) + "]"
    return str(value)
