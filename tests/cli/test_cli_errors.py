"""Errors at the CLI boundary: one line and exit 1 for library errors and bugs, click's exit 2 for
usage errors, the traceback only with OBJREG_RAISE_ERRORS=1; plugin commands load lazily."""

from __future__ import annotations

import os
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

import objreg
from objreg.cli import cli, make_cli


def builtins_only():
    # Installed third-party plugins must not change what these tests see.
    return objreg.get_plugin_manager(load_entrypoints=False)


class CommandsPlugin:
    """A throwaway plugin that adds two commands through objreg_register_commands."""

    @objreg.hookimpl
    def objreg_register_commands(self, cli: click.Group) -> None:
        @cli.command()
        def hello() -> None:
            """Say hello from a plugin."""
            click.echo("hello from a plugin")

        @cli.command()
        def crash() -> None:
            """Fail with a bug (not an ObjregError)."""
            raise ValueError("the plugin has a bug")

        @cli.command()
        def refuse() -> None:
            """Fail with a library error."""
            raise objreg.DataError("the corpus is empty")


class BrokenCommandsPlugin:
    @objreg.hookimpl
    def objreg_register_commands(self, cli: click.Group) -> None:
        raise RuntimeError("broken plugin")


def cli_with(plugin: object) -> click.Group:
    def factory():
        pm = builtins_only()
        pm.register(plugin, name="test-commands")
        return pm

    return make_cli(factory)


@pytest.fixture
def runner(monkeypatch) -> CliRunner:
    monkeypatch.delenv("OBJREG_RAISE_ERRORS", raising=False)
    return CliRunner()


def test_version(runner):
    result = runner.invoke(make_cli(builtins_only), ["--version"])
    assert result.exit_code == 0
    assert objreg.__version__ in result.output


def test_plugin_adds_a_command(runner):
    group = cli_with(CommandsPlugin())
    result = runner.invoke(group, ["hello"])
    assert result.exit_code == 0, result.output
    assert result.stdout == "hello from a plugin\n"
    assert "hello" in runner.invoke(group, ["--help"]).stdout


def test_plugin_command_does_not_stick_to_the_global_cli(runner):
    runner.invoke(cli_with(CommandsPlugin()), ["hello"])
    result = runner.invoke(cli, ["hello"])
    assert result.exit_code == 2
    assert "No such command 'hello'" in result.stderr


def test_builtin_commands_do_not_load_plugin_commands(runner):
    # The plugin's objreg_register_commands raises: a built-in command never calls it ...
    group = cli_with(BrokenCommandsPlugin())
    listed = runner.invoke(group, ["list", "--json"])
    assert listed.exit_code == 0, listed.output
    # ... an unknown name does, and its failure is one line, not a traceback.
    result = runner.invoke(group, ["nosuch"])
    assert result.exit_code == 1
    assert result.stderr.strip() == (
        "Error: internal error: RuntimeError: broken plugin (set OBJREG_RAISE_ERRORS=1 for the traceback)"
    )


def test_library_error_is_one_line_exit_1(runner):
    result = runner.invoke(cli_with(CommandsPlugin()), ["refuse"])
    assert result.exit_code == 1
    assert result.stderr == "Error: the corpus is empty\n"
    assert result.stdout == ""


def test_bug_is_one_line_with_a_hint(runner):
    result = runner.invoke(cli_with(CommandsPlugin()), ["crash"])
    assert result.exit_code == 1
    assert result.stderr == (
        "Error: internal error: ValueError: the plugin has a bug (set OBJREG_RAISE_ERRORS=1 for the traceback)\n"
    )


@pytest.mark.parametrize(("command", "error"), [("crash", ValueError), ("refuse", objreg.DataError)])
def test_raise_errors_env_lets_the_exception_through(runner, monkeypatch, command, error):
    monkeypatch.setenv("OBJREG_RAISE_ERRORS", "1")
    result = runner.invoke(cli_with(CommandsPlugin()), [command])
    assert isinstance(result.exception, error)
    assert result.exit_code == 1


def test_usage_error_keeps_click_exit_2(runner):
    result = runner.invoke(make_cli(builtins_only), ["corrupt", "mlm"])
    assert result.exit_code == 2
    assert "Missing option '--text'" in result.stderr


def test_unknown_objective_suggests_close_match(runner):
    result = runner.invoke(make_cli(builtins_only), ["show", "mlmm"])
    assert result.exit_code == 1
    assert "Did you mean 'mlm'?" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.e2e
def test_no_traceback_reaches_the_terminal():
    env = {k: v for k, v in os.environ.items() if k != "OBJREG_RAISE_ERRORS"}
    result = subprocess.run(
        [sys.executable, "-m", "objreg", "show", "mlmm"], capture_output=True, text=True, env=env, timeout=1800
    )
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.startswith("Error: unknown objective or task 'mlmm'. Did you mean 'mlm'?")
    assert "Traceback" not in result.stderr


class WarningPlugin:
    """A plugin whose command warns, as a task does when it skips malformed records."""

    @objreg.hookimpl
    def objreg_register_commands(self, cli: click.Group) -> None:
        @cli.command()
        def warn() -> None:
            """Warn once."""
            import warnings

            warnings.warn("skipped 2 records whose answer does not match", stacklevel=1)
            click.echo("done")


def test_warnings_are_one_line_each(runner):
    result = runner.invoke(cli_with(WarningPlugin()), ["warn"])
    assert result.exit_code == 0
    assert result.stderr == "Warning: skipped 2 records whose answer does not match\n"
    assert result.stdout == "done\n"
