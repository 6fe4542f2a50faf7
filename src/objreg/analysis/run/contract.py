"""The plugin contract's cheap checks before a run, on every third-party objective: a plugin that
breaks the contract would give wrong numbers without an error, so each one that fails a check is
one warning naming the first problem (``objreg.testing.check_objective_contract`` lists them all).

The library's :func:`objreg.analyze` runs them, so the command line and a user's own script get
the same warning. Built-in objectives are tested by objreg's own suite and are not checked.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from objreg.core.errors import ObjregError
from objreg.core.registry import Registry


def check_contracts(pretrain: Any, objective_params: Any, registry: Registry, status: Callable[[str], None]) -> None:
    """Warn once for each objective of ``pretrain`` from a third party that fails a cheap check."""
    # objreg.testing builds a tiny model and the analysis' per-sample machinery: loaded only here.
    from objreg.testing import contract_problems, is_third_party

    for name in pretrain:
        try:
            if not is_third_party(registry, name):
                continue
            status(f"checking the plugin contract of {name!r}")
            _, problems = contract_problems(name, registry, params=dict(objective_params.get(name, {})), quick=True)
        except ObjregError:
            continue  # an unknown name or a bad parameter: the run reports it
        if problems:
            first = problems[0].splitlines()[0]
            warnings.warn(
                f"objective {name!r} ({registry.origin(name)}) fails {len(problems)} check(s) of the plugin contract, "
                f"so its numbers may be wrong; the first: {first} (objreg.testing.check_objective_contract({name!r}) "
                f"lists them all)", stacklevel=3,
            )
