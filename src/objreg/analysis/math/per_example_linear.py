"""A linear layer whose backward forms its weight gradient from every example's own gradient,
so that per-example dots with fixed directions come out of the backward the step runs anyway.

Autograd computes a linear layer's weight gradient as one product ``Gᵀ X`` over all the batch's
positions. Split by example, ``Σ_i G_iᵀ X_i`` costs the same multiplications; each example's
``G_iᵀ X_i`` is then that example's weight gradient (scaled by the loop's ``∂L/∂ℓ_i``), and its dot
with a direction ``V`` costs one pass over the weight's size: a share of ``1/T`` of the product
for ``T`` positions per example. Computing the dot from the layer's output gradient instead
(``Σ_t g_tᵀ V x_t``, :mod:`~objreg.analysis.math.ghost`) needs a product as large as the
layer's forward, a third of what its training step multiplies.

The price: the weight's gradient is summed in another order than autograd's single product, so
it differs from an unmeasured step's by rounding (float32: about 1e-7 of its size), and a
trajectory run with it is no longer bit-identical to one run without. Examples are taken a few at
a time so that at most :data:`CHUNK_ELEMENTS` per-example gradient entries are held at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

#: At most this many per-example weight-gradient entries at once (64 MiB of float32): one
#: example at a time for an LM head over a large vocabulary, many for a small layer.
CHUNK_ELEMENTS = 2**24


class Slot:
    """One call's hand-over: the caller sets ``take(first_row, per_example_weight, per_example_bias)``
    before the backward to receive the call's per-example gradients chunk by chunk
    (``[c, *weight.shape]``; ``[c, out]``, or None without a bias); left None, the layer's backward
    is an ordinary one."""

    take: Callable[[int, torch.Tensor, torch.Tensor | None], None] | None = None


class PerExampleLinear(torch.autograd.Function):
    """``y = x Wᵀ + b`` (``nn.Linear``'s layout) or ``y = x W + b`` (``transposed``: the
    ``Conv1D`` layout of ``transformers``' GPT-2), batch first; its forward is the module's own."""

    # The forward takes ``ctx`` itself (no ``setup_context``): ``apply`` then skips binding the
    # arguments to the signature, which costs more than the layer's own product at small sizes.
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, transposed: bool,
                slot: Slot) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.transposed, ctx.slot, ctx.has_bias = transposed, slot, bias is not None
        if not transposed:
            return F.linear(x, weight, bias)
        out = torch.addmm(bias, x.view(-1, x.shape[-1]), weight) if bias is not None else x.view(-1, x.shape[-1]) @ weight
        return out.view(*x.shape[:-1], weight.shape[-1])

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, g: torch.Tensor) -> tuple:
        x, weight = ctx.saved_tensors
        wants_x, wants_w, wants_b = ctx.needs_input_grad[:3]
        grad_x = (g @ weight.T if ctx.transposed else g @ weight) if wants_x else None
        rows = g.shape[0]
        g3 = g.reshape(rows, -1, g.shape[-1])  # [B, T, out]
        x3 = x.reshape(rows, -1, x.shape[-1])  # [B, T, in]
        take = ctx.slot.take
        if take is None:  # not a measured pass: the ordinary gradients
            g2, x2 = g3.flatten(0, 1), x3.flatten(0, 1)
            grad_w = ((x2.T @ g2) if ctx.transposed else (g2.T @ x2)) if wants_w else None
            grad_b = g2.sum(0) if wants_b and ctx.has_bias else None
            return grad_x, grad_w, grad_b, None, None
        grad_w = None
        per_bias = g3.sum(1) if ctx.has_bias else None  # [B, out]
        step = max(1, CHUNK_ELEMENTS // weight.numel())
        for start in range(0, rows, step):
            gc, xc = g3[start: start + step], x3[start: start + step]
            # Formed for a frozen weight too: its dots are asked for all the same.
            per_weight = xc.transpose(1, 2) @ gc if ctx.transposed else gc.transpose(1, 2) @ xc
            if wants_w:
                grad_w = per_weight.sum(0) if grad_w is None else grad_w.add_(per_weight.sum(0))
            take(start, per_weight, per_bias[start: start + step] if per_bias is not None else None)
        grad_b = per_bias.sum(0) if wants_b and ctx.has_bias else None
        return grad_x, grad_w, grad_b, None, None


def per_example_forward(module: nn.Module, transposed: bool,
                        open_slot: Callable[[nn.Module, torch.Tensor], Slot | None]) -> Callable[..., Any]:
    """A replacement ``forward`` for ``module`` (an ``nn.Linear``, or a ``Conv1D`` when
    ``transposed``) running :class:`PerExampleLinear` with the slot ``open_slot(module, x)``
    gives; the module's own forward where it gives None."""

    def forward(*args: Any, **kwargs: Any) -> torch.Tensor:
        inputs = (*args, *kwargs.values())  # one input, by position or by name
        slot = open_slot(module, inputs[0]) if len(inputs) == 1 else None
        if slot is None:
            return type(module).forward(module, *args, **kwargs)
        return PerExampleLinear.apply(inputs[0], module.weight, module.bias, transposed, slot)

    return forward
