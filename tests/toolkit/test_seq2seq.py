"""objreg.toolkit.seq2seq: building sources and targets (compaction, T5's sentinel format, prefix
splits) and the [source ; target] prefix-LM layout, its attention and its loss, each against a loop."""

from __future__ import annotations

import itertools
import types

import pytest
import torch
from torch import nn

import objreg
from objreg import IGNORE_INDEX
from objreg.toolkit import seq2seq, spans
from objreg.toolkit.selection import maskable

VOCAB = objreg.Vocabulary(size=50, pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4, special_ids=tuple(range(10)),
                          sentinel_ids=(5, 6, 7), named_ids={"[EOS]": 8})


def framed_batch(lengths: list[int], seed: int = 0) -> objreg.TokenBatch:
    """Rows ``[CLS] x_1 … x_n [SEP]`` of ordinary ids (10..49), right-padded with 0."""
    g = torch.Generator().manual_seed(seed)
    B, T = len(lengths), max(lengths) + 2
    ids = torch.zeros(B, T, dtype=torch.long)
    for b, n in enumerate(lengths):
        ids[b, 0], ids[b, 1 : n + 1], ids[b, n + 1] = VOCAB.cls_id, torch.randint(10, 50, (n,), generator=g), VOCAB.sep_id
    is_padding = torch.arange(T)[None, :] >= torch.tensor(lengths)[:, None] + 2
    is_special = is_padding | (ids == VOCAB.cls_id) | (ids == VOCAB.sep_id)
    words = torch.where(is_special, -1, torch.arange(T).expand(B, T))
    documents = torch.where(is_padding, -1, torch.arange(B)[:, None])
    return objreg.TokenBatch(ids, is_padding, is_special, words, torch.where(is_special, -1, 0), documents)


def test_compact_matches_a_loop():
    g = torch.Generator().manual_seed(5)
    tokens = torch.randint(10, 50, (7, 12), generator=g)
    keep = torch.rand(7, 12, generator=g) < 0.4
    out, lengths = seq2seq.compact(tokens, keep, fill=-1)
    for b in range(7):
        kept = tokens[b][keep[b]].tolist()
        assert lengths[b] == len(kept)
        assert out[b].tolist() == kept + [-1] * (out.shape[1] - len(kept))
    assert out.shape[1] == max(1, int(keep.sum(dim=1).max()))


def test_sentinel_parts_spell_out_each_span():
    ids = torch.tensor([[2, 11, 12, 13, 14, 15, 16, 3, 0]])
    real = torch.tensor([[True] * 8 + [False]])
    noise = torch.tensor([[False, True, True, False, False, True, False, False, False]])
    source, slen, target, tlen = seq2seq.sentinel_parts(ids, real, noise, torch.tensor([5, 6, 7]), eos_id=8, pad_id=0)
    assert source[0, : slen[0]].tolist() == [2, 5, 13, 14, 6, 16, 3]
    assert target[0, : tlen[0]].tolist() == [5, 11, 12, 6, 15, 8]
    assert spans.count_spans(noise) == 2


def test_missing_sentinels_and_named_tokens_are_data_errors():
    with pytest.raises(objreg.DataError, match="needs 4 span sentinels for this batch but the vocabulary has 3"):
        seq2seq.sentinel_tensor(VOCAB, 4, "t5", torch.device("cpu"))
    assert seq2seq.sentinel_tensor(VOCAB, 3, "t5", torch.device("cpu")).tolist() == [5, 6, 7]
    with pytest.raises(objreg.DataError, match=r"ul2 needs the special token \[NLU\].*it has: \[EOS\]"):
        seq2seq.named_id(VOCAB, "[NLU]", "ul2")
    assert seq2seq.end_of_text_id(VOCAB) == 8
    no_eos = objreg.Vocabulary(size=20, pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4, special_ids=(0, 1, 2, 3, 4))
    assert seq2seq.end_of_text_id(no_eos) == 3


