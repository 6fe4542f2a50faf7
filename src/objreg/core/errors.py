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


class DeviceError(ObjregError, RuntimeError):
    """A device was asked for that this machine does not have."""
