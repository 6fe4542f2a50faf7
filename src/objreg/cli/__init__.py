"""The ``objreg`` command line: a click group of thin commands (one module each).

The group does three things beyond click's: it turns library errors into one line and exit code 1
(the only place errors are handled); it asks plugins for extra commands through the
``objreg_register_commands`` hook, lazily, so built-in commands never pay for it; and it imports
each built-in command's module only when that command runs (or help lists it), so ``objreg
--version`` loads neither torch nor the analyzer.
"""

from __future__ import annotations

import importlib
import os
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import click

import objreg
from objreg.cli import threads
from objreg.cli.render import _PLUGIN_MANAGER_KEY, plugin_manager

RAISE_ERRORS_ENV = "OBJREG_RAISE_ERRORS"
_PLUGIN_COMMANDS_KEY = "objreg.plugin_commands"
#: The built-in commands: name → (module, attribute), imported when the command is used.
BUILTIN = {
    "list": ("objreg.cli.listing", "list_command"),
    "show": ("objreg.cli.show", "show"),
    "corrupt": ("objreg.cli.corrupt", "corrupt"),
    "analyze": ("objreg.cli.analyze", "analyze"),
    "screen": ("objreg.cli.screen", "screen"),
    "finetune": ("objreg.cli.finetune", "finetune"),
    "split": ("objreg.cli.split", "split"),
    "experiment": ("objreg.cli.experiment", "experiment"),
}
#: Each built-in command's first sentence, so that ``objreg --help`` lists them without importing
#: them (and torch); ``tests/cli/test_startup.py`` checks each against its command's own help.
SHORT_HELP = {
    "list": "List pre-training objectives, downstream tasks, modifiers, models, corpora, tokenizers and head "
            "kinds, with the plugin each comes from.",
    "show": "Show an objective's or task's description, heads, parameters and references.",
    "corrupt": "Corrupt TEXTs with objective NAME and show input, labels and attention mask.",
    "analyze": "Train on a weighted mix of pre-training objectives and measure how each one's gradient aligns "
               "with the downstream task's gradient, how the updates meet the downstream curvature, and how well "
               "the first- and second-order Taylor predictions match the change that happened.",
    "screen": "Rank pre-training objectives for a downstream task from short runs off one shared start: each "
              "candidate's score is the predicted first-order drop of D* (the re-fitted downstream head's loss) "
              "per step, averaged over the run with an interval; candidates whose intervals overlap are tied (=).",
    "finetune": "Fine-tune MODEL_OR_RUN (a model name, a Hugging Face model directory, or the --out directory of an "
                "`objreg analyze` run of continued pre-training) on a downstream task and report the task's metric "
                "on held-out rows, with a 95% interval over seeds (one seed: over folds), beside the linear probe's "
                "D* and metric on the same splits.",
    "split": "Split DATA (a GLUE-style TSV or JSONL classification file) into rows to train on and rows held out, "
             "and write the training rows' text as a corpus: pre-train on train.txt (objreg analyze --corpus), "
             "fine-tune on train.EXT and score on heldout.EXT (objreg finetune --eval-data).",
    "experiment": "Runnable experiments that check claims of the pre-training objective literature.",
}


