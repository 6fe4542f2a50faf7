"""Transformer layers written with plain ops, so that ``torch.func`` can take per-sample
gradients (``vmap(grad)``), forward-mode products (``jvp``) and Hessian-vector products through
them: the default backbone's blocks, and any head that is a small Transformer of its own (rtd's
ELECTRA generator).

The attention mask is an argument of every forward pass, because each objective brings its own
mask, in one of two forms:

* a bool ``[B, T, T]`` tensor (True = query ``i`` may attend key ``j``): the dense path, an
  additive bias built once per pass (:func:`attention_bias`) and the ``math`` (or ``sdpa``)
  attention. Every derivative works through it; the analysis passes dense masks.
* an :class:`objreg.AttentionMask` (the structure: pattern, padding, documents): the structured
  path (:class:`StructuredAttention`), which never builds anything ``[T, T]``: fused
  ``scaled_dot_product_attention`` with a key-padding bias or ``is_causal``, two fused calls for a
  prefix LM, and query blocks for packed documents. Memory grows like ``T``, not ``T²``, which is
  what long training rows need. Fused kernels have no forward-mode derivative, so under a
  ``torch.func`` transform or forward-mode AD the structured mask is densified and the dense path
  runs instead (:func:`prepare_attention`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from objreg.core.errors import InvalidParameterError
from objreg.core.masks import AttentionMask, padding_at_the_end

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


#: Queries per block of the blocked structured path (packed documents, padding inside a row):
#: each block builds a ``[B, 1, block, T]`` bias and recomputes it in the backward pass.
QUERY_BLOCK = 512


class StructuredAttention:
    """Attention for an :class:`objreg.AttentionMask` without a ``[B, T, T]`` mask, prepared once
    per forward pass and shared by every layer (``O(B·T)`` memory).

    Rows of one document each, padded at the end (what objreg's batches are):

    * ``bidirectional``: fused attention with an additive key-padding bias ``[B, 1, 1, T]``;
    * ``causal``: fused attention with ``is_causal`` (a real query never reaches the padding
      keys after it);
    * ``prefix``: the causal call for every query, and a second fused call restricted to the
      first ``max(prefix_length)`` queries and keys, with the keys beyond each row's prefix masked,
      for the queries inside the prefix.

    Anything else (packed documents, padding inside a row) runs in blocks of :data:`QUERY_BLOCK`
    queries, each with its own ``[B, 1, block, keys]`` bias, under activation checkpointing so
    that the backward pass rebuilds each block's bias instead of keeping them all.

    Every real query gets exactly what the dense mask gives it; padding queries get zero output
    (the dense path lets them attend like their row's tokens; no loss reads them).

    Attributes:
        mask: The structured mask.
        kind: ``keys``, ``causal``, ``prefix`` or ``blocks``: which of the paths above runs.
    """

    def __init__(self, mask: AttentionMask, dtype: torch.dtype):
        self.mask = mask
        self.dtype = dtype
        padding = mask.is_padding
        B, T = padding.shape
        self.query_padding = padding[:, None, :, None]  # (B, 1, T, 1)
        single = _one_document_per_row(mask)
        suffix = single and mask.pattern != "bidirectional" and padding_at_the_end(padding)
        if single and mask.pattern == "bidirectional":
            self.kind = "keys"
            self.key_bias = padding.to(dtype).mul_(torch.finfo(dtype).min)[:, None, None, :]  # (B, 1, 1, T)
        elif single and suffix and mask.pattern == "causal":
            self.kind = "causal"
        elif single and suffix and mask.pattern == "prefix":
            self.kind = "prefix"
            self.prefix = min(int(mask.prefix_length.max()), T) if B else 0
            j = torch.arange(self.prefix, device=padding.device)
            inside = j[None, :] < mask.prefix_length[:, None]  # (B, P): the positions of each row's prefix
            self.key_bias = _additive(inside & ~padding[:, : self.prefix], dtype)[:, None, None, :]  # (B, 1, 1, P)
            self.in_prefix = inside[:, None, :, None]  # (B, 1, P, 1): queries inside the prefix
        else:
            self.kind = "blocks"

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout: float) -> torch.Tensor:
        """``q, k, v``: ``(B, nh, T, hs)``; returns ``(B, nh, T, hs)``."""
        if self.kind == "keys":
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=self.key_bias, dropout_p=dropout)
        elif self.kind == "causal":
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
        elif self.kind == "prefix":
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
            P = self.prefix
            if P > 0:
                inside = F.scaled_dot_product_attention(
                    q[:, :, :P], k[:, :, :P], v[:, :, :P], attn_mask=self.key_bias, dropout_p=dropout
                )
                y = torch.cat([torch.where(self.in_prefix, inside, y[:, :, :P]), y[:, :, P:]], dim=2)
        else:
            y = self._blocks(q, k, v, dropout)
        return torch.where(self.query_padding, 0.0, y)

    def _blocks(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout: float) -> torch.Tensor:
        T = q.shape[2]
        outputs = []
        for start in range(0, T, QUERY_BLOCK):
            end = min(T, start + QUERY_BLOCK)
            keys = end if self.mask.pattern == "causal" else T  # a causal block sees no later key
            args = (q[:, :, start:end], k[:, :, :keys], v[:, :, :keys])
            if torch.is_grad_enabled() and any(t.requires_grad for t in args):
                out = checkpoint(self._block, *args, start, dropout, use_reentrant=False)
            else:
                out = self._block(*args, start, dropout)
            outputs.append(out)
        return torch.cat(outputs, dim=2)

    def _block(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, dropout: float) -> torch.Tensor:
        """Queries ``start ...`` of the block against the first ``k.shape[2]`` keys."""
        allowed = block_mask(self.mask, start, start + q.shape[2], k.shape[2])  # (B, Q, K)
        bias = _additive(allowed, q.dtype)[:, None]  # (B, 1, Q, K)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout)
        return torch.where(allowed.any(dim=-1)[:, None, :, None], y, 0.0)  # a query with no key: zero


def block_mask(mask: AttentionMask, start: int, end: int, keys: int) -> torch.Tensor:
    """Rows ``start:end`` (queries) and columns ``:keys`` of ``mask.dense()``, bool
    ``[B, end - start, keys]``, built from the structure alone."""
    device = mask.is_padding.device
    q = torch.arange(start, end, device=device)[None, :, None]  # (1, Q, 1)
    kv = torch.arange(keys, device=device)[None, None, :]  # (1, 1, K)
    allowed = ~mask.is_padding[:, None, :keys]  # (B, 1, K)
    if mask.pattern == "causal":
        allowed = allowed & (kv <= q)
    elif mask.pattern == "prefix":
        allowed = allowed & ((kv <= q) | (kv < mask.prefix_length[:, None, None]))
    if mask.document_ids is not None:
        documents = mask.document_ids
        allowed = allowed & (documents[:, start:end, None] == documents[:, None, :keys]) & (documents[:, None, :keys] >= 0)
    return allowed.expand(-1, end - start, -1)


def _one_document_per_row(mask: AttentionMask) -> bool:
    """No row holds two documents among its real tokens (so documents only add what padding
    already excludes), and none of them has a negative document (never attended). Rows that start
    with padding fail the test unless they are all padding; they take the blocked path."""
    documents = mask.document_ids
    if documents is None or documents.numel() == 0:
        return True
    first = documents[:, :1]  # (B, 1)
    if not bool(((first >= 0) | mask.is_padding[:, :1]).all()):
        return False
    return bool(documents.ne(first).le_(mask.is_padding).all())  # another document only at padding


def _additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """0 where allowed, the dtype's most negative finite value where not (as :func:`attention_bias`)."""
    zero = torch.zeros((), dtype=dtype, device=allowed.device)
    floor = torch.full((), torch.finfo(dtype).min, dtype=dtype, device=allowed.device)
    return torch.where(allowed, zero, floor)


def transforms_active() -> bool:
    """Whether a ``torch.func`` transform (vmap, grad, jvp, ...) or forward-mode AD is running:
    fused attention kernels have no forward-mode derivative, so the dense path must run."""
    functorch = getattr(torch._C, "_are_functorch_transforms_active", None)
    if functorch is not None and functorch():
        return True
    return getattr(torch.autograd.forward_ad, "_current_level", -1) >= 0


def prepare_attention(
    mask: torch.Tensor | AttentionMask, dtype: torch.dtype
) -> AttentionBias | StructuredAttention:
    """What a Transformer's layers share for one forward pass: a :class:`StructuredAttention`
    for a structured mask (unless a transform or forward-mode AD is running: then, and for a
    dense mask, the :class:`AttentionBias` of the dense mask)."""
    if isinstance(mask, AttentionMask):
        if not transforms_active():
            return StructuredAttention(mask, dtype)
        mask = mask.dense()
    return attention_bias(mask, dtype)


class SelfAttention(nn.Module):
    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.num_heads = config.num_heads
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size)  # one fused projection
        self.out = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = config.dropout
        self.attend = math_attention if config.attention == "math" else sdpa_attention

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | AttentionMask | AttentionBias | StructuredAttention
    ) -> torch.Tensor:
        """``mask``: bool ``[B, T, T]`` or an :class:`objreg.AttentionMask`, or what
        :func:`prepare_attention` made of either once for the whole stack."""
        B, T, H = x.shape  # batch size, sequence length, hidden size
        if isinstance(mask, (torch.Tensor, AttentionMask)):
            mask = prepare_attention(mask, x.dtype)
        q, k, v = self.qkv(x).split(H, dim=-1)  # (B, T, H) each
        q = q.reshape(B, T, self.num_heads, H // self.num_heads).transpose(1, 2)  # (B, nh, T, hs)
        k = k.reshape(B, T, self.num_heads, H // self.num_heads).transpose(1, 2)  # (B, nh, T, hs)
        v = v.reshape(B, T, self.num_heads, H // self.num_heads).transpose(1, 2)  # (B, nh, T, hs)
        dropout = self.dropout if self.training else 0.0
        if isinstance(mask, StructuredAttention):
            y = mask(q, k, v, dropout)  # (B, nh, T, hs); padding queries zero
        else:
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

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | AttentionMask | AttentionBias | StructuredAttention
    ) -> torch.Tensor:
        x = x + self.attention(self.norm1(x), mask)  # (B, T, H)
        return x + self.mlp(self.norm2(x))  # (B, T, H)


def check_inputs(
    input_ids: torch.Tensor, mask: torch.Tensor | AttentionMask, position_ids: torch.Tensor, max_positions: int
) -> None:
    # Shape and dtype checks only: they are static, so they are safe under vmap, grad and jvp.
    B, T = input_ids.shape
    if isinstance(mask, AttentionMask):
        if tuple(mask.shape) != (B, T, T):
            raise InvalidParameterError(
                f"attention_mask must describe [B, T, T] = [{B}, {T}, {T}], got an AttentionMask of {mask.shape}"
            )
    elif mask.dtype != torch.bool or tuple(mask.shape) != (B, T, T):
        raise InvalidParameterError(
            f"attention_mask must be bool [B, T, T] = [{B}, {T}, {T}], got {mask.dtype} {tuple(mask.shape)}"
        )
    if tuple(position_ids.shape) != (B, T):
        raise InvalidParameterError(f"position_ids must have shape [{B}, {T}], got {tuple(position_ids.shape)}")
    if T > max_positions:
        raise InvalidParameterError(f"sequence length {T} exceeds the model's max_positions={max_positions}")


