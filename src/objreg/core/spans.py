"""Span corruption and the ``[input ; target]`` prefix-LM layout, shared by the sequence-to-sequence
objectives (``t5``, ``ul2``, ``bart``, ``prefix_lm``).

Everything is vectorised over the batch; rows may have different lengths and every count is
computed from each row's own length. Positions are found from masks (``is_padding``,
``is_special``), never by comparing token ids, so a literal pad or 0 id inside the text is just
text (huggingface/transformers#15443).

**Noise masks.** :func:`random_spans_noise_mask` follows T5's ``random_spans_noise_mask``: exactly
``clip(round(n · density), 1, n - 1)`` noise tokens in exactly ``max(1, round(noise / mean_span))``
spans, segment lengths drawn uniformly at random. T5 interleaves the segments "non-noise first,
noise last", so every row ends with a noise span (t5#905); its ``random_roll`` fix rolls the mask,
which can cut a span in two. Here the two outer non-noise gaps may be empty instead: every mask
with that many noise tokens in that many spans is equally likely, counts stay exact, and the last
token is noise with probability ``spans / (non-noise + 1)``.

**Layout.** An encoder-decoder objective runs on the shared backbone as a prefix LM over
``source ; target`` (:func:`seq2seq_batch`): the source (corrupted input) is attended to
bidirectionally, the target causally, as UL2 and seqio's ``PrefixLMFeatureConverter`` do for
decoder-only models. Position ``t`` predicts token ``t + 1``; the labelled positions run from the
last source token (which predicts the first target token, seqio's "inputs + 1" bidirectional
region) to the second-to-last target token. Position ids continue from the source into the target,
as in a decoder-only sequence. The row becomes ``len(source) + len(target)`` tokens wide.
"""

from __future__ import annotations

import torch

from objreg.core import masks
from objreg.core.errors import DataError
from objreg.core.randomness import uniform
from objreg.core.types import IGNORE_INDEX, CorruptedBatch, ModelOutputs, TokenBatch, Vocabulary

#: (source, source lengths, target, target lengths): compact, left-aligned, right-padded token rows.
Parts = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


# -- vocabulary ---------------------------------------------------------------------------------


def named_id(vocab: Vocabulary, token: str, objective: str) -> int:
    """The id of the named special token ``token`` (e.g. ``"[NLU]"``), or a :class:`DataError`."""
    if token not in vocab.named_ids:
        have = ", ".join(sorted(vocab.named_ids)) or "none"
        raise DataError(f"{objective} needs the special token {token} in the vocabulary's named_ids (it has: {have})")
    return vocab.named_ids[token]


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


# -- counting and segmenting ----------------------------------------------------------------------


def ordinary_tokens(batch: TokenBatch) -> torch.Tensor:
    """``[B, T]`` bool: real tokens that are not special; the only ones a corruption may touch."""
    return ~(batch.is_special | batch.is_padding)


