"""The closed-form rules of ghost dot products (:mod:`objreg.analysis.math.ghost`): a module's
per-example ``Σ_t ⟨g_{i,t}, (∂y/∂θ_m · v_m)_{i,t}⟩`` from its input and output gradient alone, for
``nn.Linear`` (and ``transformers``' ``Conv1D``, its weight transposed), ``nn.Embedding`` and
``nn.LayerNorm``; the inner product of two uses' gradients of one parameter (ghost norms); and a
linear layer's dot over only the positions whose output gradient is not zero (riding dots).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from objreg.analysis.math.functional import Params


def batched_dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``[B]``: ``⟨a_i, b_i⟩`` over every dimension but the first (``vecdot``: no ``a * b`` temporary)."""
    return torch.linalg.vecdot(a.flatten(1), b.flatten(1))


def per_example_sum(g: torch.Tensor, trailing: int) -> torch.Tensor:
    """``g`` summed over every dimension between the batch and the last ``trailing`` ones."""
    return g.reshape(g.shape[0], -1, *g.shape[g.dim() - trailing :]).sum(1)


def linear_dot(module: nn.Linear, x: torch.Tensor, g: torch.Tensor, d: dict[str, torch.Tensor]) -> torch.Tensor:
    """``Σ_t g_tᵀ (V x_t + b_V)``, with the matmul on whichever side gives the smaller product."""
    V, b = d.get("weight"), d.get("bias")
    if V is None:
        return per_example_sum(g, 1) @ b
    if V.shape[0] <= V.shape[1]:
        return batched_dot(F.linear(x, V, b), g)  # (B, ..., out): V x + b
    dots = batched_dot(g @ V, x)  # (B, ..., in): Vᵀ g
    return dots if b is None else dots + per_example_sum(g, 1) @ b


def embedding_dot(
    module: nn.Embedding, ids: torch.Tensor, g: torch.Tensor, d: dict[str, torch.Tensor]
) -> torch.Tensor:
    tangent = F.embedding(ids, d["weight"])  # (B, ..., H): the rows of V the example looked up
    if module.padding_idx is not None:  # that row gets no gradient
        tangent = tangent.masked_fill((ids == module.padding_idx).unsqueeze(-1), 0.0)
    return batched_dot(tangent, g)


def layer_norm_dot(module: nn.LayerNorm, x: torch.Tensor, g: torch.Tensor, d: dict[str, torch.Tensor]) -> torch.Tensor:
    """``Σ_t g_t · (x̂_t ⊙ V_γ + V_β)``; x̂ is recomputed here rather than kept from the forward."""
    weight, bias = d.get("weight"), d.get("bias")
    if weight is None:
        return per_example_sum(g, len(module.normalized_shape)).flatten(1) @ bias.flatten()
    normalised = F.layer_norm(x, module.normalized_shape, None, None, module.eps)
    tangent = normalised * weight if bias is None else torch.addcmul(bias, normalised, weight)
    return batched_dot(tangent, g)


def is_conv1d(module: nn.Module) -> bool:
    """``transformers``' ``Conv1D`` (GPT-2's projections): ``x W + b`` with ``W`` stored ``[in, out]``,
    told by its name so this module never imports ``transformers``."""
    weight = getattr(module, "weight", None)
    return type(module).__name__ == "Conv1D" and hasattr(module, "nf") and weight is not None and weight.dim() == 2


def plain_embedding(module: nn.Module) -> bool:
    """An exact ``nn.Embedding`` whose gradient is plain row look-up (no renormalisation or scaling)."""
    return type(module) is nn.Embedding and module.max_norm is None and not module.scale_grad_by_freq


def use_inner(a: tuple, b: tuple) -> torch.Tensor | None:
    """``[B]``: the per-example inner product of two uses' gradients of one parameter (see
    :attr:`GhostDots.uses`); None for a dense use against a factored one."""
    if a[0] == "dense" and b[0] == "dense":
        return batched_dot(a[1], b[1])
    if "dense" in (a[0], b[0]):
        return None
    right = torch.bmm(a[2], b[2].transpose(1, 2))  # (B, N_a, N_b): r_t · r_s
    if a[0] == "factored" and b[0] == "factored":
        left = torch.bmm(a[1], b[1].transpose(1, 2))  # l_t · l_s
    elif a[0] == "ids" and b[0] == "ids":
        left = (a[1].unsqueeze(2) == b[1].unsqueeze(1)).to(right.dtype)  # the same row of the table
    else:  # a dense left vector against a one-hot one: the dense vector's entry at the id
        dense, ids = (a, b) if a[0] == "factored" else (b, a)
        left = torch.gather(dense[1], 2, ids[1].unsqueeze(1).expand(-1, dense[1].shape[1], -1))
        if dense is b:
            left = left.transpose(1, 2)
    return (left * right).sum((1, 2))


def live_rows_dot(x: torch.Tensor, g: torch.Tensor, d: Params) -> torch.Tensor | None:
    """``Σ_t g_tᵀ (V x_t + b_V)`` over the positions whose output gradient is not zero (``V`` in
    ``nn.Linear``'s ``[out, in]`` layout); None where most positions are live (the dense rule is
    then cheaper)."""
    V, b = d.get("weight"), d.get("bias")
    rows = g.shape[0]
    grad = g.reshape(rows, -1, g.shape[-1])
    live = (grad.amax(-1) != 0) | (grad.amin(-1) != 0)  # [B, N]; no [B, N, out] temporary, as ne(0).any() makes
    count = int(live.sum())
    if V is None or 2 * count > live.numel():
        return None
    example, position = live.nonzero(as_tuple=True)
    picked = grad[example, position]  # [L, out]
    inputs = x.reshape(rows, -1, x.shape[-1])[example, position]  # [L, in]
    per_position = torch.linalg.vecdot(picked @ V, inputs)
    if b is not None:
        per_position = per_position + picked @ b
    return torch.zeros(rows, dtype=per_position.dtype, device=per_position.device).index_add_(
        0, example, per_position)
