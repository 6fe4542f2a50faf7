"""The fixed downstream evaluation set that defines ``D(θ)``, in length-sorted, trimmed chunks.

Every probe evaluates ``D`` twice and takes its gradient and Hessian-vector products, so ``D``
is the analysis' hot loop. Task rows are padded to ``seq_len`` (much of a short-answer set is
padding: docs/analysis.md), and padding is excluded by position, so the set is sorted by length,
cut into chunks, and each chunk is trimmed to its longest row: the same ``D`` for a fraction of
the work (attention costs grow as the square of the row length).

Trimming cuts every ``[B, T, ...]`` tensor of the batch (``extras`` included) along its second
dimension. A task whose extras have a second dimension of size ``T`` that does not run along the
sequence would be broken by that, so :meth:`Downstream.check` compares the per-example losses of
the trimmed chunks with those of the padded set once, and the padded set is used where they
differ.

``D`` itself (not its derivatives) is evaluated in float64 by default (``evaluation_dtype``),
on a float64 copy of the model holding its current parameters: ``D(θ_{t+1}) − D(θ_t)`` is a
difference of two nearly equal numbers, and in float32 it is quantised to about ``1e-7 · D``
(the rounding of each forward pass), far above the Taylor error at small steps. The points
``θ_t`` and ``θ_{t+1}`` are the float32 parameters themselves (exact in float64), so the
change is the float64 ``D``'s exact change between them, to float64 rounding.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from objreg.analysis.math.curvature import Curvature
from objreg.analysis.math.functional import (
    CallableLoss,
    ObjectiveFunction,
    Params,
    batch_size_of,
    detached,
    named_shared,
)
from objreg.analysis.parallel.group import Group
from objreg.core.handles import Task
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


def as_dtype(value: Any, dtype: torch.dtype) -> Any:
    """``value`` (a batch of any nesting) with its floating tensors in ``dtype``."""
    from torch.utils._pytree import tree_map

    return tree_map(lambda t: t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point()
                    and t.dtype != dtype else t, value)


@dataclass
class Downstream:
    """The downstream evaluation set: ``D(θ)`` is the mean of the task's loss over its examples.

    With several processes (``group``) the chunks, the same as in one process, are dealt out
    round-robin (chunk ``j`` to process ``j mod world_size``: the length-sorted chunks alternate,
    so each process gets short and long rows alike); each evaluates its own, and the per-chunk
    sums are added up in chunk order, so ``D`` is the one-process value. A process beyond the
    number of chunks has no share of ``D``.

    Args:
        task: The downstream task.
        batch: Its evaluation examples.
        chunk_size: Examples per chunk (bounds memory; small chunks trim more padding).
        chunk_tokens: With it, a chunk also ends before its rows times its longest row would pass
            this many tokens: long rows go in smaller chunks, so less padding is computed, and
            short ones keep ``chunk_size`` rows (fewer chunks, less overhead). None: rows only.
        group: The processes sharing the work (default: this one alone).
        evaluation_dtype: The dtype :meth:`loss` evaluates ``D`` in (on a copy of the model
            when the model's differs); None: the model's own.
        shared: Names of the shared parameters (default: the backbone's).

    A set given as the user's own batches (:meth:`of_batches`) is used as it is: its batches are
    the chunks, neither sorted nor trimmed.
    """

    task: Task | CallableLoss
    batch: CorruptedBatch | None
    chunk_size: int = 16
    group: Group = field(default_factory=Group)
    evaluation_dtype: torch.dtype | None = torch.float64
    shared: tuple[str, ...] | None = None
    chunk_tokens: int | None = None
    chunks: list[Any] = field(init=False)
    compact: bool = field(init=False, default=True)
    _copy: tuple[nn.Module, nn.Module] | None = field(init=False, default=None, repr=False)

    def __post_init__(self) -> None:
        if self.batch is None:
            self.chunks = []
            return
        self.order = length_order(self.batch)
        self.chunks = [trimmed(self.batch.select(self.order[rows])) for rows in self._spans()]

    @classmethod
    def of_batches(cls, loss: CallableLoss, batches: Sequence[Any], **options: Any) -> Downstream:
        """``D`` as the mean of ``loss`` over the examples of ``batches`` (each one chunk)."""
        downstream = cls(loss, None, **options)
        downstream.chunks = list(batches)
        return downstream

    def _spans(self) -> list[slice]:
        if self.chunk_tokens is None:
            return [slice(s, s + self.chunk_size) for s in range(0, self.batch.batch_size, self.chunk_size)]
        lengths = (~self.batch.is_padding).sum(1)[self.order].tolist()
        spans, start, longest = [], 0, 0
        for row, length in enumerate(lengths):
            longest = max(longest, length)
            rows = row + 1 - start
            if rows > 1 and (rows > self.chunk_size or rows * longest > self.chunk_tokens):
                spans.append(slice(start, row))
                start, longest = row, length
        return [*spans, slice(start, len(lengths))] if lengths else spans

    @property
    def size(self) -> int:
        """Examples in the whole evaluation set (every process's)."""
        return self.batch.batch_size if self.batch is not None else sum(batch_size_of(c) for c in self.chunks)

    @property
    def tokens(self) -> int:
        """Token positions one evaluation of ``D`` computes (padding included)."""
        return sum(c.input_ids.numel() for c in self.chunks)

    @property
    def local_chunks(self) -> list[CorruptedBatch]:
        """This process's chunks (all of them in one process)."""
        return self.chunks[self.group.rank :: self.group.world_size]

    def check(self, model: nn.Module) -> bool:
        """Use the trimmed chunks only if they give the padded set's per-example losses (to
        rounding); returns whether they do (decided together by every process). Only the chunks
        that were trimmed are compared: one as wide as the padded set holds the padded set's own
        rows and columns (SQuAD's full windows), so there is nothing to compare there; where no
        chunk was trimmed at all, every process sees that alike and none evaluates anything."""
        width = self.batch.input_ids.shape[1] if self.batch is not None else None
        if width is not None and all(c.input_ids.shape[1] == width for c in self.chunks):
            self.compact = True
            return True
        local = list(zip(self._spans(), self.chunks))[self.group.rank :: self.group.world_size]
        cut = [(s, c) for s, c in local if c.input_ids.shape[1] < width]
        agrees = bool(local) and not cut  # this process's chunks are all untrimmed: nothing to compare
        if not agrees:
            agrees = self._trimmed_agree(model, [s for s, _ in cut], [c for _, c in cut])
        disagreeing = self.group.all_reduce_sum(torch.tensor(0.0 if agrees else 1.0))
        self.compact = float(disagreeing) == 0.0
        if not self.compact:
            self.order = torch.arange(self.batch.batch_size)
            self.chunks = [self.batch.select(rows) for rows in self._spans()]
        return self.compact

    def _trimmed_agree(self, model: nn.Module, spans: list[slice], chunks: list[Any]) -> bool:
        """Whether ``chunks`` give the per-example losses of their rows (``spans``) padded."""
        shared = detached(named_shared(model, self.shared))
        with torch.no_grad():
            rows = torch.cat([self.order[s] for s in spans]) if spans else self.order[:0]
            padded = ObjectiveFunction(model, self.task, self.batch.select(rows), shared=self.shared)(shared) \
                if spans else None
            try:
                compact = torch.cat([ObjectiveFunction(model, self.task, c, shared=self.shared)(shared)
                                     for c in chunks])
                tolerance = 1e-9 if compact.dtype == torch.float64 else 1e-4
                return padded is None or (compact.shape == padded.shape and bool(
                    torch.allclose(compact, padded, rtol=tolerance, atol=tolerance * float(padded.abs().max()))
                ))
            except (RuntimeError, IndexError, ValueError):
                return False

    def functions(self, model: nn.Module) -> list[ObjectiveFunction]:
        """This process's share of ``D`` as per-chunk functions of the shared parameters (all of
        ``D`` in one process; weight each chunk by its example count over :attr:`size`)."""
        return [ObjectiveFunction(model, self.task, chunk, shared=self.shared)
                for chunk in self.chunks_for(model, self.local_chunks)]

    def chunks_for(self, model: nn.Module, chunks: list[Any]) -> list[Any]:
        """``chunks`` as the model evaluating them takes them: on the copy :meth:`evaluation_model`
        made in another dtype, the user's floating inputs in that dtype too (float32 features
        for a float32 model become float64 for its float64 copy; the values are the same)."""
        if self._copy is None or model is not self._copy[1]:
            return chunks
        return [as_dtype(chunk, self.evaluation_dtype) for chunk in chunks]

    def curvature(self, model: nn.Module, shared: Params, method: str = "auto") -> Curvature:
        """Gradient and Hessian-vector products of ``D`` at ``shared``, summed over the processes."""
        return Curvature(self.functions(model), shared, method, total=self.size, group=self.group)

    def evaluation_model(self, model: nn.Module) -> nn.Module:
        """The model :meth:`loss` evaluates: ``model`` itself when it already has the evaluation
        dtype, else a copy in that dtype (made once) holding ``model``'s current parameters and
        buffers, in the same train/eval mode."""
        like = next(iter(model.parameters()), None)
        dtype = self.evaluation_dtype
        if dtype is None or like is None or like.dtype == dtype or not like.is_floating_point():
            return model
        if self._copy is None or self._copy[0] is not model:
            shadow = copy.deepcopy(model).to(dtype)
            for p in shadow.parameters():
                p.grad = None
                p.requires_grad_(False)
            self._copy = (model, shadow)
        shadow = self._copy[1]
        with torch.no_grad():
            for source, target in ((model.parameters(), shadow.parameters()), (model.buffers(), shadow.buffers())):
                for a, b in zip(source, target):
                    b.copy_(a)
        return shadow.train(model.training)

    def unit_roundoff(self, model: nn.Module) -> float:
        """Half the machine epsilon of the dtype :meth:`loss` evaluates ``D`` in."""
        like = next(iter(model.parameters()))
        dtype = like.dtype if self.evaluation_dtype is None or not like.is_floating_point() else self.evaluation_dtype
        return float(torch.finfo(dtype).eps) / 2

    @torch.no_grad()
    def loss(self, model: nn.Module) -> float:
        """``D`` at the model's current parameters, evaluated in :attr:`evaluation_dtype`."""
        model = self.evaluation_model(model)
        shared = detached(named_shared(model, self.shared))
        return self.mean([f(shared).sum() for f in self.functions(model)], model)

    def mean(self, sums: list[torch.Tensor], model: nn.Module) -> float:
        """The mean over every process's examples from this process's per-chunk sums, added in
        chunk order (the one-process additions, whatever the number of processes)."""
        if self.group.distributed:
            like = next(iter(model.parameters()))
            mine = torch.stack(sums) if sums else torch.zeros(0, dtype=like.dtype, device=like.device)
            every = self.group.all_gather([mine])[0]
            world, count = self.group.world_size, len(self.chunks)
            dealt = [j for rank in range(world) for j in range(rank, count, world)]  # the gather's chunk order
            sums = [None] * count
            for position, chunk in enumerate(dealt):
                sums[chunk] = every[position]
        total = sum(sums)
        return float(total) / self.size
