"""Attention-mask helpers. All return bool ``[B, T, T]`` with ``mask[b, i, j]`` True when query
position ``i`` may attend to key position ``j``. They are pure tensor functions (no ``.item()``,
no data-dependent Python branching), so objectives can call them inside ``objreg_attention_mask``
under ``torch.func`` transforms. Combine them with ``&``.

Padding keys are never attended to. A padding *query* row may end up with no allowed key; the
backbone must handle an all-False row without producing NaN (the reference backbone does).
"""

from __future__ import annotations

import torch


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
