"""T5's span noise: how many tokens and spans a row gets, random segmentations, the noise mask,
and random prefix lengths (``t5``, ``ul2`` and ``prefix_lm``, through :mod:`objreg.toolkit.seq2seq`).

Everything is vectorised over the batch; rows may have different lengths and every count is
computed from each row's own length. Positions are found from masks (``is_padding``,
``is_special``), never by comparing token ids, so a literal pad or 0 id inside the text is just
text (huggingface/transformers#15443).

:func:`random_spans_noise_mask` follows T5's ``random_spans_noise_mask``: exactly
``clip(round(n · density), 1, n - 1)`` noise tokens in exactly ``max(1, round(noise / mean_span))``
spans, segment lengths drawn uniformly at random. T5 interleaves the segments "non-noise first,
noise last", so every row ends with a noise span (t5#905); its ``random_roll`` fix rolls the mask,
which can cut a span in two. Here the two outer non-noise gaps may be empty instead: every mask
with that many noise tokens in that many spans is equally likely, counts stay exact, and the last
token is noise with probability ``spans / (non-noise + 1)``.
"""

from __future__ import annotations

import torch

from objreg.toolkit.randomness import uniform
from objreg.toolkit.selection import smallest_positions


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
    such splits (T5's ``_random_segmentation``).

    Returns ``[B, S]`` long segment lengths in order, zero beyond ``num_segments[b]``;
    ``S = max(1, max(num_segments))``. Needs ``1 <= num_segments <= num_items`` or both zero.
    """
    return segment_starts(num_items, num_segments, generator).diff(dim=1)


def segment_starts(num_items: torch.Tensor, num_segments: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """:func:`random_segmentation` as ``[B, S + 1]`` long offsets: the first item of each
    segment, then ``num_items[b]`` from column ``num_segments[b]`` on. The ``num_segments - 1``
    distinct cut points among the ``num_items - 1`` gaps are the smallest random keys
    (:func:`objreg.toolkit.selection.smallest_positions`), as the first places of an argsort of
    the keys would pick them."""
    B, device = num_items.shape[0], num_items.device
    items = max(int(num_items.max()) if B else 0, 1)
    S = max(int(num_segments.max()) if B else 0, 1)
    keys = uniform((B, items - 1), generator, device)  # (B, G): one key per gap between items
    if B and int(num_items.min()) < items:  # rows of different lengths: their missing gaps come last
        keys = torch.where(torch.arange(items - 1, device=device)[None, :] < (num_items - 1)[:, None], keys, 2.0)
    cuts = (num_segments - 1).clamp(min=0)
    row, gap = smallest_positions(keys, cuts)  # each row's cuts, left to right: item gap + 1 starts a segment
    nth = torch.arange(row.shape[0], device=device) - (cuts.cumsum(dim=0) - cuts).index_select(0, row)
    starts = num_items[:, None].repeat(1, S + 1)
    starts[:, 0] = 0
    starts.index_put_((row, nth + 1), gap + 1)
    return starts


def random_spans(
    count: torch.Tensor, noise_density: float | torch.Tensor, mean_span_length: float | torch.Tensor,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """T5 span noise over ``count[b]`` candidates (module docstring for the distribution), as
    spans: ``[B, S]`` long ranks (0-based, among the row's candidates) where each noise span
    starts and ends (exclusive), in order; a row with fewer spans than ``S`` has empty ones
    (``start == end``) after its last. Draws the noise lengths, then the gaps."""
    num_noise, num_spans = noise_counts(count, noise_density, mean_span_length)
    noise_before = segment_starts(num_noise, num_spans, generator)  # (B, S + 1)
    # Non-noise in spans + 1 gaps whose two outer ones may be empty: segment n + 2 items into
    # non-empty pieces, the first and the last gap each giving one item back.
    gaps = segment_starts(count - num_noise + 2, num_spans + 1, generator)  # (B, >= S + 2)
    S = noise_before.shape[1] - 1
    gap_before = gaps[:, 1 : S + 1] - 1  # non-noise candidates before span k
    return gap_before + noise_before[:, :S], gap_before + noise_before[:, 1:]


def spans_mask(candidates: torch.Tensor, start: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` bool: the candidates whose rank lies in a span ``[start, end)`` (:func:`random_spans`)."""
    B, T = candidates.shape
    delta = torch.zeros(B, T + 2, dtype=torch.long, device=candidates.device)  # empty spans may sit at rank T + 1
    delta.scatter_add_(1, start, torch.ones_like(start))
    delta.scatter_add_(1, end, torch.full_like(end, -1))
    inside = delta.cumsum_(dim=1)[:, :T] > 0  # (B, T): noise by rank among the candidates
    rank = candidates.cumsum(dim=1).sub_(1).clamp_(min=0)  # (B, T)
    return candidates & inside.gather(1, rank)


def random_spans_noise_mask(
    candidates: torch.Tensor,
    noise_density: float | torch.Tensor,
    mean_span_length: float | torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """T5 span noise over the ``candidates`` of each row (module docstring for the distribution).

    ``candidates``: ``[B, T]`` bool, the positions that may be noise (usually
    :func:`objreg.toolkit.selection.maskable`); the counts come from each row's number of candidates. Returns
    ``[B, T]`` bool. Noise spans are runs of consecutive candidates; a non-candidate inside a run
    (a literal special token) stays in place and splits it.
    """
    return spans_mask(candidates, *random_spans(candidates.sum(dim=1), noise_density, mean_span_length, generator))


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


def span_starts(noise: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` bool: the first position of each run of noise."""
    before = torch.nn.functional.pad(noise[:, :-1], (1, 0), value=False)
    return noise & ~before


def count_spans(noise: torch.Tensor) -> int:
    """Most noise runs in any row (how many sentinels the batch needs)."""
    return int(span_starts(noise).sum(dim=1).max()) if noise.numel() else 0
