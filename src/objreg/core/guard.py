"""Exceptions raised inside a plugin's code, attributed to that plugin.

Every hook an :class:`~objreg.core.handles.Objective` or :class:`~objreg.core.handles.Task`
calls, and every provider the registry loads through, runs inside :func:`attributed`: an
exception that is not an :class:`~objreg.core.errors.ObjregError` (those are messages meant for
the user) and that comes from an installed plugin becomes a :class:`PluginFailure` naming the
plugin, the hook and the distribution, and pointing to ``OBJREG_LOAD_PLUGINS``. The plugin is
the one whose code is deepest in the traceback (a hook may call into another plugin's helpers,
or into torch). An exception from objreg's own built-in plugins is objreg's bug, and passes
unchanged (the CLI reports it as an internal error).
"""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from objreg.core.errors import ObjregError, PluginFailure
from objreg.core.manager import BUILTIN_DISTRIBUTION as BUILTIN

T = TypeVar("T")
RUN_TIME = "registered at run time"


def _plugin_files(pm: Any) -> list[tuple[str, str, bool]]:
    """``(plugin name, file or directory, is a directory)`` for every named plugin."""
    found = []
    for name, plugin in pm.list_name_plugin():
        if plugin is None:
            continue
        module = plugin if isinstance(plugin, types.ModuleType) else sys.modules.get(type(plugin).__module__)
        file = getattr(module, "__file__", None)
        if not file:
            continue
        found.append((name, os.path.realpath(file), False))
        package = (getattr(module, "__package__", "") or "").split(".")[0]
        if package and package != "objreg" and "." in (getattr(module, "__name__", "") or ""):
            # A third-party plugin's helpers live in its package: blame the plugin for them too.
            found.append((name, os.path.dirname(os.path.realpath(file)) + os.sep, True))
    return found


def _frames(error: BaseException) -> Iterator[str]:
    tb = error.__traceback__
    while tb is not None:
        yield os.path.realpath(tb.tb_frame.f_code.co_filename)
        tb = tb.tb_next


def culprit(pm: Any, error: BaseException) -> str | None:
    """The plugin whose code is deepest in ``error``'s traceback, or None."""
    files = _plugin_files(pm)
    blamed = None
    for filename in _frames(error):
        for name, where, is_directory in files:
            if (filename.startswith(where) if is_directory else filename == where):
                blamed = name
                break
    return blamed


def failure(pm: Any, hook: str, error: BaseException, default: str | None = None) -> PluginFailure | None:
    """The :class:`PluginFailure` for ``error`` raised in ``hook``, or None where it is objreg's
    own (a built-in plugin, or no plugin at all) or a deliberate :class:`ObjregError`."""
    if isinstance(error, ObjregError):
        return None
    name = culprit(pm, error) or default
    if name is None:
        return None
    origin = pm.origin(name) if hasattr(pm, "origin") else RUN_TIME
    if origin == BUILTIN:
        return None
    return PluginFailure(name, hook, origin, error, escape_hatch=origin != RUN_TIME)


def attributed(pm: Any, hook: str, function: Callable[..., T], *args: Any, default: str | None = None,
               **kwargs: Any) -> T:
    """``function(*args, **kwargs)``, its plugin's exceptions attributed (module docstring)."""
    try:
        return function(*args, **kwargs)
    except Exception as error:
        attributed_error = failure(pm, hook, error, default)
        if attributed_error is None:
            raise
        raise attributed_error from error


class GuardedHook:
    """A pluggy hook caller whose calls run inside :func:`attributed`; everything else
    (``get_hookimpls``, ...) is the caller's."""

    def __init__(self, pm: Any, hook: str, caller: Any, default: str):
        self._pm, self._hook, self._caller, self._default = pm, hook, caller, default

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return attributed(self._pm, self._hook, self._caller, *args, default=self._default, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._caller, name)
