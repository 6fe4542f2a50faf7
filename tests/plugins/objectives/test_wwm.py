"""Whole-word masking: whole words for any tokenizer, BERT's greedy token budget, 80/10/10 per token."""

from __future__ import annotations

import math

import pytest
import torch

import objreg
from objreg import IGNORE_INDEX
from objreg.testing import check_objective_contract
from objreg.toolkit import selection
from objreg.toolkit.wordpiece import train_wordpiece

# 0..4 special ([PAD] [UNK] [CLS] [SEP] [MASK]), 5..9 more specials (sentinels), 10..59 ordinary.
VOCAB = objreg.Vocabulary(size=60, pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4, special_ids=tuple(range(10)))


def sentencepiece_batch(B: int, T: int, seed: int = 0) -> objreg.TokenBatch:
    """Rows built by hand the way a SentencePiece or byte-level BPE tokenizer reports them: no ``##``
    anywhere, words of one or more pieces (mean 2.5) whose word ids are arbitrary labels (not 0, 1,
    2, ...), a literal special token now and then, random lengths and padding."""
    g = torch.Generator().manual_seed(seed)
    starts_word = torch.rand(B, T, generator=g) < 0.4
    word_of_token = starts_word.long().cumsum(dim=1)  # (B, T)
    labels = torch.randint(1000, 9000, (B, T + 1), generator=g).gather(1, word_of_token)  # arbitrary id per word
    ids = torch.randint(10, 60, (B, T), generator=g)
    literal_special = torch.rand(B, T, generator=g) < 0.03
    ids = torch.where(literal_special, torch.randint(5, 10, (B, T), generator=g), ids)
    length = torch.randint(T // 2, T + 1, (B, 1), generator=g)
    index = torch.arange(T)[None, :]
    ids[:, 0] = VOCAB.cls_id
    ids = torch.where(index == length - 1, VOCAB.sep_id, ids)
    padding = index >= length
    ids = torch.where(padding, VOCAB.pad_id, ids)
    special = torch.isin(ids, VOCAB.special_id_tensor()) | padding
    words = torch.where(special, -1, labels)
    return objreg.TokenBatch(ids, padding, special, words, torch.where(special, -1, 0), torch.where(padding, -1, 0))


def selected_mask(cb: objreg.CorruptedBatch) -> torch.Tensor:
    return cb.labels != IGNORE_INDEX


def assert_whole_words(batch: objreg.TokenBatch, selected: torch.Tensor) -> None:
    """Every word (maximal run of one word id between maskable tokens) is all in or all out."""
    w = selection.words(batch)
    count = torch.zeros(w.size.shape[0], w.size.shape[1] + 1, dtype=torch.long)
    count.scatter_add_(1, torch.where(w.index >= 0, w.index, w.size.shape[1]), selected.long())
    count = count[:, :-1]
    assert ((count == 0) | (count == w.size)).all()
    assert not (selected & batch.is_special).any()


def test_whole_words_for_a_tokenizer_without_wordpiece_prefixes(registry):
    batch = sentencepiece_batch(256, 48)
    cb = registry.get("wwm", vocab=VOCAB).corrupt(batch, torch.Generator().manual_seed(0))
    selected = selected_mask(cb)
    assert_whole_words(batch, selected)
    # Multi-piece words are masked, not only single tokens (token-level masking would split them).
    w = selection.words(batch)
    sizes = selection.per_token(w.size, w)
    assert (selected & (sizes >= 3)).sum() > 100


def test_whole_words_with_a_real_wordpiece_tokenizer(registry, texts):
    tokenizer = train_wordpiece(texts * 20, vocab_size=120, name="small")  # small: many ## pieces
    batch = tokenizer.batch_from_texts(texts * 20)
    cb = registry.get("wwm", vocab=tokenizer.vocab).corrupt(batch, torch.Generator().manual_seed(1))
    selected = selected_mask(cb)
    assert_whole_words(batch, selected)
    pieces = tokenizer.tokens(batch.input_ids[selected])
    assert any(p.startswith("##") for p in pieces)  # continuation pieces come with their word
    for b in range(batch.batch_size):  # and never alone: the piece before a selected "##" is selected
        for t in torch.nonzero(selected[b]).flatten().tolist():
            if tokenizer.tokens([batch.input_ids[b, t]])[0].startswith("##"):
                assert selected[b, t - 1]


def test_greedy_budget_of_google_bert(registry):
    batch = sentencepiece_batch(512, 64, seed=2)
    cb = registry.get("wwm", vocab=VOCAB).corrupt(batch, torch.Generator().manual_seed(3))
    selected = selected_mask(cb)
    n = (~batch.is_special).sum(dim=1)
    budget = torch.where(n > 0, (n.double() * 0.15).round().long().clamp(min=1), 0)
    taken = selected.sum(dim=1)
    assert (taken <= budget).all()
    # Greedy completeness: no word left out would still have fitted into what is left.
    w = selection.words(batch)
    chosen = torch.zeros(w.size.shape[0], w.size.shape[1] + 1, dtype=torch.long)
    chosen = chosen.scatter_add(1, torch.where(w.index >= 0, w.index, w.size.shape[1]), selected.long())[:, :-1] > 0
    valid = torch.arange(w.size.shape[1])[None, :] < w.count[:, None]
    left = (budget - taken)[:, None]
    assert not (valid & ~chosen & (w.size <= left)).any()
    # Hence ~mask_prob of the tokens, not ~mask_prob of the words (mean word here: 2.5 tokens).
    assert abs(float(taken.sum() / n.sum()) - 0.15) < 0.01


def test_replacement_is_decided_per_token(registry):
    batch = sentencepiece_batch(512, 64, seed=4)
    cb = registry.get("wwm", vocab=VOCAB).corrupt(batch, torch.Generator().manual_seed(5))
    selected = selected_mask(cb)
    new = cb.input_ids[selected]
    N = int(selected.sum())
    assert torch.isin(new, torch.cat([torch.arange(10, 60), torch.tensor([VOCAB.mask_id])])).all()
    masked = cb.input_ids == VOCAB.mask_id
    assert abs(int(masked.sum()) - 0.8 * N) <= 4 * math.sqrt(N * 0.16)
    # Two neighbouring pieces of one selected word are both [MASK] with probability 0.8^2 = 0.64
    # when each piece draws its own fate (0.8 if the word drew one fate for all).
    w = selection.words(batch)
    pair = selected[:, 1:] & selected[:, :-1] & (w.index[:, 1:] == w.index[:, :-1]) & (w.index[:, 1:] >= 0)
    M = int(pair.sum())
    both = int((pair & masked[:, 1:] & masked[:, :-1]).sum())
    assert abs(both - 0.64 * M) <= 4 * math.sqrt(M * 0.64 * 0.36), (both, M)


def test_seeded_and_input_untouched(registry):
    batch = sentencepiece_batch(32, 32, seed=6)
    objective = registry.get("wwm", vocab=VOCAB)
    a, b, c = (objective.corrupt(batch, torch.Generator().manual_seed(s)) for s in (7, 7, 8))
    assert all(torch.equal(x, y) for x, y in zip(a[:5], b[:5]))
    assert not torch.equal(a.labels, c.labels)
    assert torch.equal(batch.input_ids, sentencepiece_batch(32, 32, seed=6).input_ids)


def test_row_with_nothing_to_mask(registry):
    batch = sentencepiece_batch(2, 40, seed=9)
    empty = torch.tensor([VOCAB.cls_id, VOCAB.sep_id] + [VOCAB.pad_id] * 38)
    padding = torch.arange(40) >= 2
    batch = batch._replace(
        input_ids=torch.stack([batch.input_ids[0], empty]),
        is_padding=torch.stack([batch.is_padding[0], padding]),
        is_special=torch.stack([batch.is_special[0], torch.ones(40, dtype=torch.bool)]),
        word_ids=torch.stack([batch.word_ids[0], torch.full((40,), -1)]),
    )
    cb = registry.get("wwm", vocab=VOCAB).corrupt(batch, torch.Generator().manual_seed(0))
    assert not selected_mask(cb)[1].any() and selected_mask(cb)[0].any()


def test_parameter_validation(registry):
    with pytest.raises(objreg.InvalidParameterError, match="mask_replace_prob.*random_replace_prob"):
        registry.get("wwm", vocab=VOCAB, mask_replace_prob=0.9, random_replace_prob=0.2)
    with pytest.raises(objreg.InvalidParameterError, match="label_smoothing"):
        registry.get("wwm", vocab=VOCAB, label_smoothing=1.5)


def test_keeps_the_contract_with_label_smoothing_and_consistency():
    passed = check_objective_contract("wwm", params={"label_smoothing": 0.1, "consistency_weight": 0.5,
                                                     "mask_prob": 0.3})
    assert "per-sample dots by jvp equal the per-example loop" in passed
