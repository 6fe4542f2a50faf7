"""The plugin manager factory: built-ins and installed plugins through one door.

Built-ins are a tuple of ``(name, module)`` pairs, imported by name (core never imports a plugin
module directly) and registered with the same call as entry points of the ``objreg`` group, so
they load with entry-point loading switched off and in an uninstalled checkout.

Environment switches:
    ``OBJREG_LOAD_PLUGINS``: comma-separated allow-list of entry-point names to load; empty loads
    none (the escape hatch when an installed plugin breaks the CLI).
    ``OBJREG_TRACE_PLUGINS=1``: print every hook call and its result to stderr (pluggy's tracing).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import sys
from collections import defaultdict
from typing import Any

import pluggy

from objreg.core import hookspecs

ENTRY_POINT_GROUP = "objreg"
BUILTIN_DISTRIBUTION = "objreg (built-in)"

#: Built-in plugins: ``(registration name, module)``. Objectives and tasks are registered under
#: their objective name, exactly as an entry point ``name = "module"`` would register them.
BUILTIN_PLUGINS: tuple[tuple[str, str], ...] = (
    ("clm", "objreg.plugins.objectives.clm"),
    ("mlm", "objreg.plugins.objectives.mlm"),
    ("wwm", "objreg.plugins.objectives.wwm"),
    ("span", "objreg.plugins.objectives.span"),
    ("sop", "objreg.plugins.objectives.sop"),
    ("t5", "objreg.plugins.objectives.t5"),
    ("prefix_lm", "objreg.plugins.objectives.prefix_lm"),
    ("ul2", "objreg.plugins.objectives.ul2"),
    ("bart", "objreg.plugins.objectives.bart"),
    ("fim", "objreg.plugins.objectives.fim"),
    ("nsp", "objreg.plugins.objectives.nsp"),
    ("contrastive", "objreg.plugins.objectives.contrastive"),
    ("rtd", "objreg.plugins.objectives.rtd"),
    ("qa", "objreg.plugins.tasks.qa"),
    ("classification", "objreg.plugins.tasks.classification"),
    ("token_classification", "objreg.plugins.tasks.token_classification"),
    ("ordering", "objreg.plugins.tasks.ordering"),
    ("objreg.heads", "objreg.plugins.heads"),
    ("objreg.models.transformer", "objreg.plugins.models.transformer"),
    ("objreg.models.hf", "objreg.plugins.models.hf"),
    ("objreg.corpora.default", "objreg.plugins.corpora.default"),
    # Before files: a save_to_disk directory is a directory too.
    ("objreg.corpora.hf_datasets", "objreg.plugins.corpora.hf_datasets"),
    ("objreg.corpora.files", "objreg.plugins.corpora.files"),
)


class ObjregPluginManager(pluggy.PluginManager):
    """A pluggy manager that also remembers which distribution each plugin came from and the
    problems met while loading, so validation can report them all together."""

    def __init__(self) -> None:
        super().__init__(hookspecs.PROJECT)
        self.add_hookspecs(hookspecs)
        self.origins: dict[str, str] = {}
        self.load_problems: list[str] = []

    def register_plugin(self, plugin: Any, name: str, origin: str) -> None:
        """Register ``plugin`` under ``name``; ``origin`` names the distribution that provides it."""
        if self.has_plugin(name):
            self.load_problems.append(f"two plugins claim the name {name!r}: {self.origin(name)} and {origin}")
            return
        if self.is_registered(plugin):
            other = self.get_name(plugin)
            self.load_problems.append(
                f"one plugin is registered under two names, {other!r} ({self.origin(other)}) and {name!r} ({origin})"
            )
            return
        try:
            self.register(plugin, name=name)
        except pluggy.PluginValidationError as e:
            self.load_problems.append(f"plugin {name!r} from {origin}: {e}")
            return
        self.origins[name] = origin

    def origin(self, name: str) -> str:
        return self.origins.get(name, "registered at run time")


def _distribution_label(ep: importlib.metadata.EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return f"entry point {ep.name} = {ep.value}"
    return f"{dist.metadata['Name']} {dist.version}"


def _allowed_entry_points() -> set[str] | None:
    raw = os.environ.get("OBJREG_LOAD_PLUGINS")
    if raw is None:
        return None
    return {n.strip() for n in raw.split(",") if n.strip()}


def load_entry_points(pm: ObjregPluginManager) -> None:
    """Register every plugin of the ``objreg`` entry-point group (honouring the allow-list).

    pluggy's own loader silently skips an entry point whose name is taken; this one reports both
    claimants, and reports an import failure with the distribution that caused it.
    """
    allowed = _allowed_entry_points()
    by_name: dict[str, list[importlib.metadata.EntryPoint]] = defaultdict(list)
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if allowed is None or ep.name in allowed:
            by_name[ep.name].append(ep)
    for name, eps in sorted(by_name.items()):
        labels = sorted({_distribution_label(ep) for ep in eps})
        if len(labels) > 1:
            pm.load_problems.append(f"two distributions claim the plugin name {name!r}: {' and '.join(labels)}")
            continue
        ep = eps[0]
        try:
            plugin = ep.load()
        except Exception as e:  # noqa: BLE001 - any import failure must name the distribution
            pm.load_problems.append(
                f"plugin {name!r} from {labels[0]} failed to import: {type(e).__name__}: {e} "
                f"(OBJREG_LOAD_PLUGINS='' skips installed plugins)"
            )
            continue
        pm.register_plugin(plugin, name, labels[0])


def get_plugin_manager(*, load_entrypoints: bool = True, builtins: bool = True) -> ObjregPluginManager:
    """A fresh plugin manager with the built-ins and (optionally) installed plugins registered.

    A new manager per call: there is no global state for tests to work around. Validation of the
    loaded plugins happens when a :class:`objreg.core.registry.Registry` is built on it.
    """
    pm = ObjregPluginManager()
    if builtins:
        for name, module in BUILTIN_PLUGINS:
            pm.register_plugin(importlib.import_module(module), name, BUILTIN_DISTRIBUTION)
    if load_entrypoints:
        load_entry_points(pm)
    if os.environ.get("OBJREG_TRACE_PLUGINS", "") not in ("", "0"):
        pm.trace.root.setwriter(sys.stderr.write)
        pm.enable_tracing()
    return pm
