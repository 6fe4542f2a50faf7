"""Attention masks: the structured :class:`AttentionMask` objectives describe, and dense helpers.

``objreg_attention_mask`` returns either an :class:`AttentionMask` (padding, documents and one of
three patterns: bidirectional, causal, prefix) or a dense bool ``[B, T, T]`` tensor for any other
pattern. The structured form costs ``O(B·T)`` memory; its dense ``[B, T, T]`` form is built only
where a consumer needs one (:meth:`AttentionMask.dense`), and :meth:`AttentionMask.mask_mod` gives
the same mask as a FlexAttention ``mask_mod`` for block-sparse kernels.

The dense helpers return bool ``[B, T, T]`` with ``mask[b, i, j]`` True when query position ``i``
may attend to key position ``j``. They are pure tensor functions (no ``.item()``, no
data-dependent Python branching), safe under ``torch.func`` transforms. Combine them with ``&``.

Padding keys are never attended to. A padding *query* row may end up with no allowed key; the
backbone must handle an all-False row without producing NaN (the reference backbone does).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

#: The attention patterns an objective can declare (``ObjectiveInfo.attention``); anything else
#: is ``custom``: a dense mask the contract suite cannot check against a pattern.
PATTERNS = ("bidirectional", "causal", "prefix", "custom")
Pattern = Literal["bidirectional", "causal", "prefix", "custom"]


@dataclass(frozen=True)
class AttentionMask:
    """A mask described by its structure rather than as ``[B, T, T]``.

    Attributes:
        pattern: ``bidirectional``, ``causal``, or ``prefix`` (bidirectional over the first
            ``prefix_length[b]`` positions, causal after them).
        is_padding: ``[B, T]`` bool; padding keys are never attended to.
        document_ids: ``[B, T]`` long or None; tokens attend only within their own document
            (``-1`` at padding). None: one sequence per row.
        prefix_length: ``[B]`` long, for ``prefix`` only.
    """

    pattern: Literal["bidirectional", "causal", "prefix"]
    is_padding: torch.Tensor
    document_ids: torch.Tensor | None = None
    prefix_length: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.pattern not in ("bidirectional", "causal", "prefix"):
            raise ValueError(f"AttentionMask pattern must be bidirectional, causal or prefix, got {self.pattern!r}")
        if (self.pattern == "prefix") != (self.prefix_length is not None):
            raise ValueError("AttentionMask: prefix_length is given with the prefix pattern, and only with it")

    @classmethod
    def bidirectional(cls, is_padding: torch.Tensor, document_ids: torch.Tensor | None = None) -> AttentionMask:
        return cls("bidirectional", is_padding, document_ids)

    @classmethod
    def causal(cls, is_padding: torch.Tensor, document_ids: torch.Tensor | None = None) -> AttentionMask:
        return cls("causal", is_padding, document_ids)

    @classmethod
    def prefix(
        cls, is_padding: torch.Tensor, prefix_length: torch.Tensor, document_ids: torch.Tensor | None = None
    ) -> AttentionMask:
        return cls("prefix", is_padding, document_ids, prefix_length)

    @property
    def shape(self) -> tuple[int, int, int]:
        B, T = self.is_padding.shape
        return (B, T, T)

    def dense(self) -> torch.Tensor:
        """The bool ``[B, T, T]`` mask (pure; safe under transforms)."""
        if self.pattern == "bidirectional":
            mask = bidirectional(self.is_padding)
        elif self.pattern == "causal":
            mask = causal(self.is_padding)
        else:
            mask = prefix(self.is_padding, self.prefix_length)
        return mask if self.document_ids is None else mask & same_document(self.document_ids)

    def mask_mod(self) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
        """The mask as FlexAttention's ``mask_mod(b, h, q_idx, kv_idx) -> bool``."""
        padding, documents, length, pattern = self.is_padding, self.document_ids, self.prefix_length, self.pattern

        def mask_mod(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
            allowed = ~padding[b, kv]
            if documents is not None:
                allowed = allowed & (documents[b, q] == documents[b, kv]) & (documents[b, kv] >= 0)
            if pattern == "causal":
                allowed = allowed & (kv <= q)
            elif pattern == "prefix":
                allowed = allowed & ((kv <= q) | (kv < length[b]))
            return allowed

        return mask_mod

    def select(self, index: torch.Tensor | slice) -> AttentionMask:
        """The rows at ``index``."""
        return AttentionMask(
            self.pattern, self.is_padding[index],
            None if self.document_ids is None else self.document_ids[index],
            None if self.prefix_length is None else self.prefix_length[index],
        )


def padding_at_the_end(is_padding: torch.Tensor) -> bool:
    """Every row's padding is one block at its end (right padding): no real token after a padding
    one. In numpy on the CPU, whose ``any()`` stops at the first hit (torch's reads every flag)."""
    if is_padding.shape[1] < 2:
        return True
    flags = is_padding.numpy() if is_padding.device.type == "cpu" else is_padding
    return not bool((flags[:, :-1] > flags[:, 1:]).any())


def dense(mask: torch.Tensor | AttentionMask) -> torch.Tensor:
    """``mask`` as bool ``[B, T, T]``, whichever form it comes in."""
    return mask.dense() if isinstance(mask, AttentionMask) else mask


def _keys(is_padding: torch.Tensor) -> torch.Tensor:
    return ~is_padding[:, None, :]  # (B, 1, T)


def bidirectional(is_padding: torch.Tensor) -> torch.Tensor:
    """Every token sees every non-padding token. ``is_padding``: ``[B, T]`` bool."""
    B, T = is_padding.shape
    return _keys(is_padding).expand(B, T, T)


def causal(is_padding: torch.Tensor) -> torch.Tensor:
    """Token ``i`` sees tokens ``j <= i`` that are not padding."""
    T = is_padding.shape[1]
    lower = torch.ones(T, T, dtype=torch.bool, device=is_padding.device).tril()
    return lower[None] & _keys(is_padding)


def prefix(is_padding: torch.Tensor, prefix_length: torch.Tensor) -> torch.Tensor:
    """Prefix LM: positions ``< prefix_length[b]`` are seen by everyone (bidirectional prefix);
    the rest is causal. ``prefix_length``: ``[B]`` long."""
    T = is_padding.shape[1]
    positions = torch.arange(T, device=is_padding.device)
    in_prefix = positions[None, :] < prefix_length[:, None]  # (B, T) over keys
    return causal(is_padding) | (in_prefix[:, None, :] & _keys(is_padding))


def same_document(document_ids: torch.Tensor) -> torch.Tensor:
    """Block-diagonal: tokens attend only within their own document, so packed documents never
    see each other. ``document_ids``: ``[B, T]`` long, ``-1`` at padding (never attended)."""
    same = document_ids[:, :, None] == document_ids[:, None, :]
    return same & (document_ids >= 0)[:, None, :]


def positions_within_documents(document_ids: torch.Tensor) -> torch.Tensor:
    """Position ids that restart at 0 where a new document begins along the row.

    ``document_ids``: ``[B, T]``; returns ``[B, T]`` long. Padding continues the last count
    (its position is never used for attention).
    """
    B, T = document_ids.shape
    index = torch.arange(T, device=document_ids.device).expand(B, T)
    starts = torch.ones_like(document_ids, dtype=torch.bool)
    # Padding (-1) never starts a document, so its count continues.
    starts[:, 1:] = (document_ids[:, 1:] != document_ids[:, :-1]) & (document_ids[:, 1:] >= 0)
    start_index = torch.where(starts, index, torch.zeros_like(index))
    return index - torch.cummax(start_index, dim=1).values


def allowed_connections(mask: torch.Tensor) -> torch.Tensor:
    """Number of allowed (query, key) pairs per example, shape ``[B]``: a quick check that a
    mask is as dense as intended (a causal mask over n real tokens allows n(n+1)/2)."""
    return mask.sum(dim=(1, 2))
