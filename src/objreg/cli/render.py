"""Helpers every command shares: the registry of the running CLI, and output (JSON or rich).

Commands reach the plugins through :func:`registry`, which asks the root ``objreg`` group for its
plugin manager, so a test can run the whole CLI on a manager it built itself.

Output that survives redirection: where stdout is not a terminal (``> log.txt``, a pipe, CI),
tables are drawn at their natural width, never squeezed to 80 columns; on a terminal, text
columns wrap but number columns never do, and a table that cannot fit even so is drawn wider
than the terminal (which wraps its lines) rather than cutting a number.
"""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import click
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

import objreg

_PLUGIN_MANAGER_KEY = "objreg.plugin_manager"
#: Width of a console that is not a terminal: wide enough that no table is squeezed.
UNBOUNDED_WIDTH = 10_000


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


def console(stderr: bool = False) -> Console:
    """A console on the current stdout (click's test runner swaps it), or stderr.

    Soft wrap: long lines (the mask grid) are left for the terminal to wrap rather than broken
    mid-row. Not a terminal: unbounded width, so tables keep their natural width in files.
    """
    out = Console(soft_wrap=True, highlight=False, stderr=stderr)
    if not out.is_terminal:
        out.width = UNBOUNDED_WIDTH
    return out


#: Control characters (C0 but tab and newline, DEL, C1): a plugin's name or description holding
#: them could move the cursor, retitle the window or hide text on the user's terminal.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def text(value: Any, style: str = "") -> Text:
    """Literal text: token strings like ``[CLS]`` would otherwise be read as rich markup, and
    control characters are shown as escapes (``\\x1b``), never sent to the terminal."""
    plain = "" if value is None else str(value)
    return Text(_CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", plain), style=style)


class NumberTable(Table):
    """A table that knows which of its columns hold numbers (cells never to be broken or cut)."""

    numbers: set[int]


def table(title: str, *columns: str, numbers: tuple[str, ...] = (), **options: Any) -> NumberTable:
    """A table with a left-aligned title. Columns named in ``numbers`` are right-aligned, and
    :func:`show` never breaks or cuts their cells."""
    grid = NumberTable(title=title, title_justify="left", show_lines=False, **options)
    grid.numbers = set()
    for column in columns:
        if column in numbers:
            grid.numbers.add(len(grid.columns))
            grid.add_column(column, justify="right")
        else:
            grid.add_column(column, overflow="fold")
    return grid


def show(out: Console, grid: Table) -> None:
    """Print ``grid`` without breaking or cutting a number.

    At its natural width where that fits (always, where the output is not a terminal). Otherwise
    each number column is fixed at its widest cell (its header wraps within that), text columns
    fold, and a table that cannot fit even so is drawn wider than the console (the terminal then
    wraps its lines) rather than cutting a number.
    """
    wide = out.options.update_width(UNBOUNDED_WIDTH)
    if Measurement.get(out, wide, grid).maximum <= out.width:
        out.print(grid)
        return
    for index in getattr(grid, "numbers", ()):
        column = grid.columns[index]
        cells = [Text.from_markup(c) if isinstance(c, str) else c for c in column.cells]
        header = max((len(word) for word in str(column.header).split()), default=0)
        column.width = max([header, *(Measurement.get(out, wide, cell).maximum for cell in cells)])
    needed = Measurement.get(out, wide, grid).minimum
    with _at_least(out, needed):
        out.print(grid)


@contextmanager
def _at_least(out: Console, width: int) -> Iterator[None]:
    if width <= out.width:
        yield
        return
    before = out.width
    out.width = width
    try:
        yield
    finally:
        out.width = before


def fields(out: Console, parts: Sequence[str], style: str | None = None) -> None:
    """``parts`` on as few lines as the console's width allows, two spaces apart (a part wider
    than the console gets a line of its own and wraps between words)."""
    lines: list[str] = []
    for part in parts:
        if lines and len(lines[-1]) + 2 + len(part) <= out.width:
            lines[-1] += "  " + part
        else:
            lines.append(part)
    for line in lines:
        prose(out, line, style=style)


def prose(out: Console, line: str, style: str | None = None, indent: str = "", first: str = "") -> None:
    """``line`` wrapped at the console's width between words, never inside one (a number stays
    whole), continuation lines indented by ``indent``; ``first`` starts the first line."""
    wrapped = textwrap.fill(line, width=out.width, initial_indent=first, subsequent_indent=indent,
                            break_long_words=False, break_on_hyphens=False)
    out.print(Text(wrapped, style=style or ""), soft_wrap=True)


def show_or_stack(out: Console, grid: Table, long: Sequence[str]) -> None:
    """``grid`` as a table where it fits the console at its natural width; else each row stacked:
    its other cells on one line, then each cell of the ``long`` columns (named by header) wrapped
    below it, indented. Words are never split, so no identifier is broken across lines."""
    wide = out.options.update_width(UNBOUNDED_WIDTH)
    if Measurement.get(out, wide, grid).maximum <= out.width:
        out.print(grid)
        return
    if grid.title:
        out.print(Text(str(grid.title), style="italic"))
    columns = [(str(column.header), [_plain(cell) for cell in column.cells]) for column in grid.columns]
    short = [(header, cells) for header, cells in columns if header not in long]
    stacked = [(header, cells) for header, cells in columns if header in long]
    for row in range(grid.row_count):
        heading = [cells[row] for _, cells in short if cells[row]]
        if heading and len("  ".join(heading)) <= out.width:
            out.print(Text(heading[0], style="bold") + Text("".join(f"  {cell}" for cell in heading[1:])),
                      soft_wrap=True)
        elif heading:  # a long value (a default, say): wrapped between words like the rest
            prose(out, "  ".join(heading), indent="    ")
        for header, cells in stacked:
            if cells[row]:
                label = f"{header}: " if len(stacked) > 1 else ""
                prose(out, label + cells[row], first="    ", indent="    ")


def _plain(cell: Any) -> str:
    if isinstance(cell, Text):
        return cell.plain
    return Text.from_markup(str(cell)).plain
