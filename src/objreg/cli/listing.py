"""``objreg list``: every objective, task, modifier, provider and head kind the installed plugins
offer, each with its origin (the distribution, and for providers and head kinds the plugin, that
registered it).

A modifier composes with every objective that declares all of its parameters (the masking family
declares ``objreg.toolkit.modifiers.MODIFIER_PARAMS``), so an installed masking objective that declares them
shows up beside the built-ins. A text-level modifier (character noise) applies to any objective.
Modifiers are part of objreg itself (``objreg.toolkit.modifiers``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import click

import objreg
from objreg.cli import render
from objreg.toolkit.modifiers import MODIFIERS

#: Where the modifiers come from: objreg's toolkit, whichever objectives declare their parameters.
MODIFIER_ORIGIN = "objreg (built-in): objreg.toolkit.modifiers"


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
        "providers": [{"kind": p.kind, "name": p.name, "description": p.description,
                       "origin": registry.provider_origin(p)} for p in registry.providers()],
        "head_kinds": [{"name": k.name, "description": k.description, "needs_outputs": k.needs_outputs,
                        "origin": registry.provider_origin(k)} for _, k in sorted(registry.head_kinds().items())],
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
            "origin": MODIFIER_ORIGIN,
        })
    return rows


@click.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@click.pass_context
def list_command(ctx: click.Context, as_json: bool) -> None:
    """List pre-training objectives, downstream tasks, modifiers, models, corpora, tokenizers and head
    kinds, with the plugin each comes from."""
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
        render.show_or_stack(console, grid, ("description", "needs num_outputs")) if rows else console.print(
            render.text(f"{title}: none installed"))
    grid = render.table("Modifiers (set as objective parameters; char_noise applies to the text)",
                        "name", "composes with", "params", "description", "origin")
    for row in data["modifiers"]:
        composes = "any objective (text)" if row["scope"] == "text" else ", ".join(row["composes_with"]) or "none"
        params = ", ".join(f"{p['name']}={p['default']}" for p in row["params"])
        grid.add_row(render.text(row["name"], "bold"), render.text(composes), render.text(params),
                     render.text(row["description"]), render.text(row["origin"], "dim"))
    render.show_or_stack(console, grid, ("composes with", "params", "description"))
    grid = render.table("Providers (--model, --corpus, tokenizers)", "kind", "name", "description", "origin")
    for row in data["providers"]:
        grid.add_row(render.text(row["kind"]), render.text(row["name"], "bold"), render.text(row["description"]),
                     render.text(row["origin"], "dim"))
    render.show_or_stack(console, grid, ("description", "origin")) if data["providers"] else console.print(
        render.text("Providers: none installed"))
    grid = render.table("Head kinds (HeadSpec.kind; the host builds them on any backbone)", "kind", "description",
                        "needs num_outputs", "origin")
    for row in data["head_kinds"]:
        grid.add_row(render.text(row["name"], "bold"), render.text(row["description"]),
                     render.text("yes" if row["needs_outputs"] else "no"), render.text(row["origin"], "dim"))
    render.show_or_stack(console, grid, ("description", "needs num_outputs"))
