"""What the riding hooks (:class:`~objreg.analysis.math.riding.RidingDots`) keep while the loop's
pass runs: each call of a module owning measured parameters, until its output's gradient arrives
(:class:`ModuleCall`), and each marked objective's share of a pass (:class:`Segment`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from objreg.analysis.math.functional import Params
from objreg.analysis.math.per_example_linear import Slot


@dataclass
class ModuleCall:
    """One call of a module owning measured parameters, waiting for its output's gradient."""

    module: nn.Module
    values: Params
    args: tuple
    kwargs: dict
    own: dict[str, str]
    rows: int
    segment: Segment | None = None
    slot: Slot | None = None  # a per-example linear layer's hand-over (``per_example=True``)
    batch_dim: int = 0  # where the rows are in the output (1: a sequence-first nn.MultiheadAttention)
    rng: tuple | None = None  # the generators' state as the call began, for its replay (its dropout)


@dataclass
class Segment:
    """One marked objective's losses in one pass: its calls' contributions, and ``∂L/∂ℓ``."""

    name: str
    rows: int
    contributions: list[list[torch.Tensor]]  # per direction, per call: [rows]
    cotangent: torch.Tensor | None = None
    calls: int = 0
    hooks: list[Any] = field(default_factory=list)
    #: The measured parameters its losses depend on (their autograd graph), where asked for.
    depends: set[str] | None = None
    #: The measured parameters its calls' contractions covered.
    reached: set[str] = field(default_factory=set)
    #: The measured parameters its losses use outside every call of a module owning them.
    outside: set[str] = field(default_factory=set)