def two_rows() -> seq2seq.Parts:
    source = torch.tensor([[20, 21, 22, 0], [30, 31, 32, 33]])
    target = torch.tensor([[40, 41, 0], [50, 51, 52]])
    return source, torch.tensor([3, 4]), target, torch.tensor([2, 3])


def test_seq2seq_batch_layout_labels_and_mask_match_a_loop():
    cb = seq2seq.seq2seq_batch(two_rows(), torch.tensor([7, 9]), pad_id=0)
    assert cb.input_ids.tolist() == [[20, 21, 22, 40, 41, 0, 0], [30, 31, 32, 33, 50, 51, 52]]
    assert cb.is_padding.tolist() == [[False] * 5 + [True] * 2, [False] * 7]
    assert cb.document_ids.tolist() == [[7] * 5 + [-1] * 2, [9] * 7]
    assert cb.position_ids.tolist() == [list(range(7))] * 2
    # The last source token predicts the first target token; the last target token predicts nothing.
    assert cb.labels[0].tolist() == [IGNORE_INDEX] * 2 + [40, 41] + [IGNORE_INDEX] * 3
    assert cb.labels[1].tolist() == [IGNORE_INDEX] * 3 + [50, 51, 52, IGNORE_INDEX]
    assert cb.extras["target_positions"].tolist() == [[2, 3, 0], [3, 4, 5]]
    assert cb.extras["target_weights"].tolist() == [[1, 1, 0], [1, 1, 1]]
    described = seq2seq.attention(cb)
    assert isinstance(described, objreg.AttentionMask) and described.pattern == "prefix"
    mask = described.dense()
    for b, (n, p) in enumerate(((5, 3), (7, 4))):
        for i, j in itertools.product(range(7), range(7)):
            allowed = i < n and j < n and (j < p or j <= i)  # padding queries see nothing
            assert bool(mask[b, i, j]) == allowed, (b, i, j)


def test_choose_parts_picks_rows():
    a, b = two_rows(), tuple(t.flip(0) for t in two_rows())
    chosen = seq2seq.choose_parts(torch.tensor([True, False]), a, b, pad_id=0)
    assert chosen[0].tolist() == [[20, 21, 22, 0], [20, 21, 22, 0]]
    assert chosen[1].tolist() == [3, 3] and chosen[3].tolist() == [2, 2]


def test_seq2seq_loss_is_the_mean_target_nll():
    torch.manual_seed(0)
    cb = seq2seq.seq2seq_batch(two_rows(), torch.tensor([0, 1]), pad_id=0)
    head = nn.Linear(4, 60).double()
    hidden = torch.randn(2, cb.input_ids.shape[1], 4, dtype=torch.float64)
    model = types.SimpleNamespace(heads={"lm": head})
    loss = seq2seq.seq2seq_loss(objreg.ModelOutputs(hidden, model), cb)
    for b in range(2):
        terms = [-torch.log_softmax(head(hidden[b, t]), -1)[cb.labels[b, t]]
                 for t in range(cb.input_ids.shape[1]) if cb.labels[b, t] != IGNORE_INDEX]
        assert torch.allclose(loss[b], torch.stack(terms).mean())


