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

import torch

from objreg.core import masks
from objreg.core.errors import DataError
from objreg.core.types import IGNORE_INDEX, CorruptedBatch, ModelOutputs, TokenBatch, Vocabulary
from objreg.toolkit.losses import gather_positions, smoothed_nll, weighted_mean
from objreg.toolkit.selection import maskable
from objreg.toolkit.spans import count_spans, random_prefix_length, random_spans_noise_mask, span_starts

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
    """T5's ``noise_span_to_unique_sentinel`` / ``nonnoise_span_to_unique_sentinel``.

    Source: the real tokens with each noise span replaced by one sentinel. Target: for each span,
    its sentinel followed by its tokens, then ``eos_id``. Span ``k`` (counted along the row) gets
    ``sentinels[k]`` in both, so the first span gets the first sentinel; a row with more spans than
    ``sentinels`` reuses them in turn (:func:`span_sentinels`).
    """
    layout = SentinelLayout.of(ids, real, noise, sentinels)
    B = ids.shape[0]
    Ws = max(int(layout.source_len.max()) if B else 0, 1)
    Wt = max(int(layout.target_len.max()) - 1 if B else 0, 1) + 1  # the longest target, and eos
    source = torch.full((B, Ws + 1), pad_id, dtype=ids.dtype, device=ids.device)
    layout.scatter_source(source, 0)
    target = torch.full((B, Wt + 1), pad_id, dtype=ids.dtype, device=ids.device)
    layout.scatter_target(target, torch.zeros_like(layout.source_len), eos_id)
    return source[:, 1:].contiguous(), layout.source_len, target[:, 1:].contiguous(), layout.target_len


