"""The objectives' forwards replayed as the loop ran them, so the probe's own gradients are of the
step the loop took: a forward pre-hook keeps the random state and the modules' modes of the
loop's first training-mode forward since the last optimizer step (:func:`forward_seer`), and
:func:`replayed` restores them around the probe's forwards (dropout's masks included).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel


@dataclass
class LoopForward:
    """What the loop's first training-mode forward since the last optimizer step ran with."""

    cpu: torch.Tensor
    cuda: list[torch.Tensor]
    modes: list[tuple[nn.Module, bool]]


def forward_seer(probe: weakref.ref, twin: nn.Module | None = None) -> Callable[..., None]:
    """A forward pre-hook keeping, for the probe (while it lives), the random state and the
    modules' modes of the loop's first training-mode forward after each optimizer step (the modes
    for ``twin``'s modules, where the probe measures on a twin of the hooked model)."""

    def see(module: nn.Module, args: Any) -> None:
        alive = probe()
        if alive is not None and alive._forward is None and module.training:
            cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else []
            modes = [(t, m.training) for m, t in zip(module.modules(), (twin or module).modules())]
            alive._forward = LoopForward(torch.get_rng_state(), cuda, modes)

    return see


@contextmanager
def replayed(forward: LoopForward | None, model: nn.Module) -> Iterator[None]:
    """The objectives' forwards as the loop ran them: its modules' modes, its random state at its
    first forward (the objectives drawing in turn, in their order, as the loop's did), the fused
    attention kernels allowed again, the model's buffers (batch norm's running statistics) kept.
    Nothing where the loop ran no training-mode forward (the probe's ``eval()`` mode stands)."""
    if forward is None:
        yield
        return
    current = [(m, m.training) for m in model.modules()]
    buffers = [b.clone() for b in model.buffers()]
    for module, training in forward.modes:
        module.training = training
    torch.set_rng_state(forward.cpu)
    if forward.cuda:
        torch.cuda.set_rng_state_all(forward.cuda)
    try:
        with sdpa_kernel([b for b in SDPBackend.__members__.values() if b != SDPBackend.ERROR]):
            yield
    finally:
        for module, training in current:
            module.training = training
        with torch.no_grad():
            for kept, buffer in zip(buffers, model.buffers()):
                buffer.copy_(kept)
