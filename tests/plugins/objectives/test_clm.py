"""Causal LM: shifted labels, padding by position, per-document causal mask, loss vs a loop."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import objreg
from objreg import IGNORE_INDEX
from objreg.plugins.objectives import clm

H = 8


@pytest.fixture(scope="module")
def objective(tokenizer):
    return objreg.Registry.load(load_entrypoints=False).get("clm", vocab=tokenizer.vocab)


@pytest.fixture
def batch(tokenizer, texts):
    return tokenizer.batch_from_texts(texts)


def hand_batch(ids, is_padding, document_ids) -> objreg.TokenBatch:
    ids = torch.tensor(ids)
    is_padding = torch.tensor(is_padding)
    minus = torch.full_like(ids, -1)
    return objreg.TokenBatch(ids, is_padding, is_padding.clone(), minus, minus.clone(), torch.tensor(document_ids))


def test_labels_are_the_next_real_token(objective, batch, generator):
    cb = objective.corrupt(batch, generator)
    assert torch.equal(cb.input_ids, batch.input_ids)
    for b in range(batch.batch_size):
        n = int((~batch.is_padding[b]).sum())
        expected = torch.full_like(batch.input_ids[b], IGNORE_INDEX)
        expected[: n - 1] = batch.input_ids[b, 1:n]
        assert torch.equal(cb.labels[b], expected), b
    assert cb.extras == {}
    assert torch.equal(cb.document_ids, batch.document_ids)
    assert torch.equal(cb.position_ids[0, :5], torch.arange(5))


def test_end_of_text_equal_to_pad_stays_in_the_loss():
    # Id 2 is both the pad and the end-of-text id: position 3 is a real end-of-text token,
    # positions 4 and 5 are padding. Masking by id (HF #23530) would drop the label 2 below.
    batch = hand_batch([[10, 11, 12, 2, 2, 2]], [[False, False, False, False, True, True]], [[0, 0, 0, 0, -1, -1]])
    cb = clm.objreg_corrupt(batch=batch)
    assert cb.labels.tolist() == [[11, 12, 2, IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX]]


def test_packed_documents_do_not_predict_or_see_each_other(objective):
    batch = hand_batch([[10, 11, 12, 13, 14, 0]], [[False] * 5 + [True]], [[0, 0, 0, 1, 1, -1]])
    cb = clm.objreg_corrupt(batch=batch)
    # Token 12 ends document 0: it does not predict 13, the first token of document 1.
    assert cb.labels.tolist() == [[11, 12, IGNORE_INDEX, 14, IGNORE_INDEX, IGNORE_INDEX]]
    assert cb.position_ids[0, :5].tolist() == [0, 1, 2, 0, 1]
    described = objective.attention(cb)  # the host's, from the declared causal pattern
    assert isinstance(described, objreg.AttentionMask) and described.pattern == "causal"
    mask = described.dense()
    docs = [0, 0, 0, 1, 1, -1]
    expected = torch.tensor([[j <= i and docs[i] == docs[j] and docs[j] >= 0 for j in range(6)] for i in range(6)])
    assert torch.equal(mask[0], expected)
    assert mask.dtype == torch.bool and mask.shape == (1, 6, 6)


def test_loss_equals_a_per_example_loop(objective, batch, generator, tokenizer, stand_in_model):
    cb = objective.corrupt(batch, generator)
    model = stand_in_model("lm", H, tokenizer.vocab.size)
    hidden = torch.randn(*cb.input_ids.shape, H, dtype=torch.float64, generator=generator)
    loss = objective.loss(objreg.ModelOutputs(hidden, model), cb)
    expected = torch.stack([
        F.cross_entropy(model.heads["lm"](hidden[b]), cb.labels[b], ignore_index=IGNORE_INDEX)
        for b in range(cb.batch_size)
    ])
    assert loss.shape == (cb.batch_size,)
    torch.testing.assert_close(loss, expected)


def test_row_without_labels_has_zero_loss(tokenizer, stand_in_model):
    batch = hand_batch([[10, 11, 12], [10, 0, 0]], [[False] * 3, [False, True, True]], [[0, 0, 0], [1, -1, -1]])
    cb = clm.objreg_corrupt(batch=batch)
    model = stand_in_model("lm", H, tokenizer.vocab.size)
    loss = clm.objreg_loss(outputs=objreg.ModelOutputs(torch.randn(2, 3, H, dtype=torch.float64), model), batch=cb)
    assert torch.isfinite(loss).all() and loss[1] == 0


def test_corrupt_uses_no_randomness(objective, batch):
    generator = torch.Generator().manual_seed(1)
    state = generator.get_state()
    first = objective.corrupt(batch, generator)
    second = objective.corrupt(batch, torch.Generator().manual_seed(2))
    assert torch.equal(generator.get_state(), state)
    assert all(torch.equal(a, b) for a, b in zip(first[:5], second[:5]))


def test_registry_handle_runs_end_to_end(objective, batch, generator, tokenizer, stand_in_model):
    assert objective.info.attention == "causal"
    cb = objective.corrupt(batch, generator)
    mask = objective.attention_mask(cb)
    B, T = cb.input_ids.shape
    assert mask.shape == (B, T, T) and mask.dtype == torch.bool
    assert not mask.triu(diagonal=1).any()
    hidden = torch.randn(B, T, H, dtype=torch.float64)
    loss = objective.loss(objreg.ModelOutputs(hidden, stand_in_model("lm", H, tokenizer.vocab.size)), cb)
    assert loss.shape == (B,) and torch.isfinite(loss).all()
