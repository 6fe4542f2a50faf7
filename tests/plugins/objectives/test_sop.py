"""Sentence-order prediction: split at a sentence boundary, swap, one extra [SEP], loss vs a loop."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import objreg
from objreg import IGNORE_INDEX

H = 8


@pytest.fixture
def batch(tokenizer, texts):
    return tokenizer.batch_from_texts(texts)


def candidates(ids: list[int], sentences: list[int], swapped: bool, cls: int, sep: int) -> list[list[int]]:
    """Every valid output for one row ``[CLS] body [SEP]``: one per sentence boundary."""
    out = []
    for p in range(2, len(ids) - 1):
        if sentences[p - 1] != sentences[p]:
            a, b = ids[1:p], ids[p:-1]
            first, second = (b, a) if swapped else (a, b)
            out.append([cls, *first, sep, *second, sep])
    return out


def test_rows_are_split_at_a_sentence_boundary_and_maybe_swapped(registry, tokenizer, batch):
    v = tokenizer.vocab
    cb = registry.get("sop", vocab=v).corrupt(batch, torch.Generator().manual_seed(0))
    B, T = batch.input_ids.shape
    assert cb.input_ids.shape == (B, T + 1)
    labels = cb.extras["order_label"]
    assert labels.dtype == torch.long and set(labels.tolist()) == {0, 1}  # both kinds occur in this batch
    for b in range(B):
        n = int((~batch.is_padding[b]).sum())
        ids, sentences = batch.input_ids[b, :n].tolist(), batch.sentence_ids[b, :n].tolist()
        row = cb.input_ids[b, : n + 1].tolist()
        assert row in candidates(ids, sentences, bool(labels[b]), v.cls_id, v.sep_id), b
        assert (cb.input_ids[b, n + 1 :] == v.pad_id).all()
        assert cb.is_padding[b].tolist() == [j > n for j in range(T + 1)]
        assert cb.document_ids[b].tolist() == [b if j <= n else -1 for j in range(T + 1)]
    assert (cb.labels == IGNORE_INDEX).all()
    assert torch.equal(cb.position_ids, torch.arange(T + 1).expand(B, T + 1))
    assert set(cb.extras) == {"order_label"}  # no segment_ids: no model reads them


def within_4_sigma(count: float, n: float, p: float) -> bool:
    return abs(count - n * p) <= 4 * math.sqrt(n * p * (1 - p)) + 1e-9


@pytest.mark.parametrize("swap_prob", [0.5, 0.2, 0.0, 1.0])
def test_label_rate_and_uniform_split(registry, tokenizer, batch, swap_prob):
    big = batch.select(torch.arange(batch.batch_size).repeat(400))  # 2400 rows
    cb = registry.get("sop", vocab=tokenizer.vocab, swap_prob=swap_prob).corrupt(big, torch.Generator().manual_seed(1))
    B = big.batch_size
    assert within_4_sigma(int(cb.extras["order_label"].sum()), B, swap_prob)
    # Rows with three sentences have two boundaries, each chosen half of the time: in an unswapped
    # row the split is after sentence 0 when the middle [SEP] directly follows sentence 0.
    rows = (big.sentence_ids.max(dim=1).values == 2) & (cb.extras["order_label"] == 0)
    if rows.sum() > 100:
        middle_sep = (cb.input_ids == tokenizer.vocab.sep_id).long().argmax(dim=1)  # (B,)
        after_first = middle_sep == (big.sentence_ids == 0).sum(dim=1) + 1
        assert within_4_sigma(int((after_first & rows).sum()), int(rows.sum()), 0.5)


def test_one_sentence_row_is_an_error(registry, tokenizer, texts):
    batch = tokenizer.batch_from_texts([texts[0], "Only one sentence here."])
    with pytest.raises(objreg.DataError, match="sop needs at least 2 sentences in each row; row 1 has 1"):
        registry.get("sop", vocab=tokenizer.vocab).corrupt(batch, torch.Generator().manual_seed(0))


def test_packed_row_is_an_error(registry, tokenizer, batch):
    docs = batch.document_ids.clone()
    docs[2, 5:] = torch.where(batch.is_padding[2, 5:], -1, 99)
    with pytest.raises(objreg.DataError, match="row 2"):
        registry.get("sop", vocab=tokenizer.vocab).corrupt(batch._replace(document_ids=docs), torch.Generator())


def test_loss_equals_a_per_example_loop(registry, tokenizer, batch, stand_in_model):
    objective = registry.get("sop", vocab=tokenizer.vocab)
    cb = objective.corrupt(batch, torch.Generator().manual_seed(2))
    model = stand_in_model("order", H, 2, first_token=True)
    hidden = torch.randn(*cb.input_ids.shape, H, dtype=torch.float64)
    loss = objective.loss(objreg.ModelOutputs(hidden, model), cb)
    head = model.heads["order"].linear
    expected = torch.stack([F.cross_entropy(head(hidden[b, 0]), cb.extras["order_label"][b])
                            for b in range(cb.batch_size)])
    torch.testing.assert_close(loss, expected)


def test_same_seed_same_output_other_seed_differs(registry, tokenizer, batch):
    big = batch.select(torch.arange(batch.batch_size).repeat(10))
    objective = registry.get("sop", vocab=tokenizer.vocab)
    a, b, c = (objective.corrupt(big, torch.Generator().manual_seed(s)) for s in (5, 5, 6))
    assert all(torch.equal(x, y) for x, y in zip(a[:5], b[:5]))
    assert all(torch.equal(a.extras[k], b.extras[k]) for k in a.extras)
    assert not torch.equal(a.input_ids, c.input_ids)


def test_registry_handle_runs_end_to_end(registry, tokenizer, batch, stand_in_model):
    objective = registry.get("sop", vocab=tokenizer.vocab)
    assert objective.info.min_sentences == 2 and objective.info.heads[0].num_outputs == 2
    cb = objective.corrupt(batch, torch.Generator().manual_seed(0))
    B, T = cb.input_ids.shape
    described = objective.attention(cb)
    assert isinstance(described, objreg.AttentionMask) and described.pattern == "bidirectional"
    mask = objective.attention_mask(cb)
    assert mask.shape == (B, T, T) and mask.dtype == torch.bool
    real = ~cb.is_padding
    assert torch.equal(mask, real[:, :, None] & real[:, None, :])  # bidirectional over real tokens
    hidden = torch.randn(B, T, H, dtype=torch.float64)
    loss = objective.loss(objreg.ModelOutputs(hidden, stand_in_model("order", H, 2, first_token=True)), cb)
    assert loss.shape == (B,) and torch.isfinite(loss).all()
