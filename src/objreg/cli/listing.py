"""``objreg list``: every objective, task and provider the installed plugins offer."""

from __future__ import annotations

from typing import Any

import click

import objreg
from objreg.cli import render


def listing(registry: objreg.Registry) -> dict[str, list[dict[str, Any]]]:
    """What ``objreg list --json`` prints."""

    def entry(name: str) -> dict[str, Any]:
        info = registry.info(name)
        return {
            "name": name,
            "kind": info.kind,
            "attention": info.attention,
            "description": info.description,
            "origin": registry.origin(name),
        }

    return {
        "objectives": [entry(n) for n in registry.objectives()],
        "tasks": [entry(n) for n in registry.tasks()],
        "providers": [{"kind": p.kind, "name": p.name, "description": p.description} for p in registry.providers()],
    }


@click.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@click.pass_context
def list_command(ctx: click.Context, as_json: bool) -> None:
    """List pre-training objectives, downstream tasks, models, corpora and tokenizers."""
    data = listing(render.registry(ctx))
    if as_json:
        render.echo_json(data)
        return
    console = render.console()
    for title, rows in (("Pre-training objectives", data["objectives"]), ("Downstream tasks", data["tasks"])):
        grid = render.table(title, "name", "attention", "description", "origin")
        for row in rows:
            grid.add_row(
                render.text(row["name"], "bold"),
                render.text(row["attention"]),
                render.text(row["description"]),
                render.text(row["origin"], "dim"),
            )
        console.print(grid if rows else render.text(f"{title}: none installed"))
    grid = render.table("Providers (--model, --corpus, tokenizers)", "kind", "name", "description")
    for row in data["providers"]:
        grid.add_row(render.text(row["kind"]), render.text(row["name"], "bold"), render.text(row["description"]))
    console.print(grid if data["providers"] else render.text("Providers: none installed"))
