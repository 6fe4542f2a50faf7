"""Helpers every command shares: the registry of the running CLI, and output (JSON or rich).

Commands reach the plugins through :func:`registry`, which asks the root ``objreg`` group for its
plugin manager, so a test can run the whole CLI on a manager it built itself.
"""

from __future__ import annotations

import json
from typing import Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

import objreg

_PLUGIN_MANAGER_KEY = "objreg.plugin_manager"


def plugin_manager(ctx: click.Context) -> Any:
    """The plugin manager of this invocation, built once and shared by every command in it.

    Cached on ``ctx.meta`` (which lives as long as one invocation) rather than on the group, so
    nothing leaks from one run of the CLI into the next.
    """
    root = ctx.find_root()
    if _PLUGIN_MANAGER_KEY not in root.meta:
        factory = getattr(root.command, "plugin_manager_factory", objreg.get_plugin_manager)
        root.meta[_PLUGIN_MANAGER_KEY] = factory()
    return root.meta[_PLUGIN_MANAGER_KEY]


def registry(ctx: click.Context) -> objreg.Registry:
    """The validated registry of this invocation's plugins."""
    return objreg.Registry(plugin_manager(ctx))


def echo_json(data: Any, indent: int | None = 2) -> None:
    """Print ``data`` as the only thing on stdout, so ``objreg ... --json | jq`` works."""
    click.echo(json.dumps(data, indent=indent, ensure_ascii=False))


def console() -> Console:
    """A console on the current stdout (click's test runner swaps it). Soft wrap: long lines
    (the mask grid) are left for the terminal to wrap rather than broken mid-row; tables still
    fit themselves to the width."""
    return Console(soft_wrap=True, highlight=False)


def text(value: Any, style: str = "") -> Text:
    """Literal text: token strings like ``[CLS]`` would otherwise be read as rich markup."""
    return Text("" if value is None else str(value), style=style)


def table(title: str, *columns: str) -> Table:
    grid = Table(title=title, title_justify="left", show_lines=False)
    for column in columns:
        grid.add_column(column)
    return grid
