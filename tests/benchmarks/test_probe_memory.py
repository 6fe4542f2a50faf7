"""benchmarks/probe_memory.py wraps the probe's phases by name: each must still exist, or the
benchmark fails only when someone runs it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _load() -> object:
    """benchmarks/probe_memory.py, loaded from its file (the benchmarks are not an installed package)."""
    spec = importlib.util.spec_from_file_location("probe_memory", REPO / "benchmarks" / "probe_memory.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


probe_memory = _load()


@pytest.mark.parametrize("owner, attribute, phase", probe_memory.WRAPPED, ids=[p for _, _, p in probe_memory.WRAPPED])
def test_every_wrapped_phase_exists(owner, attribute, phase):
    assert callable(getattr(owner, attribute, None)), f"{phase}: {owner.__name__}.{attribute} is gone"
