"""A benchmark of ``benchmarks/``, loaded from its file: the benchmarks are not an installed
package, and under a bare ``pytest`` the name ``benchmarks`` is this test folder's."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]


def load(name: str) -> ModuleType:
    """``benchmarks/NAME.py`` as a module."""
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
