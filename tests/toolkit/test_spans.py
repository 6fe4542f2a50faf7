"""objreg.toolkit.spans: T5 counts, segmentations, noise masks and prefix lengths, each checked
against a loop or an exact distribution."""

from __future__ import annotations

import collections
import math

import pytest
import torch

from objreg.toolkit import spans


def within_4_sigma(count: float, n: float, p: float) -> bool:
    return abs(count - n * p) <= 4 * math.sqrt(n * p * (1 - p)) + 1e-9


def t5_counts(n: int, density: float, mean: float) -> tuple[int, int]:
    """T5's random_spans_noise_mask counts for one row, written out (Python's round is half-even,
    like np.round)."""
    if density == 0 or n == 0:
        return 0, 0
    noise = 1 if n == 1 else min(max(round(n * density), 1), n - 1)
    num_spans = max(1, round(noise / mean))
    return noise, min(num_spans, noise, n - noise + 1)


def runs(row: list[bool]) -> list[tuple[int, int]]:
    """(start, length) of each run of True."""
    out, start = [], None
    for i, v in enumerate([*row, False]):
        if v and start is None:
            start = i
        if not v and start is not None:
            out.append((start, i - start))
            start = None
    return out


@pytest.mark.parametrize("density, mean", [(0.15, 3.0), (0.5, 3.0), (0.15, 64.0), (0.5, 8.0), (0.0, 3.0), (1.0, 1.0)])
def test_noise_counts_match_t5(density, mean):
    n = torch.arange(0, 300)
    noise, num_spans = spans.noise_counts(n, density, mean)
    expected = [t5_counts(int(i), density, mean) for i in n]
    assert list(zip(noise.tolist(), num_spans.tolist())) == expected


def test_noise_counts_take_per_row_settings():
    n = torch.tensor([100, 100, 512])
    noise, num_spans = spans.noise_counts(n, torch.tensor([0.15, 0.5, 0.5]), torch.tensor([3.0, 8.0, 64.0]))
    assert noise.tolist() == [15, 50, 256] and num_spans.tolist() == [5, 6, 4]


def test_random_segmentation_is_exact_and_uniform():
    g = torch.Generator().manual_seed(0)
    items = torch.tensor([5, 7, 1, 0, 9] * 400)
    segments = torch.tensor([2, 7, 1, 0, 3] * 400)
    lengths = spans.random_segmentation(items, segments, g)
    assert torch.equal(lengths.sum(dim=1), items)
    assert torch.equal((lengths > 0).sum(dim=1), segments)
    assert bool(((lengths > 0) == (torch.arange(lengths.shape[1]) < segments[:, None])).all())  # leading segments
    # 5 items in 2 pieces: (1,4) (2,3) (3,2) (4,1), each 1/4 of 400 rows.
    pieces = collections.Counter(tuple(r[:2]) for r in lengths[0::5].tolist())
    assert set(pieces) == {(1, 4), (2, 3), (3, 2), (4, 1)}
    assert all(within_4_sigma(c, 400, 0.25) for c in pieces.values()), pieces


def test_noise_mask_counts_per_row_of_different_lengths():
    g = torch.Generator().manual_seed(1)
    B, T = 64, 80
    length = torch.randint(0, T + 1, (B,), generator=g)
    candidates = torch.arange(T)[None, :] < length[:, None]
    noise = spans.random_spans_noise_mask(candidates, 0.15, 3.0, g)
    assert not bool((noise & ~candidates).any())
    for b in range(B):
        expected = t5_counts(int(length[b]), 0.15, 3.0)
        got = (int(noise[b].sum()), len(runs(noise[b].tolist())))
        assert got == expected, (b, int(length[b]))


def test_noise_mask_is_uniform_over_placements():
    """6 candidates, 2 noise tokens: one span of 2 (5 placements) or, with mean 1, two separate
    spans (C(5, 2) = 10 placements); each placement equally likely, the ends included."""
    g = torch.Generator().manual_seed(2)
    N = 6000
    candidates = torch.ones(N, 6, dtype=torch.bool)
    for mean, placements in ((3.0, 5), (1.0, 10)):
        noise = spans.random_spans_noise_mask(candidates, 2 / 6, mean, g)
        seen = collections.Counter(tuple(r) for r in noise.int().tolist())
        assert len(seen) == placements
        assert all(len(runs(list(map(bool, k)))) == (1 if mean == 3.0 else 2) for k in seen)
        assert all(within_4_sigma(c, N, 1 / placements) for c in seen.values()), seen


