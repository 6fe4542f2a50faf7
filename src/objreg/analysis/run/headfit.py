"""The downstream head, fitted as a linear probe before training: ``D`` reads a head that
already knows the task, so its gradient says what the task needs of the backbone."""

from __future__ import annotations

import torch
from torch import nn

from objreg.analysis.math.gradients import local_rows
from objreg.analysis.parallel.group import Group
from objreg.core.handles import Task
from objreg.core.types import CorruptedBatch, ModelOutputs


def fit_downstream_head(
    model: nn.Module, task: Task, batch: CorruptedBatch, steps: int, lr: float = 1e-2, group: Group | None = None
) -> list[float]:
    """Fit the task's heads on ``batch`` with the backbone frozen (a linear probe), full batch.

    The backbone's hidden states are computed once, in eval mode (the probe is fitted on the
    features ``D`` is evaluated with); only head parameters change. Returns the loss before each
    step. With several processes (``group``) each encodes its contiguous share of the rows, and
    the head's gradient is summed over the processes at every step (a collective of the head's
    size): the one-process fit, to rounding, for a fraction of the backbone pass.
    """
    group = group if group is not None else Group()
    head_names = [spec.name for spec in task.info.heads]
    params = [p for name in head_names for p in model.heads[name].parameters()]
    if steps == 0 or not params or batch.batch_size == 0:
        return []
    total = batch.batch_size
    # Fewer rows than processes: every process fits on the whole batch.
    local, split = local_rows(group, task, batch) if total >= group.world_size else (batch, False)
    mask = task.attention_mask(local)
    training = model.training
    model.eval()
    with torch.no_grad():
        hidden = model.encode(local.input_ids, mask, local.position_ids)
    optimizer = torch.optim.Adam(params, lr=lr)
    history = []
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        loss = task.loss(ModelOutputs(hidden, model), local, mask).sum() / total
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        if split:
            loss, grads = group.all_reduce_sum((loss.detach(), list(grads)))
        for p, g in zip(params, grads):
            p.grad = g
        history.append(loss.item())
        optimizer.step()
    model.train(training)
    return history
