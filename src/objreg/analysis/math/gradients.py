"""One objective's training gradient, computed on this process's share of the batch's rows.

Every process draws and corrupts the same whole batches, then computes only its contiguous share
of the rows (:meth:`Group.shard`). Its loss is the sum over its rows divided by the whole batch
size, so the gradients, summed over processes in one collective per objective, are those of the
whole batch, and every process takes the same optimizer step. A batch-coupled objective
(``ObjectiveInfo.batch_coupled``: in-batch negatives) cannot be split by rows: every process
computes it whole.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from objreg.analysis.math.functional import SHARED_PREFIX, Params
from objreg.analysis.parallel.group import Group
from objreg.core.errors import NonFiniteLossError
from objreg.core.handles import Objective, Task
from objreg.core.types import CorruptedBatch


def local_rows(group: Group, objective: Objective | Task, batch: CorruptedBatch) -> tuple[CorruptedBatch, bool]:
    """This process's rows of ``batch`` and whether they are a share of it: the whole batch in
    one process, or for a batch-coupled objective (its per-example losses need every row)."""
    if not group.distributed or objective.info.batch_coupled:
        return batch, False
    return batch.select(group.shard(batch.batch_size)), True


def mean_loss_gradient(
    model: nn.Module, objective: Objective, batch: CorruptedBatch, params: Sequence[nn.Parameter],
    group: Group | None = None,
) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
    """The whole batch's mean loss and its gradient with respect to ``params`` (None where a
    parameter is not used), the same on every process of ``group`` (default: this one alone)."""
    group = group if group is not None else Group()
    local, sharded = local_rows(group, objective, batch)
    # This process's share of the mean over the whole batch.
    loss = objective.losses(model, local, objective.attention_mask(local)).sum() / batch.batch_size
    grads = list(torch.autograd.grad(loss, list(params), allow_unused=True))
    if sharded:
        loss, grads = group.all_reduce_sum((loss.detach(), grads))
    return loss, grads


def check_finite(name: str, loss: torch.Tensor, step: int) -> None:
    """Stop on a diverged loss (every process reads the same summed loss, so all stop together)."""
    if not torch.isfinite(loss):
        raise NonFiniteLossError(
            f"objective {name!r} produced a non-finite loss ({loss.item()}) at step {step}; "
            f"try a smaller --lr or --dtype float64"
        )


def accumulate(params: Sequence[nn.Parameter], grads: Sequence[torch.Tensor | None], weight: float) -> None:
    """``p.grad += weight · g`` for every parameter an objective reached (what the optimizer steps on)."""
    for p, g in zip(params, grads):
        if g is not None:
            p.grad = weight * g if p.grad is None else p.grad + weight * g


def shared_part(trainable: Mapping[str, nn.Parameter], grads: Sequence[torch.Tensor | None]) -> Params:
    """The gradient on the shared (backbone) parameters, zeros where a parameter was not reached."""
    return {
        n: torch.zeros_like(p) if g is None else g
        for (n, p), g in zip(trainable.items(), grads) if n.startswith(SHARED_PREFIX)
    }
