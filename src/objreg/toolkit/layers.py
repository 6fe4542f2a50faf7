"""Transformer layers written with plain ops, so that ``torch.func`` can take per-sample
gradients (``vmap(grad)``), forward-mode products (``jvp``) and Hessian-vector products through
them: the default backbone's blocks, and any head that is a small Transformer of its own (rtd's
ELECTRA generator).

The attention mask is an argument of every forward pass (bool ``[B, T, T]``, True = query ``i``
may attend key ``j``), because each objective brings its own mask.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from objreg.core.errors import InvalidParameterError

ATTENTION_IMPLEMENTATIONS = ("math", "sdpa")


@dataclass(frozen=True)
class TransformerConfig:
    """Hyperparameters of a Transformer stack; the defaults are the ``default`` model."""

    vocab_size: int
    # Sized for the default `objreg analyze` on a CPU (docs/performance.md).
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    intermediate_size: int = 512  # 4 x hidden, as in BERT and GPT-2
    max_positions: int = 512  # BERT's limit; position ids must stay below it
    # 0: the analysis needs deterministic forward passes (the Taylor prediction is compared with
    # the loss change actually measured, and vmap/jvp need a pure function). Dropout > 0 draws from
    # torch's global RNG (F.dropout takes no generator), so use it for plain training only.
    dropout: float = 0.0
    layer_norm_eps: float = 1e-5
    # "math": plain ops, supports grad, vmap, jvp and double backward (what the analysis needs).
    # "sdpa": F.scaled_dot_product_attention, faster for plain training on GPU, no forward mode.
    attention: str = "math"

    def __post_init__(self) -> None:
        sizes = ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size", "max_positions")
        for name in sizes:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidParameterError(f"model config {name!r} must be a positive integer, got {value!r}")
        if self.hidden_size % self.num_heads != 0:
            raise InvalidParameterError(
                f"model config hidden_size={self.hidden_size} must be divisible by num_heads={self.num_heads}"
            )
        if not _is_real(self.dropout) or not 0.0 <= self.dropout < 1.0:
            raise InvalidParameterError(f"model config 'dropout' must lie in [0, 1), got {self.dropout!r}")
        if not _is_real(self.layer_norm_eps) or not self.layer_norm_eps > 0.0:
            raise InvalidParameterError(f"model config 'layer_norm_eps' must be positive, got {self.layer_norm_eps!r}")
        if self.attention not in ATTENTION_IMPLEMENTATIONS:
            allowed = ", ".join(ATTENTION_IMPLEMENTATIONS)
            raise InvalidParameterError(f"model config 'attention' must be one of {allowed}, got {self.attention!r}")


def _is_real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class AttentionBias(NamedTuple):
    """A bool ``[B, T, T]`` attention mask prepared once per forward pass and shared by every layer.

    Attributes:
        bias: ``(B, 1, T, T)`` in the model's dtype: 0 where query ``i`` may attend key ``j``,
            finfo.min where not. Added to the scores, it masks with one ``add`` (its derivatives
            are trivial in every mode); finfo.min rather than -inf gives a query row with no allowed
            key (a padding query) a uniform softmax instead of NaN (-inf everywhere is 0/0).
        has_key: ``(B, 1, T, 1)`` bool: the query may attend at least one key.
    """

    bias: torch.Tensor
    has_key: torch.Tensor


def attention_bias(mask: torch.Tensor, dtype: torch.dtype) -> AttentionBias:
    """The :class:`AttentionBias` of a bool ``[B, T, T]`` mask (pure: safe under vmap and jvp)."""
    mask = mask[:, None]  # (B, 1, T, T), the same for every head
    allowed = torch.zeros((), dtype=dtype, device=mask.device)
    masked = torch.full((), torch.finfo(dtype).min, dtype=dtype, device=mask.device)
    return AttentionBias(torch.where(mask, allowed, masked), mask.any(dim=-1, keepdim=True))


def math_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, dropout: float
) -> torch.Tensor:
    """Softmax attention from plain ops: differentiable by grad, vmap, jvp and double backward.

    q, k, v: ``(B, nh, T, hs)``; bias: additive, broadcastable to ``(B, nh, T, T)`` (see
    :class:`AttentionBias`). The scale goes on ``q`` (``T/hs`` times fewer elements than the scores).
    """
    scores = (q * (1.0 / math.sqrt(q.shape[-1]))) @ k.transpose(-2, -1) + bias  # (B, nh, T, T)
    probs = F.dropout(scores.softmax(dim=-1), p=dropout)  # (B, nh, T, T)
    return probs @ v  # (B, nh, T, hs)


def sdpa_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, dropout: float
) -> torch.Tensor:
    """The same attention through ``F.scaled_dot_product_attention`` (fused kernels where available).

    Faster for plain training on GPU, but the fused kernels (flash, memory-efficient, CPU flash)
    have no forward-mode derivative: ``jvp`` raises NotImplementedError (torch 2.13), and ``vmap``
    falls back to a slow per-example loop. The analysis still gets exact per-sample dots through
    them (ghost dot products need first derivatives only); HVPs need ``"math"``.
    """
    # The finite bias keeps a row with no allowed key NaN-free in every kernel (SelfAttention
    # zeroes its output anyway).
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout)  # (B, nh, T, hs)


class SelfAttention(nn.Module):
    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.num_heads = config.num_heads
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size)  # one fused projection
        self.out = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = config.dropout
        self.attend = math_attention if config.attention == "math" else sdpa_attention

    def forward(self, x: torch.Tensor, mask: torch.Tensor | AttentionBias) -> torch.Tensor:
        """``mask``: bool ``[B, T, T]``, or the :class:`AttentionBias` the backbone made of it once."""
        B, T, H = x.shape  # batch size, sequence length, hidden size
        if isinstance(mask, torch.Tensor):
            mask = attention_bias(mask, x.dtype)
        q, k, v = self.qkv(x).split(H, dim=-1)  # (B, T, H) each
        q = q.reshape(B, T, self.num_heads, H // self.num_heads).transpose(1, 2)  # (B, nh, T, hs)
        k = k.reshape(B, T, self.num_heads, H // self.num_heads).transpose(1, 2)  # (B, nh, T, hs)
        v = v.reshape(B, T, self.num_heads, H // self.num_heads).transpose(1, 2)  # (B, nh, T, hs)
        dropout = self.dropout if self.training else 0.0
        y = self.attend(q, k, v, mask.bias, dropout)  # (B, nh, T, hs)
        # A query with no allowed key (a padding query) attends to nothing: its output is zero,
        # the same in both paths whatever the softmax made of its row.
        y = torch.where(mask.has_key, y, 0.0)
        y = y.transpose(1, 2).reshape(B, T, H)  # (B, T, H)
        return F.dropout(self.out(y), p=dropout)


class MLP(nn.Module):
    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.up = nn.Linear(config.hidden_size, config.intermediate_size)
        self.down = nn.Linear(config.intermediate_size, config.hidden_size)
        self.dropout = config.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.gelu(self.up(x))  # (B, T, I); exact erf GELU, as in BERT
        return F.dropout(self.down(x), p=self.dropout if self.training else 0.0)  # (B, T, H)


class Block(nn.Module):
    """Pre-LN block (GPT-2 style): normalising before each sublayer keeps training stable
    without a learning-rate warm-up, which matters for a run of a few dozen steps."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.norm1 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.attention = SelfAttention(config)
        self.norm2 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | AttentionBias) -> torch.Tensor:
        x = x + self.attention(self.norm1(x), mask)  # (B, T, H)
        return x + self.mlp(self.norm2(x))  # (B, T, H)


def check_inputs(
    input_ids: torch.Tensor, mask: torch.Tensor, position_ids: torch.Tensor, max_positions: int
) -> None:
    # Shape and dtype checks only: they are static, so they are safe under vmap, grad and jvp.
    B, T = input_ids.shape
    if mask.dtype != torch.bool or tuple(mask.shape) != (B, T, T):
        raise InvalidParameterError(
            f"attention_mask must be bool [B, T, T] = [{B}, {T}, {T}], got {mask.dtype} {tuple(mask.shape)}"
        )
    if tuple(position_ids.shape) != (B, T):
        raise InvalidParameterError(f"position_ids must have shape [{B}, {T}], got {tuple(position_ids.shape)}")
    if T > max_positions:
        raise InvalidParameterError(f"sequence length {T} exceeds the model's max_positions={max_positions}")


