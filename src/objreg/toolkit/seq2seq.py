"""The ``[source ; target]`` layout of encoder-decoder objectives on one shared stack.

An encoder-decoder objective runs on the shared backbone as a prefix LM over ``source ; target``
(:func:`seq2seq_batch`): the source (corrupted input) is attended to bidirectionally, the target
causally, as UL2 and seqio's ``PrefixLMFeatureConverter`` do for decoder-only models. Position
``t`` predicts token ``t + 1``; the labelled positions run from the last source token (which
predicts the first target token, seqio's "inputs + 1" bidirectional region) to the second-to-last
target token. Position ids continue from the source into the target, as in a decoder-only
sequence. The row becomes ``len(source) + len(target)`` tokens wide.

Sources and targets are :data:`Parts`: compact, left-aligned, right-padded token rows and their
lengths, built by :func:`span_corruption_parts` (T5's ``span_corruption``: noise spans to
sentinels) and :func:`prefix_lm_parts` (T5's ``prefix_lm``: a random split); ``ul2`` picks one of
them per row (:func:`choose_parts`) and puts its mode token in front (:func:`prepend_tokens`);
``bart`` compacts its own noised rows (:func:`compact`). The special ids a layout needs (sentinels,
``[EOS]``, named markers) come from the vocabulary (:func:`sentinel_tensor`,
:func:`end_of_text_id`, :func:`named_id`), with a :class:`DataError` naming the objective when one
is missing.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from objreg.core import masks
from objreg.core.errors import DataError
from objreg.core.types import IGNORE_INDEX, CorruptedBatch, ModelOutputs, TokenBatch, Vocabulary
from objreg.toolkit.losses import gather_positions, smoothed_nll, weighted_mean
from objreg.toolkit.selection import maskable
from objreg.toolkit.spans import (
    count_spans,
    random_prefix_length,
    random_spans,
    random_spans_noise_mask,
    span_starts,
    spans_mask,
)

#: (source, source lengths, target, target lengths): compact, left-aligned, right-padded token rows.
Parts = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def named_id(vocab: Vocabulary, token: str, objective: str) -> int:
    """The id of the named special token ``token`` (e.g. ``"[NLU]"``), or a :class:`DataError`."""
    if token not in vocab.named_ids:
        have = ", ".join(sorted(vocab.named_ids)) or "none"
        raise DataError(f"{objective} needs the special token {token} in the vocabulary's named_ids (it has: {have})")
    return vocab.named_ids[token]


def require_tokens(vocab: Vocabulary | None, tokens: tuple[str, ...], sentinels: bool, objective: str) -> None:
    """Before any model is loaded (``objreg_check_params``): a :class:`DataError` with the fix in
    one line when ``vocab`` lacks one of the named ``tokens`` or, with ``sentinels``, span
    sentinels. Nothing to check without a vocabulary (None)."""
    if vocab is None:
        return
    missing = [t for t in tokens if t not in vocab.named_ids]
    if sentinels and not vocab.sentinel_ids:
        missing.append("span sentinels (<extra_id_0>, <extra_id_1>, ...)")
    if missing:
        added = [t for t in tokens if t not in vocab.named_ids]
        if sentinels and not vocab.sentinel_ids:
            added += ["<extra_id_0>", "<extra_id_1>", "..."]
        raise DataError(
            f"{objective} needs {', '.join(missing)}, which the tokenizer lacks; add them "
            f"(tokenizer.add_tokens({added!r}, special_tokens=True)), resize the model "
            f"(model.resize_token_embeddings(len(tokenizer))) and save both to the model directory"
        )


def end_of_text_id(vocab: Vocabulary) -> int:
    """``[EOS]`` where the vocabulary names one, else ``[SEP]`` (BERT-style vocabularies end text with it)."""
    return vocab.named_ids.get("[EOS]", vocab.sep_id)


def sentinel_tensor(vocab: Vocabulary, needed: int, objective: str, device: torch.device) -> torch.Tensor:
    """``vocab.sentinel_ids`` as a long tensor, or a :class:`DataError` when there are fewer than
    ``needed`` (one per corrupted span of the longest row)."""
    have = len(vocab.sentinel_ids)
    if needed > have:
        raise DataError(
            f"{objective} needs {needed} span sentinels for this batch but the vocabulary has {have}; "
            f"use shorter rows (--seq-len), a lower noise density or longer spans"
        )
    return torch.tensor(vocab.sentinel_ids or (0,), dtype=torch.long, device=device)


def cycled_sentinels(vocab: Vocabulary, needed: int, objective: str, device: torch.device) -> torch.Tensor:
    """``vocab.sentinel_ids`` as a long tensor for rows of up to ``needed`` spans, reused in turn
    when a row has more spans than the vocabulary has sentinels (:func:`span_sentinels`); a
    :class:`DataError` only when spans need a sentinel and the vocabulary has none."""
    if needed > 0 and not vocab.sentinel_ids:
        raise DataError(f"{objective} needs span sentinels but the vocabulary declares none (sentinel_ids)")
    return torch.tensor(vocab.sentinel_ids or (0,), dtype=torch.long, device=device)


def span_sentinels(span: torch.Tensor, sentinels: torch.Tensor) -> torch.Tensor:
    """The sentinel id of span ``span`` (0-based, along the row; any shape): span ``k`` gets
    ``sentinels[k mod S]``. Rows of at most ``S`` spans get one sentinel each, first span first
    (T5); a longer row restarts the sentinels every ``S`` spans, a segment of ``S`` spans at a
    time. The source and the target list the spans in the same order, so the ``k``-th sentinel of
    the source still pairs with the ``k``-th of the target. Negative ``span`` gives the first."""
    have = max(sentinels.shape[0], 1)
    index = span.clamp(0, have - 1) if int(span.max()) < have else torch.remainder(span.clamp(min=0), have)
    return sentinels.index_select(0, index.flatten()).view(span.shape)


def compact(tokens: torch.Tensor, keep: torch.Tensor, fill: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The kept tokens of each row moved to the left, in order, right-filled with ``fill``.

    ``tokens``, ``keep``: ``[B, N]``. Returns ``([B, W], [B])``: rows and their lengths,
    ``W = max(1, longest row)``.
    """
    B, N = tokens.shape
    lengths = keep.sum(dim=1)
    W = max(int(lengths.max()) if B else 0, 1)
    index = torch.where(keep, keep.long().cumsum(dim=1) - 1, N)  # dropped tokens go to a spare column
    out = torch.full((B, max(N, W) + 1), fill, dtype=tokens.dtype, device=tokens.device)
    out.scatter_(1, index, tokens)
    return out[:, :W], lengths


