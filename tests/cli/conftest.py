"""Stand-ins shared by the command tests."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from click.testing import CliRunner, Result

import objreg
from objreg.cli import make_cli


@pytest.fixture
def command() -> Callable[[str], Callable[..., Result]]:
    """``command("screen")``: a function that invokes ``objreg screen ARGS...`` with the built-in
    plugins only and returns click's result."""
    cli = make_cli(lambda: objreg.get_plugin_manager(load_entrypoints=False))

    def bound(name: str) -> Callable[..., Result]:
        return lambda *args: CliRunner().invoke(cli, [name, *args])

    return bound
