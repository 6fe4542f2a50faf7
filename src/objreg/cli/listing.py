"""``objreg list``: every objective, task, modifier and provider the installed plugins offer.

A modifier composes with every objective that declares all of its parameters (the masking family
declares ``objreg.toolkit.modifiers.MODIFIER_PARAMS``), so an installed masking objective that declares them
shows up beside the built-ins. A text-level modifier (character noise) applies to any objective.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import click

import objreg
from objreg.cli import render
from objreg.toolkit.modifiers import MODIFIERS


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
        "modifiers": modifiers(registry),
        "providers": [{"kind": p.kind, "name": p.name, "description": p.description} for p in registry.providers()],
    }


def modifiers(registry: objreg.Registry) -> list[dict[str, Any]]:
    """Each modifier with the objectives it composes with and its parameters."""
    declared = {n: {p.name for p in registry.info(n).params} for n in registry.objectives()}
    rows = []
    for modifier in MODIFIERS:
        names = {p.name for p in modifier.params}
        fits = [n for n, d in declared.items() if names <= d]
        composes = sorted(declared) if modifier.scope == "text" else sorted(fits)
        rows.append({
            "name": modifier.name,
            "description": modifier.description,
            "scope": modifier.scope,
            "composes_with": composes,
            "params": [{**dataclasses.asdict(p), "type": p.type.__name__,
                        "choices": list(p.choices) if p.choices else None} for p in modifier.params],
        })
    return rows


@click.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@click.pass_context
def list_command(ctx: click.Context, as_json: bool) -> None:
    """List pre-training objectives, downstream tasks, modifiers, models, corpora and tokenizers."""
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
    grid = render.table("Modifiers (set as objective parameters; char_noise applies to the text)",
                        "name", "composes with", "params", "description")
    for column in grid.columns[1:3]:
        column.overflow = "fold"  # break long parameter names rather than cut them
    for row in data["modifiers"]:
        composes = "any objective (text)" if row["scope"] == "text" else ", ".join(row["composes_with"]) or "none"
        params = ", ".join(f"{p['name']}={p['default']}" for p in row["params"])
        grid.add_row(render.text(row["name"], "bold"), render.text(composes), render.text(params),
                     render.text(row["description"]))
    console.print(grid)
    grid = render.table("Providers (--model, --corpus, tokenizers)", "kind", "name", "description")
    for row in data["providers"]:
        grid.add_row(render.text(row["kind"]), render.text(row["name"], "bold"), render.text(row["description"]))
    console.print(grid if data["providers"] else render.text("Providers: none installed"))
