"""Random numbers for ``objreg_corrupt``, the only hook allowed randomness."""

from __future__ import annotations

import torch


def uniform(shape: tuple[int, ...], generator: torch.Generator, device: torch.device | str | None = None) -> torch.Tensor:
    """U[0, 1) of ``shape`` drawn from ``generator`` on the generator's own device, then moved to
    ``device``: a CPU generator can drive a batch on any device, and the same seed gives the same
    corruption on CPU and GPU."""
    values = torch.rand(shape, generator=generator, device=generator.device)
    return values if device is None else values.to(device)
