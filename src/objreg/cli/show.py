"""``objreg show NAME``: everything an objective or task declares about itself."""

from __future__ import annotations

from typing import Any

import click

from objreg.cli import render


def _bounds(param: dict[str, Any]) -> str:
    if param["choices"]:
        return "one of " + ", ".join(map(str, param["choices"]))
    if param["low"] is None and param["high"] is None:
        return ""
    low = "-inf" if param["low"] is None else param["low"]
    high = "inf" if param["high"] is None else param["high"]
    return f"[{low}, {high}]"


@click.command()
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@click.pass_context
def show(ctx: click.Context, name: str, as_json: bool) -> None:
    """Show an objective's or task's description, heads, parameters and references."""
    registry = render.registry(ctx)
    info = registry.info(name)  # unknown name: an error that suggests close matches
    data = {**info.to_dict(), "origin": registry.origin(name)}
    if as_json:
        render.echo_json(data)
        return
    console = render.console()
    render.prose(console, f"{data['name']}: {data['description']}", style="bold", indent="  ")
    facts = render.table("", "", "")
    facts.show_header = False
    facts.add_row(render.text("kind"), render.text(data["kind"]))
    facts.add_row(render.text("attention"), render.text(data["attention"]))
    heads = ", ".join(f"{h['name']} ({h['kind']}" + (f", {h['num_outputs']} outputs)" if h["num_outputs"] else ")")
                      for h in data["heads"])
    facts.add_row(render.text("heads"), render.text(heads or "none"))
    facts.add_row(render.text("batch-coupled loss"), render.text("yes" if data["batch_coupled"] else "no"))
    facts.add_row(render.text("shortest sequence"), render.text(f"{data['min_seq_len']} tokens"))
    facts.add_row(render.text("sentences per row"), render.text(f"at least {data['min_sentences']}"))
    facts.add_row(render.text("origin"), render.text(data["origin"]))
    console.print(facts)
    if data["params"]:
        params = render.table("Parameters (set with --param name=value)", "name", "default", "type", "allowed", "help")
        for p in data["params"]:
            params.add_row(render.text(p["name"], "bold"), render.text(p["default"]), render.text(p["type"]),
                           render.text(_bounds(p)), render.text(p["help"]))
        render.show_or_stack(console, params, ("allowed", "help"))
    else:
        console.print(render.text("Parameters: none"))
    if data["references"]:
        console.print(render.text("References:", "bold"))
        for reference in data["references"]:
            render.prose(console, reference, first="  ", indent="    ")