def test_span_corruption_parts_are_t5_noise_in_the_sentinel_format():
    batch = framed_batch([12, 3, 7, 0], seed=1)
    parts = seq2seq.span_corruption_parts(batch, 0.3, 2.0, torch.Generator().manual_seed(2), VOCAB, "t5")
    g = torch.Generator().manual_seed(2)
    noise = spans.random_spans_noise_mask(maskable(batch), 0.3, 2.0, g)
    expected = seq2seq.sentinel_parts(batch.input_ids, ~batch.is_padding, noise, torch.tensor([5, 6, 7]), 8, 0)
    assert all(torch.equal(a, b) for a, b in zip(parts, expected))
    # Density 0 for a row (a tensor of per-row settings): its source is the row, its target only [EOS].
    parts = seq2seq.span_corruption_parts(batch, torch.tensor([0.3, 0.0, 0.0, 0.3], dtype=torch.float64),
                                          torch.full((4,), 2.0, dtype=torch.float64), torch.Generator(), VOCAB, "ul2")
    source, source_len, target, target_len = parts
    assert source[1, : source_len[1]].tolist() == batch.input_ids[1, :5].tolist()
    assert target[1, : target_len[1]].tolist() == [8]
    # 20 spans and 3 sentinels: the sentinels restart every 3 spans, in the source and the target alike.
    source, source_len, target, target_len = seq2seq.span_corruption_parts(
        framed_batch([40]), 0.5, 1.0, torch.Generator(), VOCAB, "ul2"
    )
    in_source = [t for t in source[0, : source_len[0]].tolist() if t in VOCAB.sentinel_ids]
    in_target = [t for t in target[0, : target_len[0]].tolist() if t in VOCAB.sentinel_ids]
    assert in_source == in_target == [5, 6, 7] * 6 + [5, 6]
    no_sentinels = objreg.Vocabulary(size=50, pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4,
                                     special_ids=tuple(range(10)), named_ids={"[EOS]": 8})
    with pytest.raises(objreg.DataError, match="ul2 needs span sentinels but the vocabulary declares none"):
        seq2seq.span_corruption_parts(framed_batch([40]), 0.5, 1.0, torch.Generator(), no_sentinels, "ul2")


def test_prefix_lm_parts_split_the_text_after_the_cls_token():
    lengths = [12, 3, 7, 1]
    batch = framed_batch(lengths, seed=3)
    source, source_len, target, target_len = seq2seq.prefix_lm_parts(batch, 0.5, torch.Generator().manual_seed(4), 0)
    k = spans.random_prefix_length(torch.tensor(lengths), 0.5, torch.Generator().manual_seed(4))
    for b, n in enumerate(lengths):
        row = batch.input_ids[b, : n + 2].tolist()
        assert source[b, : source_len[b]].tolist() == row[: 1 + int(k[b])]  # [CLS] and k text tokens
        assert target[b, : target_len[b]].tolist() == row[1 + int(k[b]) :]  # the rest, [SEP] included
        assert n < 2 or 1 <= int(k[b]) <= n - 1  # both sides keep text


def with_literal_special(batch: objreg.TokenBatch, row: int | slice, position: int) -> objreg.TokenBatch:
    """``batch`` with a special id written literally inside the text of row(s) ``row``."""
    ids, is_special = batch.input_ids.clone(), batch.is_special.clone()
    ids[row, position], is_special[row, position] = VOCAB.mask_id, True
    return batch._replace(input_ids=ids, is_special=is_special)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("layout", ["framed", "two leading specials", "literal special"])
