"""The objectives' own gradients, as the probe takes them where the loop does not hand them over:
each objective's mean loss and its gradient on the shared parameters, over every process's rows
(:func:`objective_gradients`), and which of the default shared parameters some objective reaches
at all (:func:`reached`; the probe narrows its default set to those once, on the first batches).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from objreg.analysis.math.functional import ObjectiveFunction, Params, named_shared, requiring_grad
from objreg.analysis.parallel.group import Group
from objreg.analysis.probe.arguments import check_finite_losses, loss_label
from objreg.core.errors import InvalidParameterError


def objective_gradients(model: nn.Module, objectives: Mapping[str, Any], batches: Mapping[str, Any],
                        shared: Sequence[str], group: Group, step: int
                        ) -> tuple[dict[str, Params], dict[str, float]]:
    """Each objective's mean-loss gradient on the ``shared`` parameters and its mean loss, summed
    over the processes of ``group`` (``step``: for the messages).

    Raises:
        NonFiniteLossError: an objective's losses are not finite.
        InvalidParameterError: an objective does not depend on the shared parameters.
    """
    gradients, losses = {}, {}
    for name, objective in objectives.items():
        function = ObjectiveFunction(model, objective, batches[name], shared=shared)
        leaves = requiring_grad({n: p.detach() for n, p in named_shared(model, shared).items()})
        with torch.enable_grad():
            values = function(leaves)
            label = loss_label(name, objective)
            check_finite_losses(label, values, f"at step {step}")
            if not values.requires_grad:
                raise InvalidParameterError(f"{label} does not depend on the shared parameters (computed "
                                            f"under torch.no_grad(), or detached?): it has no gradient to "
                                            f"measure")
            total = values.sum()
            grads = torch.autograd.grad(total, list(leaves.values()), allow_unused=True)
        grads = [torch.zeros_like(t) if g is None else g for t, g in zip(leaves.values(), grads)]
        count = torch.tensor(float(function.batch_size), dtype=total.dtype, device=total.device)
        total, grads, count = group.all_reduce_sum((total.detach(), grads, count))
        gradients[name] = {n: g / count for n, g in zip(leaves, grads)}
        losses[name] = float(total / count)
    return gradients, losses


def reached(model: nn.Module, objectives: Mapping[str, Any], batches: Mapping[str, Any],
            shared: Sequence[str]) -> tuple[str, ...]:
    """The names of ``shared`` whose gradient some objective reaches on ``batches``, in order.

    Raises:
        InvalidParameterError: no objective reaches any of them.
    """
    found: set[str] = set()
    leaves = requiring_grad({n: p.detach() for n, p in named_shared(model, shared).items()})
    for name, objective in objectives.items():
        function = ObjectiveFunction(model, objective, batches[name], shared=shared)
        with torch.enable_grad():
            values = function(leaves)
            if not values.requires_grad:
                continue  # reaches none of them (and is refused as it is measured)
            grads = torch.autograd.grad(values.sum(), list(leaves.values()), allow_unused=True)
        found |= {n for n, g in zip(leaves, grads) if g is not None}
    names = tuple(n for n in shared if n in found)
    if not names:
        raise InvalidParameterError("no trainable parameter is reached by both the downstream loss and an objective")
    return names
