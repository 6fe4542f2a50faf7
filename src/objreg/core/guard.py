"""Exceptions raised inside a plugin's code, attributed to that plugin.

An exception that is not an :class:`~objreg.core.errors.ObjregError` (those are messages meant
for the user) and comes from an installed plugin becomes a :class:`PluginFailure` naming the
plugin, the hook and the distribution, and pointing to ``OBJREG_LOAD_PLUGINS``. The plugin is the
one whose code is deepest in the traceback (a hook may call into its package's helpers, or into
torch); the hook is that plugin's outermost function in the traceback (the hook implementation).
An exception from objreg's own built-in plugins is objreg's bug, and one from a plugin the caller
registered in-process (``pm.register``) is the caller's own code: both are left as they are.

Attribution happens where an error leaves objreg, not around every hook call: the analysis
catches some exceptions of a hook on purpose (an operation without a forward-mode derivative
makes it fall back to another method), and those must reach it unchanged. :func:`objreg.analyze`
and the CLI attribute (:func:`failure`); the registry's provider loads, which no caller catches,
attribute at once (:func:`attributed`), with the provider's name as the hook.
"""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from objreg.core.errors import ObjregError, PluginFailure
from objreg.core.manager import BUILTIN_DISTRIBUTION

T = TypeVar("T")
RUN_TIME = "registered at run time"


def _plugin_files(pm: Any) -> list[tuple[str, str, bool]]:
    """``(plugin name, file or package directory, is a directory)`` for every named plugin."""
    found = []
    for name, plugin in pm.list_name_plugin():
        if plugin is None:
            continue
        module = plugin if isinstance(plugin, types.ModuleType) else sys.modules.get(type(plugin).__module__)
        file = getattr(module, "__file__", None)
        if not file:
            continue
        found.append((name, os.path.realpath(file), False))
        module_name = getattr(module, "__name__", "") or ""
        if "." in module_name and module_name.split(".")[0] != "objreg":
            # A third-party plugin's helpers live in its package: blame the plugin for them too.
            found.append((name, os.path.dirname(os.path.realpath(file)) + os.sep, True))
    return found


def _frames(error: BaseException) -> Iterator[tuple[str, str]]:
    """``(file, function)`` of each frame of ``error``'s traceback, outermost first."""
    tb = error.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        yield os.path.realpath(code.co_filename), code.co_name
        tb = tb.tb_next


def culprit(pm: Any, error: BaseException, hooks_only: bool = False) -> tuple[str, str] | None:
    """``(plugin, its outermost function in the traceback)`` for the plugin whose code is deepest
    in ``error``'s traceback, or None. ``hooks_only``: count only a plugin's hook implementations
    (functions named ``objreg_*``) and what they call, so the caller's own callbacks, defined in a
    module that also holds a plugin, are not blamed on it."""
    files = _plugin_files(pm)
    owners = []
    for filename, function in _frames(error):
        owner = next((name for name, where, is_dir in files
                      if (filename.startswith(where) if is_dir else filename == where)), None)
        owners.append((owner, function))
    if hooks_only:
        entered = next((i for i, (owner, function) in reversed(list(enumerate(owners)))
                        if owner is not None and function.startswith("objreg_")), None)
        if entered is None:
            return None
        return owners[entered]  # type: ignore[return-value]
    blamed = next((owner for owner, _ in reversed(owners) if owner is not None), None)
    if blamed is None:
        return None
    return blamed, next(function for owner, function in owners if owner == blamed)


def failure(pm: Any, error: BaseException, hook: str | None = None) -> PluginFailure | None:
    """The :class:`PluginFailure` for ``error``, or None where it is objreg's own (a built-in
    plugin, or no plugin's code in the traceback) or a deliberate :class:`ObjregError`.
    ``hook``: what was called (default: the plugin's function found in the traceback)."""
    if pm is None or isinstance(error, ObjregError):
        return None
    found = culprit(pm, error, hooks_only=hook is None)
    if found is None:
        return None
    name, function = found
    origin = pm.origin(name) if hasattr(pm, "origin") else RUN_TIME
    if origin in (BUILTIN_DISTRIBUTION, RUN_TIME):
        return None  # objreg's own, or the caller's own code registered in-process: its traceback is theirs
    return PluginFailure(name, hook or function, origin, error)


def attributed(pm: Any, hook: str, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``function(*args, **kwargs)``; an exception from a third-party plugin's code in it becomes
    its :class:`PluginFailure` (cause: the original)."""
    try:
        return function(*args, **kwargs)
    except Exception as error:
        translated = failure(pm, error, hook)
        if translated is None:
            raise
        raise translated from error