def gather_rows(rows: torch.Tensor, lengths: torch.Tensor, index: torch.Tensor, fill: int) -> torch.Tensor:
    """``rows[b, index[b, j]]`` where ``0 <= index < lengths[b]``, else ``fill``."""
    inside = (index >= 0) & (index < lengths[:, None])
    picked = rows.gather(1, index.clamp(0, rows.shape[1] - 1))
    return torch.where(inside, picked, fill)


def append_token(rows: torch.Tensor, lengths: torch.Tensor, token: int, fill: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``token`` appended after each row's last token (rows get one column wider)."""
    wider = torch.nn.functional.pad(rows, (0, 1), value=fill)
    wider = wider.scatter(1, lengths[:, None], torch.full_like(lengths[:, None], token))
    return wider, lengths + 1


def prepend_tokens(
    rows: torch.Tensor, lengths: torch.Tensor, tokens: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``tokens`` (``[B]``) put in front of each row."""
    return torch.cat([tokens[:, None], rows], dim=1), lengths + 1


def sentinel_parts(
    ids: torch.Tensor, real: torch.Tensor, noise: torch.Tensor, sentinels: torch.Tensor, eos_id: int, pad_id: int
) -> Parts:
    """T5's ``noise_span_to_unique_sentinel`` / ``nonnoise_span_to_unique_sentinel``, token by token.

    Source: the real tokens with each noise span replaced by one sentinel. Target: for each span,
    its sentinel followed by its tokens, then ``eos_id``. Span ``k`` (counted along the row) gets
    ``sentinels[k]`` in both, so the first span gets the first sentinel; a row with more spans than
    ``sentinels`` reuses them in turn (:func:`span_sentinels`).

    Each token is scattered once, from prefix counts along the row: source token ``t`` (kept, or
    the sentinel of a span starting at ``t``) to ``n_keep[t] - 1``; in the target, the sentinel of
    a span starting at ``t`` to ``n_start[t] + n_noise[t] - 2`` and noise token ``t`` to
    ``n_start[t] + n_noise[t] - 1`` (inclusive counts), ``eos`` last.
    """
    B, T = ids.shape
    starts = span_starts(noise)  # (B, T)
    n_start = starts.cumsum(dim=1)  # (B, T)
    sentinel = span_sentinels(n_start - 1, sentinels)  # (B, T)
    keep = real & (~noise | starts)  # (B, T): kept tokens, and one sentinel per span
    n_keep = keep.cumsum(dim=1)  # (B, T)
    at = noise.cumsum(dim=1).add_(n_start)  # (B, T): n_start + n_noise
    source_len = n_keep[:, -1].clone() if T else n_keep.sum(dim=1)  # (B,)
    target_len = (at[:, -1] if T else at.sum(dim=1)) + 1  # (B,): with eos
    Ws = max(int(source_len.max()) if B else 0, 1)
    Wt = max(int(target_len.max()) - 1 if B else 0, 1) + 1  # the longest target, and eos
    # Column 0 of each output takes the tokens that go nowhere: the index is (column + 1) * mask.
    source = torch.full((B, Ws + 1), pad_id, dtype=ids.dtype, device=ids.device)
    source.scatter_(1, n_keep.mul_(keep), sentinel.sub(ids).mul_(starts).add_(ids))  # sentinel at span starts
    target = torch.full((B, Wt + 1), pad_id, dtype=ids.dtype, device=ids.device)
    target.scatter_(1, at.sub(1).mul_(starts), sentinel)
    target.scatter_(1, at.mul_(noise), ids)
    target.scatter_(1, target_len[:, None], torch.full_like(target_len[:, None], eos_id))
    return source[:, 1:].contiguous(), source_len, target[:, 1:].contiguous(), target_len


def prefix_parts(ids: torch.Tensor, real: torch.Tensor, split: torch.Tensor, pad_id: int) -> Parts:
    """Source = the real tokens before position ``split[b]``, target = the real tokens from it on."""
    before = torch.arange(ids.shape[1], device=ids.device)[None, :] < split[:, None]
    source, source_len = compact(ids, real & before, pad_id)
    target, target_len = compact(ids, real & ~before, pad_id)
    return source, source_len, target, target_len


def span_corruption_parts(
    batch: TokenBatch,
    noise_density: float | torch.Tensor,
    mean_span_length: float | torch.Tensor,
    generator: torch.Generator,
    vocab: Vocabulary,
    objective: str,
) -> Parts:
    """T5's ``span_corruption``: T5 span noise over each row's ordinary tokens
    (:func:`objreg.toolkit.spans.random_spans_noise_mask`; density and mean span length floats or
    ``[B]``), then the sentinel format (:func:`sentinel_parts`), the target ending in
    :func:`end_of_text_id`. Rows with more spans than the vocabulary has sentinels reuse them in
    turn (:func:`span_sentinels`); a :class:`DataError` names ``objective`` when spans need a
    sentinel and the vocabulary has none."""
    noise = random_spans_noise_mask(maskable(batch), noise_density, mean_span_length, generator)  # (B, T)
    sentinels = cycled_sentinels(vocab, count_spans(noise), objective, noise.device)
    return sentinel_parts(batch.input_ids, ~batch.is_padding, noise, sentinels, end_of_text_id(vocab), vocab.pad_id)


def span_corruption_batch(
    batch: TokenBatch,
    noise_density: float | torch.Tensor,
    mean_span_length: float | torch.Tensor,
    generator: torch.Generator,
    vocab: Vocabulary,
    objective: str,
) -> CorruptedBatch:
    """``seq2seq_batch(span_corruption_parts(...), ...)``: the same tensors from the same draws.
    Where each row's real tokens come first and its candidates form one block (rows framed
    ``[CLS] text [SEP]``, right-padded) the rows are laid out from the spans alone
    (:func:`sentinel_rows`), with no ``[B, T]`` noise mask; a literal special token inside the
    text takes the token-by-token layout."""
    candidates = maskable(batch)
    start, end = random_spans(candidates.sum(dim=1), noise_density, mean_span_length, generator)  # (B, S)
    B = start.shape[0]
    sentinels = cycled_sentinels(vocab, int((end > start).sum(dim=1).max()) if B else 0, objective, start.device)
    eos_id, pad_id, document = end_of_text_id(vocab), vocab.pad_id, row_document(batch)
    first = block_start(batch.is_padding, candidates)
    if first is None:
        noise = spans_mask(candidates, start, end)
        parts = sentinel_parts(batch.input_ids, ~batch.is_padding, noise, sentinels, eos_id, pad_id)
        return seq2seq_batch(parts, document, pad_id)
    length = batch.is_padding.shape[1] - batch.is_padding.sum(dim=1)  # (B,): real tokens
    rows, source_len, target_len = sentinel_rows(batch.input_ids, length, first, start, end, sentinels, eos_id)
    return seq2seq_rows(rows, source_len, target_len, document, pad_id)


def block_start(is_padding: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor | None:
    """``[B]`` long: the first candidate position of each row, when every row's real tokens come
    first and its candidates are one block of consecutive positions (so candidate rank ``r`` sits
    at position ``first + r``); None otherwise. 0 for a row without candidates."""
    if candidates.shape[0] == 0 or candidates.shape[1] == 0 or not masks.padding_at_the_end(is_padding):
        return None
    if candidates.device.type == "cpu":  # numpy's reductions over booleans stop early; torch's read every element
        first = _block_start(candidates.numpy(), np)
        return None if first is None else torch.from_numpy(first)
    return _block_start(candidates.to(torch.uint8), torch)


def _block_start(candidate: Any, lib: Any) -> Any:
    """:func:`block_start` after the padding check, over numpy arrays (``lib`` numpy) or torch
    tensors (``lib`` torch) alike."""
    blocks = (candidate[:, 1:] > candidate[:, :-1]).sum(1) + candidate[:, 0]  # runs of candidates in each row
    return None if (blocks > 1).any() else lib.argmax(candidate, 1)


def sentinel_rows(
    ids: torch.Tensor, length: torch.Tensor, first: torch.Tensor, start: torch.Tensor, end: torch.Tensor,
    sentinels: torch.Tensor, eos_id: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """T5's sentinel format as ``[source ; target]`` rows (:func:`seq2seq_rows`' input), from the
    noise spans alone: rows whose real tokens are positions ``[0, length[b])`` and whose span
    ``k`` covers positions ``[first + start[b, k], first + end[b, k])`` (:func:`random_spans`).

    Every column of the output is a token of the row moved by an offset that changes only at a
    span (in the source, by the span's length less its sentinel; in the target, to the next
    span's tokens), so one cumulative sum of ``[B, S]`` steps and one gather build every row,
    then one scatter writes the sentinels and ``eos_id``. What follows a row's target is left
    for :func:`seq2seq_rows` to pad. Returns ``(rows [B, W], source lengths, target lengths)``.
    """
    B, T = ids.shape
    S = start.shape[1]
    device = ids.device
    span_len = end - start  # (B, S): 0 for the empty spans after a row's last
    valid = span_len > 0
    spans = valid.sum(dim=1)  # (B,)
    noise_before = span_len.cumsum(dim=1) - span_len  # (B, S)
    noise = noise_before[:, -1] + span_len[:, -1]  # (B,)
    position = start + first[:, None]  # (B, S): where span k starts in the row
    k = torch.arange(S, device=device)[None, :]
    source_len = length - noise + spans
    target_len = noise + spans + 1  # with eos
    total = source_len + target_len
    W = max(int(total.max()), 1)
    source_col = position - noise_before + k  # (B, S): span k's sentinel in the source
    target_col = source_len[:, None] + k + noise_before  # (B, S): span k's sentinel in the target
    # The offset (row position - column) steps only at spans: by span k's length less its sentinel
    # after its source sentinel; to span k's tokens (position - column - 1) at its target sentinel,
    # span 0's from the source's last offset.
    target_offset = position - target_col - 1
    previous = torch.cat([(noise - spans)[:, None], target_offset[:, :-1]], dim=1)
    both = torch.cat([valid, valid], dim=1)
    steps = torch.cat([span_len - 1, target_offset - previous], dim=1).mul_(both)  # empty spans: no step
    at = torch.cat([source_col + 1, target_col], dim=1).mul_(both)
    # A step of 1 at every column but the first besides: the running sum is column + offset.
    index = torch.ones(B, W + 1, dtype=torch.long, device=device)
    index[:, 0] = 0
    index = index.scatter_add_(1, at, steps).cumsum_(dim=1)[:, :W].clamp_(0, T - 1)
    rows = ids.gather(1, index)
    eos_col = (total - 1)[:, None]
    marker = torch.where(valid, span_sentinels(k.expand(B, S), sentinels), eos_id).to(ids.dtype)  # (B, S)
    columns = torch.cat([torch.where(valid, source_col, eos_col), torch.where(valid, target_col, eos_col), eos_col], 1)
    rows.scatter_(1, columns, torch.cat([marker, marker, torch.full_like(eos_col, eos_id, dtype=ids.dtype)], dim=1))
    return rows, source_len, target_len


def prefix_lm_parts(
    batch: TokenBatch, noise_density: float | torch.Tensor, generator: torch.Generator, pad_id: int
) -> Parts:
    """T5's ``prefix_lm``: each row split after ``k`` text tokens
    (:func:`objreg.toolkit.spans.random_prefix_length` over the tokens between ``[CLS]`` and
    ``[SEP]``), ``[CLS]`` staying in the source."""
    real = ~batch.is_padding  # (B, T)
    text = (real.sum(dim=1) - 2).clamp(min=0)  # (B,)
    split = 1 + random_prefix_length(text, noise_density, generator)  # (B,): the first target position
    return prefix_parts(batch.input_ids, real, split, pad_id)


def choose_parts(use_first: torch.Tensor, first: Parts, second: Parts, pad_id: int) -> Parts:
    """Row ``b`` from ``first`` where ``use_first[b]``, else from ``second``."""
    out = []
    for a, b in ((first[0], second[0]), (first[2], second[2])):
        W = max(a.shape[1], b.shape[1])
        a = torch.nn.functional.pad(a, (0, W - a.shape[1]), value=pad_id)
        b = torch.nn.functional.pad(b, (0, W - b.shape[1]), value=pad_id)
        out.append(torch.where(use_first[:, None], a, b))
    return (out[0], torch.where(use_first, first[1], second[1]), out[1], torch.where(use_first, first[3], second[3]))


def seq2seq_batch(
    parts: Parts, document: torch.Tensor, pad_id: int, extras: dict[str, torch.Tensor] | None = None
) -> CorruptedBatch:
    """``[source ; target]`` rows as a :class:`CorruptedBatch` (layout in the module docstring).

    ``document``: ``[B]`` document id of each row. Extras added: ``prefix_length`` ``[B]`` (the
    bidirectional source), ``target_positions`` ``[B, K]`` (the positions that predict a target
    token, ``K`` = longest target) and ``target_weights`` ``[B, K]`` (1.0 real, 0.0 list padding).
    """
    source, source_len, target, target_len = parts
    B, device = source.shape[0], source.device
    total = source_len + target_len  # (B,)
    W = max(int(total.max()) if B else 0, 1)
    j = torch.arange(W, device=device)[None, :]  # (1, W)
    in_target = j >= source_len[:, None]
    ids = torch.where(in_target, gather_rows(target, target_len, j - source_len[:, None], pad_id),
                      gather_rows(source, source_len, j.expand(B, W), pad_id))  # (B, W)
    return seq2seq_rows(ids, source_len, target_len, document, pad_id, extras)


def seq2seq_rows(
    ids: torch.Tensor, source_len: torch.Tensor, target_len: torch.Tensor, document: torch.Tensor, pad_id: int,
    extras: dict[str, torch.Tensor] | None = None,
) -> CorruptedBatch:
    """:func:`seq2seq_batch` from rows already laid out: ``ids`` ``[B, W]`` holds each row's
    source, then its target (``W = max(1, longest row)``); whatever follows becomes ``pad_id``, in place."""
    B, W = ids.shape
    device = ids.device
    total = source_len + target_len  # (B,)
    j = torch.arange(W, device=device)[None, :]  # (1, W)
    is_padding = j >= total[:, None]  # (B, W)
    ids.masked_fill_(is_padding, pad_id)
    # Position t predicts t + 1 from the last source token to the second-to-last target token.
    unlabelled = (j < (source_len - 1)[:, None]) | torch.nn.functional.pad(is_padding[:, 1:], (0, 1), value=True)
    labels = torch.nn.functional.pad(ids[:, 1:], (0, 1), value=pad_id).masked_fill_(unlabelled, IGNORE_INDEX)
    K = max(int(target_len.max()) if B else 0, 1)
    k = torch.arange(K, device=device)[None, :]  # (1, K)
    weights = k < target_len[:, None]  # (B, K)
    positions = torch.where(weights, (source_len - 1).clamp(min=0)[:, None] + k, 0)  # (B, K)
    return CorruptedBatch(
        input_ids=ids,
        labels=labels,
        is_padding=is_padding,
        position_ids=j.expand(B, W).clone(),
        document_ids=document[:, None].masked_fill(is_padding, -1),
        extras={
            **(extras or {}),
            "prefix_length": source_len.clone(),
            "target_positions": positions,
            "target_weights": weights.float(),
        },
    )


def row_document(batch: TokenBatch) -> torch.Tensor:
    """``[B]``: the document of each row's first token (a rebuilt row is one sequence)."""
    return batch.document_ids[:, 0]


def attention(batch: CorruptedBatch) -> masks.AttentionMask:
    """Bidirectional over the source (``prefix_length``), causal over the target, no padding."""
    return masks.AttentionMask.prefix(batch.is_padding, batch.extras["prefix_length"], batch.document_ids)


def seq2seq_loss(outputs: ModelOutputs, batch: CorruptedBatch, head: str = "lm") -> torch.Tensor:
    """Mean negative log-likelihood of each row's target tokens, ``[B]``. The LM head runs only at
    the ``target_positions`` (fixed-size lists, so shapes do not depend on the data)."""
    positions = batch.extras["target_positions"]  # (B, K)
    logits = outputs.model.heads[head](gather_positions(outputs.hidden, positions))  # (B, K, V)
    targets = batch.labels.gather(1, positions).clamp(min=0)  # (B, K); list padding is weighted out
    return weighted_mean(smoothed_nll(logits, targets), batch.extras["target_weights"])
