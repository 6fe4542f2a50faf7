"""Help text of ``objreg analyze``, generated from what the code validates against.

Fixed sets of values (optimizers, dtypes, devices, per-sample and HVP methods) come from
:data:`objreg.analysis.run.config.CHOICES`, which :class:`~objreg.analysis.run.config.AnalysisConfig`
validates with; defaults from the ``AnalysisConfig`` fields; objectives, tasks, models and
corpora from the registry of the running CLI (so an installed plugin's task shows up in
``--help`` exactly when ``--downstream`` accepts it). ``tests/test_docs.py`` checks that the help
names every accepted value and that docs/cli.md holds the current help.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import click

import objreg
from objreg.analysis.run.config import CHOICES
from objreg.cli import render

#: ``AnalysisConfig``'s defaults by field name.
DEFAULTS: dict[str, Any] = {
    f.name: f.default for f in dataclasses.fields(objreg.AnalysisConfig) if f.default is not dataclasses.MISSING
}


def default(name: str) -> str:
    """``(default: 16)`` for the field ``name``."""
    return f"(default: {DEFAULTS[name]})"


def choices(name: str, intro: str) -> str:
    """``intro`` with the default of the setting ``name``, then every accepted value with what it does."""
    values = "; ".join(f"{value}: {what}" for value, what in CHOICES[name].items())
    return f"{intro} {default(name)}. {values}."


class RegistryOption(click.Option):
    """An option whose help names what the registry of this invocation offers (tasks, objectives,
    models, corpora), computed only when help is shown.

    Args:
        describe: ``describe(registry) -> help``.
        fallback: The help when the plugins cannot be loaded (a broken plugin must not break ``--help``).
    """

    def __init__(self, *args: Any, describe: Callable[[objreg.Registry], str], fallback: str, **kwargs: Any):
        super().__init__(*args, help=fallback, **kwargs)
        self.describe = describe

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        try:
            self.help = self.describe(render.registry(ctx))
        except objreg.ObjregError:
            pass  # keep the fallback
        return super().get_help_record(ctx)


def _names(names: list[str]) -> str:
    return ", ".join(names) if names else "none installed"


def _providers(registry: objreg.Registry, kind: str) -> str:
    """Exact names first, then each family of names (``DIR``, ``hf:NAME``) with what it takes."""
    providers = [p for p in registry.providers(kind) if not p.fallback]
    exact = [p.name for p in providers if p.accepts is None]
    families = [f"{p.name}: {p.description}" for p in providers if p.accepts is not None]
    return "; ".join([", ".join(exact), *families] if exact else families)


def describe_pretrain(registry: objreg.Registry) -> str:
    return (f"Comma-separated pre-training objectives, e.g. mlm,sop (required): {_names(registry.objectives())}. "
            f"`objreg list` describes them, `objreg show NAME` their parameters.")


def describe_downstream(registry: objreg.Registry) -> str:
    tasks = "; ".join(f"{name} ({registry.info(name).description})" for name in registry.tasks())
    return f"Downstream task {default('downstream')}: {tasks or 'none installed'}."


def describe_model(registry: objreg.Registry) -> str:
    return f"The backbone {default('model')}: {_providers(registry, 'model')}. `objreg list` describes each."


def describe_corpus(registry: objreg.Registry) -> str:
    return (f"Pre-training text {default('corpus')}: {_providers(registry, 'corpus')}. `objreg list` describes "
            f"each.")
