"""T5 span corruption: exact counts, sentinel order, exact reconstruction, literal 0 ids, spans that
do not always end the row, padding, the prefix-LM mask."""

from __future__ import annotations

import math

import pytest
import torch

import objreg
from objreg import IGNORE_INDEX
from objreg.toolkit import spans

# 0..79 special: the BERT five, 64 sentinels (5..68), [EOS] = 69; 80..199 ordinary.
SENTINELS = tuple(range(5, 69))
VOCAB = objreg.Vocabulary(size=200, pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4, special_ids=tuple(range(80)),
                          sentinel_ids=SENTINELS, named_ids={"[EOS]": 69})
EOS = 69


def split_row(cb: objreg.CorruptedBatch, b: int) -> tuple[list[int], list[int]]:
    """(source, target) token lists of row ``b``."""
    p = int(cb.extras["prefix_length"][b])
    real = cb.input_ids[b][~cb.is_padding[b]].tolist()
    return real[:p], real[p:]


def reconstruct(source: list[int], target: list[int], sentinels=SENTINELS, eos=EOS) -> list[int]:
    """Put the ``k``-th span of the target back in place of the ``k``-th sentinel of the source (a
    plain loop; pairing by order holds also where a long row reuses the sentinels)."""
    assert target[-1] == eos
    sentinels = set(sentinels)
    pieces: list[list[int]] = []  # [sentinel, span tokens...]
    for token in target[:-1]:
        if token in sentinels:
            pieces.append([token])
        else:
            pieces[-1].append(token)  # IndexError: a target that does not start with a sentinel
    out, k = [], 0
    for token in source:
        if token in sentinels:
            assert pieces[k][0] == token, "the k-th sentinels of source and target differ"
            out += pieces[k][1:]
            k += 1
        else:
            out.append(token)
    assert k == len(pieces), "a target span whose sentinel is not in the source"
    return out


def corrupt(registry, batch, seed=0, vocab=VOCAB, **params):
    return registry.get("t5", vocab=vocab, **params).corrupt(batch, torch.Generator().manual_seed(seed))


def test_defaults_are_t5s(registry):
    assert registry.info("t5").defaults() == {"noise_density": 0.15, "mean_noise_span_length": 3.0}
    assert registry.info("t5").attention == "prefix"


def test_exact_counts_sentinels_and_reconstruction_per_row(registry, synthetic_batch):
    lengths = [0, 1, 2, 3, 5, 17, 40, 60, 126, 126]
    batch = synthetic_batch(VOCAB, lengths, seed=1)
    cb = corrupt(registry, batch)
    num_noise, num_spans = spans.noise_counts(torch.tensor(lengths), 0.15, 3.0)
    for b, n in enumerate(lengths):
        source, target = split_row(cb, b)
        original = batch.input_ids[b][~batch.is_padding[b]].tolist()
        k, noise = int(num_spans[b]), int(num_noise[b])
        # The first span gets the first sentinel, then consecutive ones, in source and target alike.
        assert [t for t in source if t in SENTINELS] == list(SENTINELS[:k])
        assert [t for t in target if t in SENTINELS] == list(SENTINELS[:k])
        assert target[0] == (SENTINELS[0] if k else EOS)
        assert len(target) == noise + k + 1 and len(source) == n + 2 - noise + k
        assert source[0] == VOCAB.cls_id and source[-1] == VOCAB.sep_id  # special tokens stay
        assert reconstruct(source, target) == original, b


def test_labels_are_the_next_token_over_the_target_only(registry, synthetic_batch):
    batch = synthetic_batch(VOCAB, [30, 12, 50], seed=2)
    cb = corrupt(registry, batch)
    for b in range(3):
        p = int(cb.extras["prefix_length"][b])
        n = int((~cb.is_padding[b]).sum())
        expected = [int(cb.input_ids[b, t + 1]) if p - 1 <= t < n - 1 else IGNORE_INDEX
                    for t in range(cb.input_ids.shape[1])]
        assert cb.labels[b].tolist() == expected


def test_a_literal_zero_id_in_the_text_is_kept(registry, synthetic_batch):
    """Id 0 (the pad id) as real text, once as an ordinary token (a tokenizer where 0 is a word)
    and once flagged special (a literal "[PAD]" in the text): nothing is dropped or misplaced."""
    batch = synthetic_batch(VOCAB, [40, 40, 25], T=44, seed=3)
    ids, is_special = batch.input_ids.clone(), batch.is_special.clone()
    ids[0, 5:30:3] = 0  # ordinary zeros
    ids[1, 10] = 0
    is_special[1, 10] = True  # a literal [PAD]: special, so never noise, but not padding
    batch = batch._replace(input_ids=ids, is_special=is_special)
    for seed in range(20):
        cb = corrupt(registry, batch, seed=seed, noise_density=0.3)
        for b in range(3):
            original = batch.input_ids[b][~batch.is_padding[b]].tolist()
            assert reconstruct(*split_row(cb, b)) == original, (seed, b)
        source, _ = split_row(cb, 1)
        assert source.count(0) == 1  # the literal [PAD] stays in the input
        assert int((~cb.is_padding[0]).sum()) == 42 + 2 * len([t for t in split_row(cb, 0)[0] if t in SENTINELS]) + 1


def test_literal_pad_text_through_the_tokenizer(registry, tokenizer):
    batch = tokenizer.batch_from_texts(["The committee met [PAD] on Tuesday and approved the budget [PAD] today."])
    assert int((batch.input_ids[0] == tokenizer.vocab.pad_id).sum()) == 2
    cb = registry.get("t5", vocab=tokenizer.vocab, noise_density=0.5).corrupt(batch, torch.Generator().manual_seed(0))
    sentinels, eos = tokenizer.vocab.sentinel_ids, tokenizer.vocab.named_ids["[EOS]"]
    p = int(cb.extras["prefix_length"][0])
    real = cb.input_ids[0][~cb.is_padding[0]].tolist()
    source, target = real[:p], real[p:]
    assert reconstruct(source, target, sentinels, eos) == batch.input_ids[0].tolist()