class SentinelLayout:
    """Where each token of a row goes in T5's sentinel format, from prefix counts along the row:
    source token ``t`` (kept, or the sentinel of a span starting at ``t``) at ``n_keep[t] - 1``;
    in the target, the sentinel of a span starting at ``t`` at ``n_start[t] + n_noise[t] - 2``
    and noise token ``t`` at ``n_start[t] + n_noise[t] - 1`` (inclusive counts), ``eos`` last.
    Every output is one scatter of the ``[B, T]`` row, never a compaction of a ``[B, 2T]`` one."""

    def __init__(self, ids: torch.Tensor, keep: torch.Tensor, starts: torch.Tensor, noise: torch.Tensor,
                 sentinel: torch.Tensor, n_start: torch.Tensor | None = None):
        self.ids, self.keep, self.starts, self.noise, self.sentinel = ids, keep, starts, noise, sentinel
        self.n_keep = keep.cumsum(dim=1)  # (B, T) long
        n_start = starts.cumsum(dim=1) if n_start is None else n_start
        self.at = noise.cumsum(dim=1).add_(n_start)  # (B, T): n_start + n_noise
        self.source_len = self.n_keep[:, -1] if ids.shape[1] else self.n_keep.sum(dim=1)  # (B,)
        self.target_len = (self.at[:, -1] if ids.shape[1] else self.at.sum(dim=1)) + 1  # (B,): with eos

    @classmethod
    def of(cls, ids: torch.Tensor, real: torch.Tensor, noise: torch.Tensor, sentinels: torch.Tensor) -> SentinelLayout:
        starts = span_starts(noise)  # (B, T)
        n_start = starts.cumsum(dim=1)  # (B, T)
        sentinel = span_sentinels(n_start - 1, sentinels)  # (B, T)
        keep = real & (~noise | starts)  # (B, T): kept tokens, and one sentinel per span
        return cls(ids, keep, starts, noise, sentinel, n_start)

    # The scatters below leave column 0 of ``out`` as the dump for tokens that go nowhere: the
    # index is (column + 1) * mask, two cheap integer operations where torch.where costs about
    # five times as much on the CPU. Callers read ``out[:, 1:]``.

    # (In-place arithmetic on the temporaries: every [B, T] allocation of a megabyte or more can
    # cost page faults, which dominated these scatters on a loaded machine.)

    def scatter_source(self, out: torch.Tensor, offset: int) -> None:
        """Write the source into ``out[:, 1:]`` from column ``offset``."""
        index = self.n_keep.add(offset).mul_(self.keep)
        value = self.sentinel.sub(self.ids).mul_(self.starts).add_(self.ids)  # sentinel at span starts, else the id
        out.scatter_(1, index, value)

    def scatter_target(self, out: torch.Tensor, offset: torch.Tensor, eos_id: int) -> None:
        """Write the target into ``out[:, 1:]`` from column ``offset[b]``."""
        at = self.at.add(offset[:, None])
        out.scatter_(1, at.sub(1).mul_(self.starts), self.sentinel)
        out.scatter_(1, at.mul_(self.noise), self.ids)
        end = (offset + self.target_len)[:, None]
        out.scatter_(1, end, torch.full_like(end, eos_id))


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
    """``seq2seq_batch(span_corruption_parts(...), ...)`` in one pass: the noise mask, then every
    token scattered once to its place in ``[source ; target]`` (:class:`SentinelLayout`), with no
    intermediate source and target rows. The same tensors, the same draws."""
    noise = random_spans_noise_mask(maskable(batch), noise_density, mean_span_length, generator)  # (B, T)
    ids = batch.input_ids
    B, T = ids.shape
    if T == 0:
        sentinels = cycled_sentinels(vocab, 0, objective, noise.device)
        parts = sentinel_parts(ids, ~batch.is_padding, noise, sentinels, end_of_text_id(vocab), vocab.pad_id)
        return seq2seq_batch(parts, row_document(batch), vocab.pad_id)
    starts = span_starts(noise)  # (B, T)
    n_start = starts.cumsum(dim=1)  # (B, T)
    sentinels = cycled_sentinels(vocab, int(n_start[:, -1].max()) if B else 0, objective, noise.device)
    sentinel = span_sentinels(n_start - 1, sentinels)  # (B, T)
    layout = SentinelLayout(ids, ~batch.is_padding & (~noise | starts), starts, noise, sentinel, n_start)
    source_len, target_len = layout.source_len, layout.target_len
    W = max(int((source_len + target_len).max()) if B else 0, 1)
    rows = torch.full((B, W + 1), vocab.pad_id, dtype=ids.dtype, device=ids.device)
    layout.scatter_source(rows, 0)
    layout.scatter_target(rows, source_len, end_of_text_id(vocab))
    return seq2seq_rows(rows[:, 1:].contiguous(), source_len, target_len, row_document(batch), vocab.pad_id)


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
    source, then its target, then ``pad_id`` (``W = max(1, longest row)``)."""
    B, W = ids.shape
    device = ids.device
    total = source_len + target_len  # (B,)
    j = torch.arange(W, device=device)[None, :]  # (1, W)
    is_padding = j >= total[:, None]  # (B, W)
    # Position t predicts t + 1 from the last source token to the second-to-last target token.
    predicts = (j >= (source_len - 1)[:, None]) & (j < (total - 1)[:, None])  # (B, W)
    next_ids = torch.nn.functional.pad(ids[:, 1:], (0, 1), value=pad_id)
    labels = next_ids.sub_(IGNORE_INDEX).mul_(predicts).add_(IGNORE_INDEX)  # where(predicts, next id, IGNORE_INDEX)
    K = max(int(target_len.max()) if B else 0, 1)
    k = torch.arange(K, device=device)[None, :]  # (1, K)
    weights = k < target_len[:, None]  # (B, K)
    positions = torch.where(weights, (source_len - 1).clamp(min=0)[:, None] + k, 0)  # (B, K)
    return CorruptedBatch(
        input_ids=ids,
        labels=labels,
        is_padding=is_padding,
        position_ids=j.expand(B, W).clone(),
        document_ids=(~is_padding).long().mul_(document[:, None] + 1).sub_(1),  # -1 at padding
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
