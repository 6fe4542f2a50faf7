"""Every error objreg raises on purpose derives from :class:`ObjregError`.

The CLI turns these into one line on stderr and a non-zero exit; anything else is a bug.
Messages say what is wrong and what is allowed, so the user can fix the input without reading code.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class ObjregError(Exception):
    """Base class of every error objreg raises on purpose."""


class UnknownNameError(ObjregError, KeyError):
    """A name (objective, task, model, corpus, parameter) that nothing registered answers to."""

    def __init__(self, kind: str, name: str, available: Iterable[str]):
        self.kind = kind
        self.name = name
        self.available = sorted(available)
        super().__init__(self._message())

    def _message(self) -> str:
        close = difflib.get_close_matches(self.name, self.available, n=3, cutoff=0.6)
        hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        listed = ", ".join(self.available) if self.available else "(none)"
        return f"unknown {self.kind} {self.name!r}.{hint} Available: {listed}."

    def __str__(self) -> str:  # KeyError would otherwise wrap the message in quotes
        return self.args[0]


class UnknownObjectiveError(UnknownNameError):
    def __init__(self, name: str, available: Iterable[str], kind: str = "objective"):
        super().__init__(kind, name, available)


class InvalidParameterError(ObjregError, ValueError):
    """A parameter value (objective parameter, CLI option, config field) that is not allowed."""


class DataError(ObjregError, ValueError):
    """A corpus, data file or batch that cannot be used: missing, empty, malformed, too short."""


class PluginError(ObjregError):
    """Plugins that break the contract. Collects every problem found, so all are fixed in one go."""

    def __init__(self, problems: Iterable[str]):
        self.problems = list(problems)
        if len(self.problems) == 1:
            message = f"plugin contract broken: {self.problems[0]}"
        else:
            message = "plugin contract broken:\n" + "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(message)


class NonFiniteLossError(ObjregError, FloatingPointError):
    """A loss became NaN or infinite during training or analysis."""


class ProbeStateError(ObjregError, RuntimeError):
    """A :class:`~objreg.TransferProbe` used out of order (measure after the step, a missed Adam step)."""


class DeviceError(ObjregError, RuntimeError):
    """A device was asked for that this machine does not have."""


class DistributedError(ObjregError, RuntimeError):
    """The processes of a distributed run disagree (their settings differ) or lost one another
    (a process stopped in the middle of a collective); the message names the rank."""


class ResourceError(ObjregError, RuntimeError):
    """The machine ran out of something a run needs (disk space, memory) or refused a write;
    the message says what to change."""


class PluginFailure(ObjregError):
    """An exception raised inside a plugin's hook or provider: the message names the plugin,
    the hook and the distribution it came from. The original exception is the ``__cause__``.

    Attributes:
        plugin: The plugin's registered name.
        hook: The hook (or provider) that raised.
        origin: The distribution (and version) the plugin came from.
    """

    def __init__(self, plugin: str, hook: str, origin: str, error: BaseException, escape_hatch: bool = True):
        self.plugin, self.hook, self.origin, self.error = plugin, hook, origin, error
        detail = " ".join(str(error).split())
        if len(detail) > 200:
            detail = detail[:199] + "…"
        message = f"plugin {plugin!r} ({origin}) failed in {hook}: {type(error).__name__}" + (f": {detail}" if detail else "")
        if escape_hatch:
            message += "; to run without installed plugins set OBJREG_LOAD_PLUGINS='' (or list the ones to keep)"
        super().__init__(message)
