"""The fixed downstream evaluation set that defines ``D(θ)``, in length-sorted, trimmed chunks.

Every probe evaluates ``D`` twice and takes its gradient and Hessian-vector products, so ``D``
is the analysis' hot loop. Task rows are padded to ``seq_len`` (58% of the default ``qa`` set's
tokens are padding), and padding is excluded by position, so the set is sorted by length, cut
into chunks, and each chunk is trimmed to its longest row: the same ``D`` for a fraction of the
work (attention costs grow as the square of the row length).

Trimming cuts every ``[B, T, ...]`` tensor of the batch (``extras`` included) along its second
dimension. A task whose extras have a second dimension of size ``T`` that does not run along the
sequence would be broken by that, so :meth:`Downstream.check` compares the per-example losses of
the trimmed chunks with those of the padded set once, and the padded set is used where they
differ.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from objreg.analysis.functional import ObjectiveFunction, detached, shared_parameters
from objreg.core.registry import Objective
from objreg.core.types import CorruptedBatch


def trimmed(batch: CorruptedBatch) -> CorruptedBatch:
    """``batch`` without the trailing columns that are padding in every row."""
    width = batch.input_ids.shape[1]
    real = (~batch.is_padding).any(0).nonzero()
    keep = int(real.max()) + 1 if len(real) else 1
    if keep == width:
        return batch

    def cut(t: torch.Tensor) -> torch.Tensor:
        return t[:, :keep] if t.dim() >= 2 and t.shape[1] == width else t

    return CorruptedBatch(*(cut(t) for t in batch[:5]), {k: cut(v) for k, v in batch.extras.items()})


def length_order(batch: CorruptedBatch) -> torch.Tensor:
    """Example indices from the shortest row to the longest (stable)."""
    return torch.sort((~batch.is_padding).sum(1), stable=True).indices


@dataclass
class Downstream:
    """The downstream evaluation set: ``D(θ)`` is the mean of the task's loss over its examples.

    Args:
        task: The downstream task.
        batch: Its evaluation examples.
        chunk_size: Examples per chunk (bounds memory; small chunks trim more padding).
    """

    task: Objective
    batch: CorruptedBatch
    chunk_size: int = 16
    chunks: list[CorruptedBatch] = field(init=False)
    compact: bool = field(init=False, default=True)

    def __post_init__(self) -> None:
        self.order = length_order(self.batch)
        self.chunks = [trimmed(self.batch.select(self.order[s:s + self.chunk_size]))
                       for s in range(0, self.batch.batch_size, self.chunk_size)]

    @property
    def tokens(self) -> int:
        """Token positions one evaluation of ``D`` computes (padding included)."""
        return sum(c.input_ids.numel() for c in self.chunks)

    def check(self, model: nn.Module) -> bool:
        """Use the trimmed chunks only if they give the padded set's per-example losses (to
        rounding); returns whether they do."""
        shared = detached(shared_parameters(model))
        with torch.no_grad():
            padded = ObjectiveFunction(model, self.task, self.batch)(shared)[self.order]
            try:
                compact = torch.cat([ObjectiveFunction(model, self.task, c)(shared) for c in self.chunks])
                tolerance = 1e-9 if compact.dtype == torch.float64 else 1e-4
                self.compact = compact.shape == padded.shape and bool(
                    torch.allclose(compact, padded, rtol=tolerance, atol=tolerance * float(padded.abs().max()))
                )
            except (RuntimeError, IndexError, ValueError):
                self.compact = False
        if not self.compact:
            self.order = torch.arange(self.batch.batch_size)
            self.chunks = [self.batch.select(slice(s, s + self.chunk_size))
                           for s in range(0, self.batch.batch_size, self.chunk_size)]
        return self.compact

    def functions(self, model: nn.Module) -> list[ObjectiveFunction]:
        """``D`` as per-chunk functions of the shared parameters (weighted by example count)."""
        return [ObjectiveFunction(model, self.task, chunk) for chunk in self.chunks]

    @torch.no_grad()
    def loss(self, model: nn.Module) -> float:
        """``D`` at the model's current parameters."""
        shared = detached(shared_parameters(model))
        total = sum(f(shared).sum() for f in self.functions(model))
        return float(total) / self.batch.batch_size