def test_span_corruption_batch_is_parts_then_layout(seed, layout):
    """t5's layout from the spans (one block of candidates per row), and the token-by-token one
    it falls back to (a literal special inside the text), give the very batch of
    span_corruption_parts + seq2seq_batch: padding, empty rows, per-row densities, and rows with
    more spans than sentinels (reused in turn)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 60, (9,), generator=g).tolist()
    lengths[seed] = 40
    batch = framed_batch(lengths, seed=seed)
    if layout == "two leading specials":  # the block starts at position 2
        batch = with_literal_special(framed_batch([n + 1 for n in lengths], seed=seed), slice(None), 1)
    elif layout == "literal special":
        batch = with_literal_special(batch, seed, 20)
    assert (seq2seq.block_start(batch.is_padding, maskable(batch)) is None) == (layout == "literal special")
    for density, mean in ((0.15, 3.0), (0.5, 1.0), (torch.rand(9, generator=g).double() * 0.6, torch.full((9,), 2.0))):
        a, b = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
        direct = seq2seq.span_corruption_batch(batch, density, mean, a, VOCAB, "t5")
        parts = seq2seq.span_corruption_parts(batch, density, mean, b, VOCAB, "t5")
        expected = seq2seq.seq2seq_batch(parts, seq2seq.row_document(batch), VOCAB.pad_id)
        for field in ("input_ids", "labels", "is_padding", "position_ids", "document_ids"):
            assert torch.equal(getattr(direct, field), getattr(expected, field)), field
        assert direct.extras.keys() == expected.extras.keys()
        assert all(torch.equal(direct.extras[k], expected.extras[k]) for k in expected.extras)
        assert torch.equal(a.get_state(), b.get_state())


def test_sentinel_parts_match_a_loop_with_reused_sentinels():
    g = torch.Generator().manual_seed(4)
    B, T = 6, 30
    ids = torch.randint(10, 50, (B, T), generator=g)
    real = torch.arange(T)[None, :] < torch.randint(0, T + 1, (B,), generator=g)[:, None]
    noise = (torch.rand(B, T, generator=g) < 0.4) & real
    sentinels = torch.tensor([5, 6])
    source, source_len, target, target_len = seq2seq.sentinel_parts(ids, real, noise, sentinels, eos_id=8, pad_id=0)
    for b in range(B):
        src, tgt, k = [], [], 0
        for t in range(T):
            if not real[b, t]:
                continue
            if noise[b, t] and (t == 0 or not noise[b, t - 1]):
                src.append(int(sentinels[k % 2]))
                tgt.append(int(sentinels[k % 2]))
                k += 1
            if noise[b, t]:
                tgt.append(int(ids[b, t]))
            else:
                src.append(int(ids[b, t]))
        assert source[b, : source_len[b]].tolist() == src and target[b, : target_len[b]].tolist() == tgt + [8]
        assert bool((source[b, source_len[b]:] == 0).all()) and bool((target[b, target_len[b]:] == 0).all())


def test_block_start_finds_the_one_block_of_candidates_of_each_row():
    """Against a loop, in numpy (the CPU) and in torch (other devices) alike: the first candidate
    of each row, or None where a row's candidates are not one block or a real token follows padding."""
    import numpy as np

    from objreg.core.masks import padding_at_the_end

    g = torch.Generator().manual_seed(3)
    for trial in range(200):
        B, T = int(torch.randint(1, 6, (1,), generator=g)), int(torch.randint(1, 12, (1,), generator=g))
        length = torch.randint(0, T + 1, (B,), generator=g)
        padding = torch.arange(T)[None, :] >= length[:, None]
        if trial % 5 == 0:
            padding = torch.rand(B, T, generator=g) < 0.3  # padding anywhere
        lo = torch.randint(0, T + 1, (B,), generator=g)
        hi = lo + torch.randint(0, T + 1, (B,), generator=g)
        candidates = (torch.arange(T)[None, :] >= lo[:, None]) & (torch.arange(T)[None, :] < hi[:, None]) & ~padding
        if trial % 3 == 0:
            candidates &= torch.rand(B, T, generator=g) < 0.8  # holes
        expected = []
        for b in range(B):
            pad, cand = padding[b].tolist(), candidates[b].tolist()
            runs = sum(1 for t in range(T) if cand[t] and (t == 0 or not cand[t - 1]))
            if runs > 1 or any(pad[t] and not pad[t + 1] for t in range(T - 1)):
                expected = None
                break
            expected.append(cand.index(True) if runs else 0)
        got = seq2seq.block_start(padding, candidates)
        assert (got is None) == (expected is None)
        if expected is not None:
            assert got.tolist() == expected
        if padding_at_the_end(padding):  # the torch branch (other devices) and the numpy one, after that check
            other = seq2seq._block_start(candidates.to(torch.uint8), torch)
            assert (other is None) == (expected is None) and (other is None or other.tolist() == expected)
            numpy = seq2seq._block_start(candidates.numpy(), np)
            assert (numpy is None) == (expected is None) and (numpy is None or numpy.tolist() == expected)
