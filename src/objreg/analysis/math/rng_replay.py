"""A module call replayed with the random state it ran with (its dropout mask), for the riding
dots' ``jvp`` of a module the loop already called (:mod:`objreg.analysis.math.riding`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


def rng_state(args: tuple) -> tuple:
    """The CPU generator's state, and that of the CUDA device the call runs on (if any)."""
    device = next((a.device for a in args if isinstance(a, torch.Tensor) and a.is_cuda), None)
    return torch.get_rng_state(), device, torch.cuda.get_rng_state(device) if device is not None else None


@contextmanager
def replaying_rng(state: tuple | None) -> Iterator[None]:
    """Run a call's replay with the generators as they were at the call, and leave them as they are."""
    if state is None:
        yield
        return
    cpu, device, cuda = state
    with torch.random.fork_rng(devices=[device] if device is not None else []):
        torch.set_rng_state(cpu)
        if device is not None:
            torch.cuda.set_rng_state(cuda, device)
        yield