def test_non_candidates_split_spans_and_are_never_noise():
    g = torch.Generator().manual_seed(3)
    candidates = torch.ones(500, 20, dtype=torch.bool)
    candidates[:, 7] = False
    noise = spans.random_spans_noise_mask(candidates, 0.5, 5.0, g)
    assert not bool(noise[:, 7].any())
    # Counted over the 19 candidates: 10 noise tokens (round(9.5) = 10, half to even).
    assert bool((noise.sum(dim=1) == 10).all())


def test_random_prefix_length_range_and_share():
    g = torch.Generator().manual_seed(4)
    n = torch.tensor([40] * 4000 + [1, 0, 2])
    for density, low in ((0.5, 1), (0.25, 20)):  # round(0.5 * 39) = 20 (half to even)
        k = spans.random_prefix_length(n, density, g)
        assert k[-3:].tolist() == [0, 0, 1]
        k = k[:-3]
        assert int(k.min()) == low and int(k.max()) == 39
        # Uniform over [low, 39]: each value about 4000 / (40 - low) times.
        counts = torch.bincount(k, minlength=40)[low:]
        assert all(within_4_sigma(int(c), 4000, 1 / (40 - low)) for c in counts)


def reference_segmentation(num_items, num_segments, generator):
    """The sort-based formulation of random_segmentation (one argsort of the gap keys)."""
    from objreg.toolkit.randomness import uniform

    B = num_items.shape[0]
    items = max(int(num_items.max()) if B else 0, 1)
    S = max(int(num_segments.max()) if B else 0, 1)
    gaps = torch.arange(items - 1)[None, :]
    valid_gap = gaps < (num_items - 1)[:, None]
    keys = torch.where(valid_gap, uniform((B, items - 1), generator), 2.0)
    order = keys.argsort(dim=1)
    first_ranks = gaps < (num_segments - 1)[:, None]
    cut = valid_gap & torch.zeros_like(first_ranks).scatter_(1, order, first_ranks)
    segment = torch.cat([torch.zeros_like(num_items)[:, None], cut.long().cumsum(dim=1)], dim=1)
    valid_item = torch.arange(items)[None, :] < num_items[:, None]
    return torch.zeros(B, S, dtype=torch.long).scatter_add_(1, segment.clamp(max=S - 1), valid_item.long())


@pytest.mark.parametrize("seed", range(6))
def test_random_segmentation_is_the_sort_based_one_draw_for_draw(seed, monkeypatch):
    g = torch.Generator().manual_seed(seed)
    B = 50
    items = torch.randint(0, 600, (B,), generator=g)
    segments = torch.minimum((torch.rand(B, generator=g) * items).long().clamp(min=1), items)
    segments = torch.where(items == 0, 0, segments)
    if seed % 2:
        items[:] = int(items.max())  # rows of one length (no padded gaps)
        segments = segments.clamp(max=int(items[0]))
    a, b = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
    assert torch.equal(spans.random_segmentation(items, segments, a), reference_segmentation(items, segments, b))
    assert torch.equal(a.get_state(), b.get_state())


def test_random_segmentation_with_tied_keys_is_the_sorts_pick(monkeypatch):
    """Coarse uniforms (8 levels) put ties at the cut in most rows: the pick still equals the sort's."""
    import objreg.toolkit.spans as module
    from objreg.toolkit import randomness

    def coarse(shape, generator, device=None):
        return (randomness.uniform(shape, generator, device) * 8).floor() / 8

    monkeypatch.setattr(module, "uniform", coarse)
    items = torch.full((40,), 300)
    segments = torch.randint(1, 300, (40,), generator=torch.Generator().manual_seed(1))
    got = spans.random_segmentation(items, segments, torch.Generator().manual_seed(5))
    g = torch.Generator().manual_seed(5)
    keys = coarse((40, 299), g)
    order = keys.argsort(dim=1)
    first = torch.arange(299)[None, :] < (segments - 1)[:, None]
    cut = torch.zeros_like(first).scatter_(1, order, first)
    segment = torch.cat([torch.zeros(40, 1, dtype=torch.long), cut.long().cumsum(dim=1)], dim=1)
    expected = torch.zeros(40, got.shape[1], dtype=torch.long).scatter_add_(1, segment, torch.ones_like(segment))
    assert torch.equal(got, expected)
