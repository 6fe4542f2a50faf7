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
    """List the experiments and the claim each one tests."""
    claims = objreg.experiments.claims()
    if as_json:
        render.echo_json([{"name": n, "claim": c} for n, c in claims.items()])
        return
    grid = render.table("Experiments", "name", "claim")
    for name, claim in claims.items():
        grid.add_row(render.text(name), render.text(claim))
    render.console().print(grid)


@experiment.command("run", help="Run experiment NAME and print its figures and verdict. NAME: "
                    + ", ".join(objreg.experiments.names()) + " (`objreg experiment list` gives each one's claim).")
@click.argument("name")
@click.option("--quick", is_flag=True,
              help="The small setting: 6 to 29 s per experiment measured on a 2-core CPU shared with other jobs, "
                   "81 s seen for nsp-vs-sop at load average 3 (docs/experiments.md).")
@click.option("--seed", type=int, default=0, show_default=True, help="Random seed.")
@click.option("--device", default="auto", show_default=True, help="auto, cpu or cuda[:N].")
@click.option("--out", "out_dir", type=click.Path(), default=None,
              help="Directory for result.json and the plots (default: write nothing).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def run(name: str, quick: bool, seed: int, device: str, out_dir: str | None, as_json: bool) -> None:
    """Run experiment NAME and print its figures and verdict."""
    status = (lambda _message: None) if as_json else (lambda message: click.echo(f"· {message}", err=True))
    result = objreg.experiments.run(name, quick=quick, seed=seed, out_dir=out_dir, device=device, status=status)
    if as_json:
        render.echo_json(result.to_dict())
        return
    console = render.console()
    console.print(render.text(f"{result.name}: {result.claim}"))
    grid = render.table("Figures", "figure", "value")
    for key, value in _flatten(result.figures):
        grid.add_row(render.text(key), render.text(_format(value)))
    console.print(grid)
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