def test_spans_do_not_always_end_the_row(registry, synthetic_batch):
    """n = 40: 6 noise tokens in 2 spans and 34 non-noise tokens. T5 without random_roll ends
    every row with noise; here P(last token noise) = spans / (non-noise + 1) = 2/35."""
    N = 3000
    batch = synthetic_batch(VOCAB, [40] * N, seed=4)
    cb = corrupt(registry, batch, seed=5)
    last_is_noise = 0
    first_is_noise = 0
    for b in range(N):
        source, _ = split_row(cb, b)
        last_is_noise += source[-2] in SENTINELS  # source ends "... x_n [SEP]" unless x_n is noise
        first_is_noise += source[1] in SENTINELS
    p = 2 / 35
    for count in (last_is_noise, first_is_noise):
        assert abs(count - N * p) <= 4 * math.sqrt(N * p * (1 - p)), count
        assert count < 0.2 * N


def test_padding_rows_of_different_lengths(registry, synthetic_batch):
    batch = synthetic_batch(VOCAB, [3, 50, 20, 0], T=60, seed=6)
    cb = corrupt(registry, batch)
    assert registry.get("t5", vocab=VOCAB).attention(cb).pattern == "prefix"
    mask = registry.get("t5", vocab=VOCAB).attention_mask(cb)
    B, W = cb.input_ids.shape
    total = (~cb.is_padding).sum(dim=1)
    assert W == int(total.max())
    for b in range(B):
        n = int(total[b])
        assert cb.is_padding[b].tolist() == [j >= n for j in range(W)]
        assert (cb.input_ids[b, n:] == VOCAB.pad_id).all() and (cb.document_ids[b, n:] == -1).all()
        assert (cb.document_ids[b, :n] == b).all() and (cb.labels[b, n - 1:] == IGNORE_INDEX).all()
        p = int(cb.extras["prefix_length"][b])
        for i in range(W):
            expected = [i < n and j < n and (j < p or j <= i) for j in range(W)]
            assert mask[b, i].tolist() == expected, (b, i)


def test_deterministic_for_a_seed(registry, synthetic_batch):
    batch = synthetic_batch(VOCAB, [30, 60, 45], seed=7)
    a, b, c = corrupt(registry, batch, seed=1), corrupt(registry, batch, seed=1), corrupt(registry, batch, seed=2)
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.labels, b.labels)
    assert not torch.equal(a.input_ids, c.input_ids)


def test_long_rows_reuse_the_sentinels_in_turn(registry, synthetic_batch):
    few = objreg.Vocabulary(size=200, pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4,
                            special_ids=tuple(range(80)), sentinel_ids=(5, 6), named_ids={"[EOS]": 69})
    batch = synthetic_batch(VOCAB, [126, 40], seed=8)  # 19 noise tokens in 6 spans; 6 in 2
    cb = corrupt(registry, batch, vocab=few)
    for b in range(2):
        source, target = split_row(cb, b)
        spans_in_source = [t for t in source if t in (5, 6)]
        assert spans_in_source == [t for t in target if t in (5, 6)] == [5, 6] * (len(spans_in_source) // 2)
        # Paired by order (the k-th sentinel of the source with the k-th of the target), the row comes back.
        assert reconstruct(source, target, (5, 6)) == batch.input_ids[b][~batch.is_padding[b]].tolist()
    assert spans_in_source and len([t for t in split_row(cb, 0)[0] if t in (5, 6)]) == 6


@pytest.mark.parametrize("T", [2048, 8192])
def test_pretraining_lengths_cycle_the_64_sentinels_and_reconstruct(registry, T, synthetic_batch):
    """At T=2,048 and 8,192 a row has 102 and 409 spans for 64 sentinels: span k gets sentinel
    k mod 64 in source and target, every id and label is valid, and the row comes back."""
    lengths = [T - 2, T // 3]
    batch = synthetic_batch(VOCAB, lengths, seed=9)
    cb = corrupt(registry, batch)
    num_noise, num_spans = spans.noise_counts(torch.tensor(lengths), 0.15, 3.0)
    assert int(num_spans[0]) > len(SENTINELS)
    assert bool(((cb.input_ids >= 0) & (cb.input_ids < VOCAB.size)).all())
    assert bool(((cb.labels == IGNORE_INDEX) | ((cb.labels >= 0) & (cb.labels < VOCAB.size))).all())
    for b in range(2):
        source, target = split_row(cb, b)
        k, noise = int(num_spans[b]), int(num_noise[b])
        cycled = [SENTINELS[i % len(SENTINELS)] for i in range(k)]
        assert [t for t in source if t in SENTINELS] == cycled == [t for t in target if t in SENTINELS]
        assert len(target) == noise + k + 1
        assert reconstruct(source, target) == batch.input_ids[b][~batch.is_padding[b]].tolist()
        # The labels are the target, read from the last source token on.
        assert cb.labels[b][len(source) - 1 : len(source) + len(target) - 1].tolist() == target


def test_no_sentinels_at_all_is_a_clear_error(registry, synthetic_batch):
    none = objreg.Vocabulary(size=200, pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4,
                             special_ids=tuple(range(80)))
    with pytest.raises(objreg.DataError, match=r"^t5 needs span sentinels \(<extra_id_0>.*add_tokens"):
        corrupt(registry, synthetic_batch(VOCAB, [126], seed=8), vocab=none)  # refused when created, before corrupting
