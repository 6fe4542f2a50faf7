"""objreg.spans: T5 counts, segmentations, noise masks, prefix splits and the [source ; target]
prefix-LM layout, each checked against a loop or an exact distribution."""

from __future__ import annotations

import collections
import itertools
import math
import types

import pytest
import torch
from torch import nn

import objreg
from objreg import IGNORE_INDEX, spans

VOCAB = objreg.Vocabulary(size=50, pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4, special_ids=tuple(range(10)),
                          sentinel_ids=(5, 6, 7), named_ids={"[EOS]": 8})


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


def test_compact_matches_a_loop():
    g = torch.Generator().manual_seed(5)
    tokens = torch.randint(10, 50, (7, 12), generator=g)
    keep = torch.rand(7, 12, generator=g) < 0.4
    out, lengths = spans.compact(tokens, keep, fill=-1)
    for b in range(7):
        kept = tokens[b][keep[b]].tolist()
        assert lengths[b] == len(kept)
        assert out[b].tolist() == kept + [-1] * (out.shape[1] - len(kept))
    assert out.shape[1] == max(1, int(keep.sum(dim=1).max()))


def test_sentinel_parts_spell_out_each_span():
    ids = torch.tensor([[2, 11, 12, 13, 14, 15, 16, 3, 0]])
    real = torch.tensor([[True] * 8 + [False]])
    noise = torch.tensor([[False, True, True, False, False, True, False, False, False]])
    source, slen, target, tlen = spans.sentinel_parts(ids, real, noise, torch.tensor([5, 6, 7]), eos_id=8, pad_id=0)
    assert source[0, : slen[0]].tolist() == [2, 5, 13, 14, 6, 16, 3]
    assert target[0, : tlen[0]].tolist() == [5, 11, 12, 6, 15, 8]
    assert spans.count_spans(noise) == 2


def test_missing_sentinels_and_named_tokens_are_data_errors():
    with pytest.raises(objreg.DataError, match="needs 4 span sentinels for this batch but the vocabulary has 3"):
        spans.sentinel_tensor(VOCAB, 4, "t5", torch.device("cpu"))
    assert spans.sentinel_tensor(VOCAB, 3, "t5", torch.device("cpu")).tolist() == [5, 6, 7]
    with pytest.raises(objreg.DataError, match=r"ul2 needs the special token \[NLU\].*it has: \[EOS\]"):
        spans.named_id(VOCAB, "[NLU]", "ul2")
    assert spans.end_of_text_id(VOCAB) == 8
    no_eos = objreg.Vocabulary(size=20, pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4, special_ids=(0, 1, 2, 3, 4))
    assert spans.end_of_text_id(no_eos) == 3


def two_rows() -> spans.Parts:
    source = torch.tensor([[20, 21, 22, 0], [30, 31, 32, 33]])
    target = torch.tensor([[40, 41, 0], [50, 51, 52]])
    return source, torch.tensor([3, 4]), target, torch.tensor([2, 3])


def test_seq2seq_batch_layout_labels_and_mask_match_a_loop():
    cb = spans.seq2seq_batch(two_rows(), torch.tensor([7, 9]), pad_id=0)
    assert cb.input_ids.tolist() == [[20, 21, 22, 40, 41, 0, 0], [30, 31, 32, 33, 50, 51, 52]]
    assert cb.is_padding.tolist() == [[False] * 5 + [True] * 2, [False] * 7]
    assert cb.document_ids.tolist() == [[7] * 5 + [-1] * 2, [9] * 7]
    assert cb.position_ids.tolist() == [list(range(7))] * 2
    # The last source token predicts the first target token; the last target token predicts nothing.
    assert cb.labels[0].tolist() == [IGNORE_INDEX] * 2 + [40, 41] + [IGNORE_INDEX] * 3
    assert cb.labels[1].tolist() == [IGNORE_INDEX] * 3 + [50, 51, 52, IGNORE_INDEX]
    assert cb.extras["target_positions"].tolist() == [[2, 3, 0], [3, 4, 5]]
    assert cb.extras["target_weights"].tolist() == [[1, 1, 0], [1, 1, 1]]
    mask = spans.seq2seq_attention_mask(cb)
    for b, (n, p) in enumerate(((5, 3), (7, 4))):
        for i, j in itertools.product(range(7), range(7)):
            allowed = i < n and j < n and (j < p or j <= i)  # padding queries see nothing
            assert bool(mask[b, i, j]) == allowed, (b, i, j)


def test_choose_parts_picks_rows():
    a, b = two_rows(), tuple(t.flip(0) for t in two_rows())
    chosen = spans.choose_parts(torch.tensor([True, False]), a, b, pad_id=0)
    assert chosen[0].tolist() == [[20, 21, 22, 0], [20, 21, 22, 0]]
    assert chosen[1].tolist() == [3, 3] and chosen[3].tolist() == [2, 2]


def test_seq2seq_loss_is_the_mean_target_nll():
    torch.manual_seed(0)
    cb = spans.seq2seq_batch(two_rows(), torch.tensor([0, 1]), pad_id=0)
    head = nn.Linear(4, 60).double()
    hidden = torch.randn(2, cb.input_ids.shape[1], 4, dtype=torch.float64)
    model = types.SimpleNamespace(heads={"lm": head})
    loss = spans.seq2seq_loss(objreg.ModelOutputs(hidden, model), cb)
    for b in range(2):
        terms = [-torch.log_softmax(head(hidden[b, t]), -1)[cb.labels[b, t]]
                 for t in range(cb.input_ids.shape[1]) if cb.labels[b, t] != IGNORE_INDEX]
        assert torch.allclose(loss[b], torch.stack(terms).mean())
