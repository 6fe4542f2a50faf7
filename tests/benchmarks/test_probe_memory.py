"""benchmarks/probe_memory.py wraps the probe's phases by name: each must still exist, or the
benchmark fails only when someone runs it."""

from __future__ import annotations

import pytest
from benchmark_files import load

probe_memory = load("probe_memory")


@pytest.mark.parametrize("owner, attribute, phase", probe_memory.WRAPPED, ids=[p for _, _, p in probe_memory.WRAPPED])
def test_every_wrapped_phase_exists(owner, attribute, phase):
    assert callable(getattr(owner, attribute, None)), f"{phase}: {owner.__name__}.{attribute} is gone"