def noise_counts(
    length: torch.Tensor, noise_density: float | torch.Tensor, mean_span_length: float | torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """T5's counts per row: ``num_noise = clip(round(n · density), 1, n - 1)`` and
    ``num_spans = max(1, round(num_noise / mean_span_length))`` (half to even, like ``np.round``).

    ``length``: ``[B]`` long (``n``). Density and mean span length are floats or ``[B]`` tensors.
    Degenerate rows: density 0 or ``n = 0`` give no noise; ``n = 1`` gives one noise token. Spans
    are capped at ``non-noise + 1``, the most that separated spans can number.
    """
    n = length.long()
    density = torch.as_tensor(noise_density, dtype=torch.float64, device=n.device)
    mean = torch.as_tensor(mean_span_length, dtype=torch.float64, device=n.device)
    num_noise = torch.round(n.double() * density).long().clamp(min=1)
    num_noise = torch.minimum(num_noise, (n - 1).clamp(min=1))
    num_noise = torch.where(density > 0, torch.minimum(num_noise, n), 0)
    num_spans = torch.round(num_noise.double() / mean).long().clamp(min=1)
    num_spans = torch.minimum(torch.minimum(num_spans, num_noise), n - num_noise + 1)
    return num_noise, torch.where(num_noise > 0, num_spans, 0)


def random_segmentation(
    num_items: torch.Tensor, num_segments: torch.Tensor, generator: torch.Generator
) -> torch.Tensor:
    """Split ``num_items[b]`` items into ``num_segments[b]`` non-empty segments, uniformly over all
    such splits (T5's ``_random_segmentation``): ``num_segments - 1`` distinct cut points among the
    ``num_items - 1`` gaps, chosen as the smallest random keys.

    Returns ``[B, S]`` long segment lengths in order, zero beyond ``num_segments[b]``;
    ``S = max(1, max(num_segments))``. Needs ``1 <= num_segments <= num_items`` or both zero.
    """
    B, device = num_items.shape[0], num_items.device
    items = max(int(num_items.max()) if B else 0, 1)
    S = max(int(num_segments.max()) if B else 0, 1)
    gaps = torch.arange(items - 1, device=device)[None, :]  # (1, G)
    valid_gap = gaps < (num_items - 1)[:, None]  # (B, G)
    keys = torch.where(valid_gap, uniform((B, items - 1), generator, device), 2.0)  # (B, G)
    # The gaps with the num_segments - 1 smallest keys: mark the first ranks in sorted order and
    # scatter the marks back (one sort; argsort of the argsort would be a second).
    order = keys.argsort(dim=1)  # (B, G)
    first_ranks = gaps < (num_segments - 1)[:, None]  # (B, G), in sorted order
    cut = valid_gap & torch.zeros_like(first_ranks).scatter_(1, order, first_ranks)  # item g+1 starts a segment
    segment = torch.cat([torch.zeros_like(num_items)[:, None], cut.long().cumsum(dim=1)], dim=1)  # (B, items)
    valid_item = torch.arange(items, device=device)[None, :] < num_items[:, None]  # (B, items)
    lengths = torch.zeros(B, S, dtype=torch.long, device=device)
    return lengths.scatter_add_(1, segment.clamp(max=S - 1), valid_item.long())


def random_spans_noise_mask(
    candidates: torch.Tensor,
    noise_density: float | torch.Tensor,
    mean_span_length: float | torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """T5 span noise over the ``candidates`` of each row (module docstring for the distribution).

    ``candidates``: ``[B, T]`` bool, the positions that may be noise (usually
    :func:`ordinary_tokens`); the counts come from each row's number of candidates. Returns
    ``[B, T]`` bool. Noise spans are runs of consecutive candidates; a non-candidate inside a run
    (a literal special token) stays in place and splits it.
    """
    B, T = candidates.shape
    count = candidates.sum(dim=1)  # (B,)
    num_noise, num_spans = noise_counts(count, noise_density, mean_span_length)
    noise_lengths = random_segmentation(num_noise, num_spans, generator)  # (B, S)
    # Non-noise in spans + 1 gaps whose two outer ones may be empty: segment n + 2 items into
    # non-empty pieces, then take one item off the first and the last gap.
    gap_lengths = random_segmentation(count - num_noise + 2, num_spans + 1, generator)  # (B, S' >= S + 1)
    outer = torch.zeros_like(gap_lengths).scatter_(1, num_spans[:, None], 1)
    gap_lengths = gap_lengths - outer
    gap_lengths[:, 0] -= 1
    S = noise_lengths.shape[1]
    gap_lengths = torch.nn.functional.pad(gap_lengths, (0, S + 1 - gap_lengths.shape[1]))  # (B, S + 1)
    runs = torch.stack([gap_lengths[:, :S], noise_lengths], dim=2).reshape(B, 2 * S)  # gap, noise, gap, ...
    ends = runs.cumsum(dim=1)  # (B, 2S)
    starts = ends - runs
    # +1 where a noise run starts, -1 where it ends; the running sum is 1 inside noise.
    delta = torch.zeros(B, T + 1, dtype=torch.long, device=candidates.device)
    delta.scatter_add_(1, starts[:, 1::2], torch.ones_like(noise_lengths))
    delta.scatter_add_(1, ends[:, 1::2], -torch.ones_like(noise_lengths))
    compressed = delta.cumsum(dim=1)[:, :T] > 0  # (B, T): noise by rank among the candidates
    rank = (candidates.long().cumsum(dim=1) - 1).clamp(min=0)  # (B, T)
    return candidates & compressed.gather(1, rank)


def random_prefix_length(
    num_items: torch.Tensor, noise_density: float | torch.Tensor, generator: torch.Generator
) -> torch.Tensor:
    """How many of ``num_items[b]`` leading items go to the prefix, T5's ``random_prefix_noise_mask``:
    uniform in ``[max(1, round((1 - 2·density)·(n - 1))), n - 1]``, so the continuation's expected
    share is about ``density`` (density 0.5: any split leaving both sides non-empty). A row with
    fewer than two items gets an empty prefix.

    Returns ``[B]`` long.
    """
    n = num_items.long()
    density = torch.as_tensor(noise_density, dtype=torch.float64, device=n.device)
    high = (n - 1).clamp(min=0)
    low = torch.round((1 - 2 * density) * high.double()).long().clamp(min=1)
    low = torch.minimum(low, high)
    u = uniform((n.shape[0],), generator, n.device).double()
    pick = low + (u * (high - low + 1).double()).long()
    return torch.minimum(pick, high)  # u < 1, but rounding in float could reach high + 1


# -- building source and target -----------------------------------------------------------------


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
    ``sentinels[k]`` in both, so the first span gets the first sentinel. ``sentinels`` must hold at
    least as many ids as the longest row has spans (:func:`count_spans`, :func:`sentinel_tensor`).
    """
    starts = span_starts(noise)  # (B, T)
    span = (starts.long().cumsum(dim=1) - 1).clamp(0, sentinels.shape[0] - 1)  # (B, T)
    sentinel = sentinels[span]  # (B, T)
    source, source_len = compact(torch.where(starts, sentinel, ids), real & ~(noise & ~starts), pad_id)
    B, T = ids.shape
    # Each position emits (sentinel if a span starts here, token if noise), in that order.
    pairs = torch.stack([sentinel, ids], dim=2).reshape(B, 2 * T)
    emit = torch.stack([starts, noise], dim=2).reshape(B, 2 * T)
    target, target_len = compact(pairs, emit, pad_id)
    target, target_len = append_token(target, target_len, eos_id, pad_id)
    return source, source_len, target, target_len


def span_starts(noise: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` bool: the first position of each run of noise."""
    before = torch.nn.functional.pad(noise[:, :-1], (1, 0), value=False)
    return noise & ~before


def count_spans(noise: torch.Tensor) -> int:
    """Most noise runs in any row (how many sentinels the batch needs)."""
    return int(span_starts(noise).sum(dim=1).max()) if noise.numel() else 0


def prefix_parts(ids: torch.Tensor, real: torch.Tensor, split: torch.Tensor, pad_id: int) -> Parts:
    """Source = the real tokens before position ``split[b]``, target = the real tokens from it on."""
    before = torch.arange(ids.shape[1], device=ids.device)[None, :] < split[:, None]
    source, source_len = compact(ids, real & before, pad_id)
    target, target_len = compact(ids, real & ~before, pad_id)
    return source, source_len, target, target_len


def choose_parts(use_first: torch.Tensor, first: Parts, second: Parts, pad_id: int) -> Parts:
    """Row ``b`` from ``first`` where ``use_first[b]``, else from ``second``."""
    out = []
    for a, b in ((first[0], second[0]), (first[2], second[2])):
        W = max(a.shape[1], b.shape[1])
        a = torch.nn.functional.pad(a, (0, W - a.shape[1]), value=pad_id)
        b = torch.nn.functional.pad(b, (0, W - b.shape[1]), value=pad_id)
        out.append(torch.where(use_first[:, None], a, b))
    return (out[0], torch.where(use_first, first[1], second[1]), out[1], torch.where(use_first, first[3], second[3]))


# -- the prefix-LM batch, its mask and its loss ---------------------------------------------------


def seq2seq_batch(parts: Parts, document: torch.Tensor, pad_id: int, extras: dict | None = None) -> CorruptedBatch:
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
    is_padding = j >= total[:, None]  # (B, W)
    # Position t predicts t + 1 from the last source token to the second-to-last target token.
    predicts = (j >= (source_len - 1)[:, None]) & (j < (total - 1)[:, None])  # (B, W)
    next_ids = torch.nn.functional.pad(ids[:, 1:], (0, 1), value=pad_id)
    labels = torch.where(predicts, next_ids, IGNORE_INDEX)
    K = max(int(target_len.max()) if B else 0, 1)
    k = torch.arange(K, device=device)[None, :]  # (1, K)
    weights = k < target_len[:, None]  # (B, K)
    positions = torch.where(weights, (source_len - 1).clamp(min=0)[:, None] + k, 0)  # (B, K)
    return CorruptedBatch(
        input_ids=ids,
        labels=labels,
        is_padding=is_padding,
        position_ids=j.expand(B, W).clone(),
        document_ids=torch.where(is_padding, -1, document[:, None]),
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


def seq2seq_attention_mask(batch: CorruptedBatch) -> torch.Tensor:
    """Bidirectional over the source (``prefix_length``), causal over the target, no padding."""
    return masks.prefix(batch.is_padding, batch.extras["prefix_length"]) & masks.same_document(batch.document_ids)


def seq2seq_loss(outputs: ModelOutputs, batch: CorruptedBatch, head: str = "lm") -> torch.Tensor:
    """Mean negative log-likelihood of each row's target tokens, ``[B]``. The LM head runs only at
    the ``target_positions`` (fixed-size lists, so shapes do not depend on the data)."""
    positions = batch.extras["target_positions"]  # (B, K)
    H = outputs.hidden.shape[-1]
    picked = outputs.hidden.gather(1, positions.unsqueeze(-1).expand(-1, -1, H))  # (B, K, H)
    log_probs = torch.log_softmax(outputs.model.heads[head](picked), dim=-1)  # (B, K, V)
    targets = batch.labels.gather(1, positions).clamp(min=0)  # (B, K); list padding is weighted out
    weights = batch.extras["target_weights"].to(log_probs.dtype)  # (B, K)
    nll = -log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (B, K)
    return (nll * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1)
