"""Errors in the caller's own words: keyword arguments for Python, flags for the command line.

The run's checks write their messages once, naming the command line's flags (``--seq-len 64 is
too short``). ``objreg.analyze`` and ``AnalysisConfig`` are also called from Python, where the
same setting is a keyword argument: there a message names ``seq_len=64`` instead
(:func:`speaks_keywords`). The command line marks its calls (:func:`command_line`), and its
messages keep the flags. A flag that is no keyword argument (torchrun's ``--nproc-per-node``)
stays as it is.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

from objreg.core.errors import ObjregError

_COMMAND_LINE: ContextVar[bool] = ContextVar("objreg_command_line", default=False)
#: Flags whose keyword argument is not the flag's own name.
_RENAMED = {"out": "out_dir", "param": "objective_params"}
#: Words that follow a flag in a sentence rather than give its value (``--seq-len or ...``).
_NOT_VALUES = ("or", "and", "with", "to", "is", "are", "for", "of", "in", "on", "at", "a", "an", "the", "then",
               "instead", "alone", "beside", "from", "as", "than", "if", "when", "which", "that", "it", "too",
               "must", "cannot", "can", "takes", "gives", "needs", "names")
#: A flag, and the space before its value where one follows (``--seq-len 64``: the value 64).
_FLAG = re.compile(r"(?<![\w-])--([a-z][a-z0-9-]*)(?: (?!(?:" + "|".join(_NOT_VALUES) + r")\b)(?=[^\s,;.)]))?")
Function = TypeVar("Function", bound=Callable[..., Any])


@contextmanager
def command_line() -> Iterator[None]:
    """Inside, the run's messages name flags (the command line calls ``objreg.analyze`` in it)."""
    token = _COMMAND_LINE.set(True)
    try:
        yield
    finally:
        _COMMAND_LINE.reset(token)


def in_command_line() -> bool:
    return _COMMAND_LINE.get()


def keywords() -> set[str]:
    """The keyword arguments of ``objreg.analyze``: every ``AnalysisConfig`` field, and its own."""
    from objreg.analysis.run.config import AnalysisConfig

    return {f.name for f in dataclasses.fields(AnalysisConfig)} | {"out_dir", "resume", "pretrain", "downstream",
                                                                  "checkpoint_every"}


def as_keywords(message: str) -> str:
    """``message`` with each flag of a setting as its keyword argument (``--seq-len 64`` →
    ``seq_len=64``, ``--downstream-data`` → ``downstream_data=``)."""
    names = keywords()

    def keyword(match: re.Match[str]) -> str:
        flag = match.group(1)
        name = _RENAMED.get(flag, flag.replace("-", "_"))
        return f"{name}=" if name in names else match.group(0)

    return _FLAG.sub(keyword, message)


def option(name: str) -> str:
    """How the caller names the setting ``name``: ``--head-fit-size`` or ``head_fit_size=``."""
    flag = {v: k for k, v in _RENAMED.items()}.get(name, name.replace("_", "-"))
    return f"--{flag}" if in_command_line() else f"{name}="


def speaks_keywords(function: Function) -> Function:
    """``function``'s errors name keyword arguments, unless it runs in :func:`command_line`."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except ObjregError as error:
            if not in_command_line() and error.args and isinstance(error.args[0], str):
                error.args = (as_keywords(error.args[0]), *error.args[1:])
            raise

    return wrapper  # type: ignore[return-value]