class ObjregGroup(click.Group):
    """The root group.

    Args:
        plugin_manager_factory: Builds the plugin manager the commands use (called at most once
            per invocation). Tests pass a factory for a manager with their own plugins.
    """

    def __init__(
        self, *args: Any, plugin_manager_factory: Callable[[], Any] = objreg.get_plugin_manager, **kwargs: Any
    ):
        super().__init__(*args, **kwargs)
        self.plugin_manager_factory = plugin_manager_factory

    # -- plugin commands ----------------------------------------------------------------------

    def plugin_commands(self, ctx: click.Context) -> dict[str, click.Command]:
        """Commands added by plugins, collected once per invocation.

        Plugins register on a scratch group rather than on this one, so a plugin seen in one
        invocation (a test's throwaway plugin, say) does not stay attached to the module-level
        ``cli`` afterwards. A plugin cannot replace a built-in command.
        """
        root = ctx.find_root()
        if _PLUGIN_COMMANDS_KEY not in root.meta:
            with _errors_as_click_exceptions():
                scratch = click.Group()
                # The built-in plugins register no command: with the default plugins, only the
                # installed ones are asked (the built-ins, and torch with them, stay unloaded).
                pm = (objreg.get_plugin_manager(builtins=False)
                      if self.plugin_manager_factory is objreg.get_plugin_manager else plugin_manager(ctx))
                pm.hook.objreg_register_commands(cli=scratch)
            root.meta[_PLUGIN_COMMANDS_KEY] = {n: c for n, c in scratch.commands.items() if n not in BUILTIN}
        return root.meta[_PLUGIN_COMMANDS_KEY]

    def list_commands(self, ctx: click.Context) -> list[str]:
        # `objreg --help` lists plugin commands too, so it imports the plugins (but validates and
        # builds nothing).
        return sorted({*BUILTIN, *self.plugin_commands(ctx)})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in BUILTIN:  # built-ins: no plugin loading
            module, attribute = BUILTIN[cmd_name]
            return getattr(importlib.import_module(module), attribute)
        return self.plugin_commands(ctx).get(cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The command list of ``objreg --help``: built-ins from :data:`SHORT_HELP`, unimported."""
        plugins = self.plugin_commands(ctx)
        names = self.list_commands(ctx)
        if not names:
            return
        limit = formatter.width - 6 - max(len(n) for n in names)
        # A bare Command shortens a help text as click does its own (no deprecated helper, no import).
        rows = [(n, (click.Command(n, help=SHORT_HELP[n]) if n in BUILTIN else plugins[n]).get_short_help_str(limit))
                for n in names]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    # -- errors -------------------------------------------------------------------------------

    def invoke(self, ctx: click.Context) -> Any:
        with _errors_as_click_exceptions(), _warnings_as_lines():
            return super().invoke(ctx)


@contextmanager
def _warnings_as_lines() -> Iterator[None]:
    """Show each warning (e.g. "skipped 3 questions whose answer does not match") as one
    ``Warning: ...`` line on stderr, not Python's file:line dump of the code that raised it."""

    def show(message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any) -> None:
        click.echo(f"Warning: {message}", err=True)

    with warnings.catch_warnings():
        warnings.showwarning = show
        yield


def _current_plugin_manager() -> Any:
    """The plugin manager this invocation built, if it built one."""
    ctx = click.get_current_context(silent=True)
    return ctx.find_root().meta.get(_PLUGIN_MANAGER_KEY) if ctx is not None else None


@contextmanager
def _errors_as_click_exceptions() -> Iterator[None]:
    """Turn exceptions into click's one-line ``Error: ...`` and exit code 1.

    An ``ObjregError`` is a problem with the user's input or plugins: its message is shown as is.
    Anything else is a bug: one line names it and how to see the traceback. With
    ``OBJREG_RAISE_ERRORS=1`` every error goes through untouched, traceback and all. Click's own
    exceptions pass unchanged (usage errors exit 2, ``--help`` exits 0).
    """
    try:
        yield
    except (click.ClickException, click.exceptions.Exit, click.exceptions.Abort):
        raise
    except Exception as error:
        if os.environ.get(RAISE_ERRORS_ENV, "") not in ("", "0"):
            raise
        if isinstance(error, objreg.ObjregError):
            raise click.ClickException(str(error)) from error
        # A full disk, no memory, a forbidden directory; an installed plugin's exception.
        from objreg.analysis.run.failures import describe as describe_failure

        described = describe_failure(error, pm=_current_plugin_manager())
        if described is not None:
            raise click.ClickException(str(described)) from error
        if isinstance(error, RecursionError):
            raise click.ClickException("an input is nested too deeply to read (a JSON file?)") from error
        raise click.ClickException(
            f"internal error: {type(error).__name__}: {error} (set {RAISE_ERRORS_ENV}=1 for the traceback)"
        ) from error


def make_cli(plugin_manager_factory: Callable[[], Any] = objreg.get_plugin_manager) -> ObjregGroup:
    """A fresh ``objreg`` group; ``plugin_manager_factory`` decides which plugins it sees."""

    @click.group(
        name="objreg",
        cls=ObjregGroup,
        plugin_manager_factory=plugin_manager_factory,
        context_settings={"help_option_names": ["-h", "--help"]},
    )
    @click.version_option(objreg.__version__, prog_name="objreg")
    def group() -> None:
        """Pre-training objectives as plugins, and how their gradients align with a downstream task.

        Set OBJREG_LOAD_PLUGINS='' to skip installed plugins (when one breaks the CLI) and
        OBJREG_TRACE_PLUGINS=1 to print every hook call.
        """

    return group


cli = make_cli()


def main() -> None:
    """The ``objreg`` console script. Before torch loads, a busy machine's OpenMP threads are set
    to sleep while they wait (:func:`objreg.cli.threads.prepare_environment`)."""
    threads.prepare_environment()
    cli(prog_name="objreg")


__all__ = ["ObjregGroup", "cli", "main", "make_cli"]
