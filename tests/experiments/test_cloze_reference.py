"""The count-based cloze reference against counts taken by a loop over the rows."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from scipy import stats

import objreg
from objreg.experiments.cloze_reference import ClozeCounts, neighbours


@pytest.fixture(scope="module")
def counted(tokenizer, texts):
    corpus = objreg.Corpus("tiny", tuple(tuple(objreg.split_sentences(t)) for t in texts * 2))
    rows = objreg.TokenizedCorpus(tokenizer, corpus, 32)
    assembled = tokenizer.assemble(rows.chunks, 32)
    ordinary = set(torch.nonzero(tokenizer.vocab.normal_token_weights() > 0).flatten().tolist())
    context, left, unigram = Counter(), Counter(), Counter()
    for ids, padding in zip(assembled.input_ids.tolist(), assembled.is_padding.tolist()):
        real = [i for i, p in zip(ids, padding) if not p]
        for t in range(1, len(real) - 1):
            if real[t] in ordinary:
                context[(real[t - 1], real[t + 1], real[t])] += 1
                left[(real[t - 1], real[t])] += 1
                unigram[real[t]] += 1
    return ClozeCounts(rows), context, left, unigram, ordinary


def _level(counter, prefix):
    return {key[-1]: n for key, n in counter.items() if key[:-1] == prefix}


def test_the_levels_are_the_counts_of_a_loop(counted):
    reference, context, left, unigram, _ = counted
    for a, b, _w in list(context)[:40]:
        levels = reference.candidates(a, b)
        assert dict(zip(levels[0][0].tolist(), levels[0][1].tolist())) == _level(context, (a, b))
        assert dict(zip(levels[1][0].tolist(), levels[1][1].tolist())) == _level(left, (a,))
        assert dict(zip(levels[2][0].tolist(), levels[2][1].tolist())) == dict(unigram)
        seen = _level(context, (a, b))
        assert reference.top1(a, b) == min(seen, key=lambda w: (-seen[w], w))
    assert reference.unigram_top1() == min(unigram, key=lambda w: (-unigram[w], w))


def test_an_unseen_context_backs_off_to_the_left_neighbour_then_the_unigram(counted, tokenizer):
    reference, context, left, unigram, _ = counted
    a = next(iter(left))[0]
    unseen_right = tokenizer.vocab.mask_id  # [MASK] never stands in the counted rows
    assert len(reference.candidates(a, unseen_right)[0][0]) == 0
    after = _level(left, (a,))
    assert reference.top1(a, unseen_right) == min(after, key=lambda w: (-after[w], w))
    assert reference.top1(tokenizer.vocab.mask_id, unseen_right) == reference.unigram_top1()


def test_samples_follow_the_counts_without_the_original(counted):
    reference, context, _, _, _ = counted
    (a, b), seen = max(((key[:2], _level(context, key[:2])) for key in context), key=lambda item: len(item[1]))
    assert len(seen) >= 3
    original = max(seen, key=seen.get)
    generator = torch.Generator().manual_seed(0)
    draws = Counter(reference.sample(a, b, original, generator) for _ in range(3000))
    assert original not in draws and set(draws) <= set(seen)
    others = sorted(w for w in seen if w != original)
    total = sum(seen[w] for w in others)
    expected = [3000 * seen[w] / total for w in others]
    assert stats.chisquare([draws[w] for w in others], expected).pvalue > 1e-3


def test_neighbours_read_the_clean_row(tokenizer):
    clean = torch.tensor([[2, 10, 11, 12, 3]])
    assert neighbours(clean, tokenizer.vocab, 0, 2) == (10, 12)
    assert neighbours(clean, tokenizer.vocab, 0, 4) == (12, tokenizer.vocab.pad_id)
