"""Masked LM: selection and 80/10/10 statistics, special tokens, fixed-size position lists, loss."""

from __future__ import annotations

import math
import types

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import objreg
from objreg import IGNORE_INDEX
from objreg.testing import check_objective_contract

H = 8
# A vocabulary where most ids are special: 0..39 special, 40..59 ordinary.
VOCAB = objreg.Vocabulary(size=60, pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4, special_ids=tuple(range(40)))
NORMAL = torch.arange(40, 60)


def batch_with_specials_in_text(B: int, T: int, seed: int = 0) -> objreg.TokenBatch:
    """Rows ``[CLS] ... [SEP]`` + padding of random lengths; ordinary tokens with ~10% special ids
    (sentinels, ``[UNK]`` ...) mixed into the text, which must never be selected."""
    g = torch.Generator().manual_seed(seed)
    length = torch.randint(T // 2, T + 1, (B, 1), generator=g)
    index = torch.arange(T)[None, :]
    ids = torch.randint(40, 60, (B, T), generator=g)
    in_text_special = torch.rand(B, T, generator=g) < 0.1
    ids = torch.where(in_text_special, torch.randint(5, 40, (B, T), generator=g), ids)
    ids[:, 0] = VOCAB.cls_id
    ids = torch.where(index == length - 1, VOCAB.sep_id, ids)
    is_padding = index >= length
    ids = torch.where(is_padding, VOCAB.pad_id, ids)
    is_special = torch.isin(ids, VOCAB.special_id_tensor()) | is_padding
    rows = torch.arange(B)[:, None].expand(B, T)
    words = torch.where(is_special, -1, index)
    return objreg.TokenBatch(ids, is_padding, is_special, words, torch.where(is_special, -1, 0),
                             torch.where(is_padding, -1, rows))


def within_4_sigma(count: float, n: float, p: float) -> bool:
    return abs(count - n * p) <= 4 * math.sqrt(n * p * (1 - p)) + 1e-9


def selected_mask(cb: objreg.CorruptedBatch) -> torch.Tensor:
    return cb.labels != IGNORE_INDEX


def test_selection_rate_and_never_special(registry):
    batch = batch_with_specials_in_text(512, 64)
    cb = registry.get("mlm", vocab=VOCAB).corrupt(batch, torch.Generator().manual_seed(0))
    selected = selected_mask(cb)
    maskable = ~batch.is_special
    assert not (selected & ~maskable).any()
    # Expected count with BERT's max(1, ·): n p per row, plus one when Bernoulli picked nothing.
    n, p = maskable.sum(dim=1).double(), 0.15
    expected = (n * p + (1 - p) ** n).sum()
    sigma = (n * p * (1 - p)).sum().sqrt()
    assert abs(selected.sum() - expected) <= 4 * sigma


@pytest.mark.parametrize(("mask_replace", "random_replace"), [(0.8, 0.1), (0.5, 0.5), (0.0, 0.0), (0.0, 1.0)])
def test_replacement_split(registry, mask_replace, random_replace):
    batch = batch_with_specials_in_text(512, 64)
    objective = registry.get("mlm", vocab=VOCAB, mask_replace_prob=mask_replace, random_replace_prob=random_replace)
    cb = objective.corrupt(batch, torch.Generator().manual_seed(1))
    selected = selected_mask(cb)
    N = int(selected.sum())
    assert torch.equal(cb.input_ids[~selected], batch.input_ids[~selected])
    new = cb.input_ids[selected]
    assert torch.isin(new, torch.cat([NORMAL, torch.tensor([VOCAB.mask_id])])).all()  # no other special id
    # A random draw equals the original token 1 time in 20 (uniform over the 20 ordinary ids).
    changed_to_other = (new != VOCAB.mask_id) & (new != batch.input_ids[selected])
    assert within_4_sigma(int((new == VOCAB.mask_id).sum()), N, mask_replace)
    assert within_4_sigma(int(changed_to_other.sum()), N, random_replace * (1 - 1 / len(NORMAL)))
    if random_replace == 1.0:
        assert set(new.tolist()) == set(NORMAL.tolist())  # every ordinary id can be drawn


def test_labels_and_position_lists_agree(registry):
    batch = batch_with_specials_in_text(64, 32)
    cb = registry.get("mlm", vocab=VOCAB).corrupt(batch, torch.Generator().manual_seed(2))
    selected = selected_mask(cb)
    assert torch.equal(cb.labels[selected], batch.input_ids[selected])
    positions, weights = cb.extras["masked_positions"], cb.extras["masked_weights"]
    count = selected.sum(dim=1)
    assert positions.dtype == torch.long and weights.dtype == torch.float32
    assert positions.shape == weights.shape == (64, int(count.max()))
    assert torch.equal(weights.sum(dim=1).long(), count)
    for b in range(64):
        k = int(count[b])
        assert positions[b, :k].tolist() == torch.nonzero(selected[b]).flatten().tolist()
        assert (positions[b, k:] == 0).all() and (weights[b, k:] == 0).all()


def test_at_least_one_selection_per_row(registry):
    batch = batch_with_specials_in_text(256, 32)
    cb = registry.get("mlm", vocab=VOCAB, mask_prob=0.0).corrupt(batch, torch.Generator().manual_seed(3))
    selected = selected_mask(cb)
    assert (selected.sum(dim=1) == 1).all()
    assert not (selected & batch.is_special).any()
    assert len(set(selected.long().argmax(dim=1).tolist())) > 10  # the forced position is random


def test_row_with_nothing_to_mask(registry, stand_in_model):
    batch = batch_with_specials_in_text(2, 8)
    empty = torch.tensor([VOCAB.cls_id, VOCAB.sep_id] + [VOCAB.pad_id] * 6)
    padding = torch.arange(8) >= 2
    batch = batch._replace(
        input_ids=torch.stack([batch.input_ids[0], empty]),
        is_padding=torch.stack([batch.is_padding[0], padding]),
        is_special=torch.stack([batch.is_special[0], torch.ones(8, dtype=torch.bool)]),
    )
    objective = registry.get("mlm", vocab=VOCAB)
    cb = objective.corrupt(batch, torch.Generator().manual_seed(0))
    assert not selected_mask(cb)[1].any() and (cb.extras["masked_weights"][1] == 0).all()
    hidden = torch.randn(2, 8, H, dtype=torch.float64)
    loss = objective.loss(objreg.ModelOutputs(hidden, stand_in_model("lm", H, VOCAB.size)), cb)
    assert torch.isfinite(loss).all() and loss[1] == 0 and loss[0] > 0


def test_loss_equals_full_logits_masked_by_labels(registry, tokenizer, texts, stand_in_model):
    objective = registry.get("mlm", vocab=tokenizer.vocab, mask_prob=0.3)
    cb = objective.corrupt(tokenizer.batch_from_texts(texts * 2), torch.Generator().manual_seed(4))
    model = stand_in_model("lm", H, tokenizer.vocab.size)
    hidden = torch.randn(*cb.input_ids.shape, H, dtype=torch.float64)
    loss = objective.loss(objreg.ModelOutputs(hidden, model), cb)
    logits = model.heads["lm"](hidden)  # (B, T, V): every position, unlike the objective
    expected = torch.stack([F.cross_entropy(logits[b], cb.labels[b], ignore_index=IGNORE_INDEX)
                            for b in range(cb.batch_size)])
    torch.testing.assert_close(loss, expected)


class RecordingHead(nn.Module):
    def __init__(self, vocab_size: int):
        super().__init__()
        self.linear = nn.Linear(H, vocab_size)
        self.shapes: list[tuple[int, ...]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.shapes.append(tuple(x.shape))
        return self.linear(x)


def test_head_runs_only_on_selected_positions(registry):
    batch = batch_with_specials_in_text(16, 64)
    cb = registry.get("mlm", vocab=VOCAB).corrupt(batch, torch.Generator().manual_seed(5))
    head = RecordingHead(VOCAB.size)
    model = types.SimpleNamespace(heads=nn.ModuleDict({"lm": head.double()}))
    registry.get("mlm", vocab=VOCAB).loss(
        objreg.ModelOutputs(torch.randn(16, 64, H, dtype=torch.float64), model), cb
    )
    K = cb.extras["masked_positions"].shape[1]
    assert head.shapes == [(16, K, H)] and K < 64 // 2


def test_same_seed_same_output_other_seed_differs(registry):
    batch = batch_with_specials_in_text(32, 32)
    objective = registry.get("mlm", vocab=VOCAB)
    a, b, c = (objective.corrupt(batch, torch.Generator().manual_seed(s)) for s in (7, 7, 8))
    assert all(torch.equal(x, y) for x, y in zip(a[:5], b[:5]))
    assert all(torch.equal(a.extras[k], b.extras[k]) for k in a.extras)
    assert not torch.equal(a.labels, c.labels)
    assert torch.equal(batch.input_ids, batch_with_specials_in_text(32, 32).input_ids)  # input untouched


def test_parameter_validation(registry):
    # The sum spans two parameters, so it is checked when the objective is created.
    with pytest.raises(objreg.InvalidParameterError, match="mask_replace_prob.*random_replace_prob"):
        registry.get("mlm", vocab=VOCAB, mask_replace_prob=0.8, random_replace_prob=0.3)
    assert registry.get("mlm", vocab=VOCAB, mask_replace_prob=0.8, random_replace_prob=0.2) is not None
    for bad in (-0.1, 1.5):
        with pytest.raises(objreg.InvalidParameterError, match="mask_prob"):
            registry.get("mlm", vocab=VOCAB, mask_prob=bad)


def test_mask_is_bidirectional_within_documents(registry):
    docs = torch.tensor([[0, 0, 0, 1, 1, -1]])
    cb = objreg.CorruptedBatch(docs.clamp(min=0), docs, docs < 0, docs, docs, {})
    described = registry.get("mlm", vocab=VOCAB).attention(cb)  # the host's, from the declaration
    assert isinstance(described, objreg.AttentionMask) and described.pattern == "bidirectional"
    mask = described.dense()[0]
    d = docs[0].tolist()
    assert mask.tolist() == [[d[i] == d[j] and d[j] >= 0 for j in range(6)] for i in range(6)]


def test_registry_handle_runs_end_to_end(registry, tokenizer, texts, stand_in_model):
    objective = registry.get("mlm", vocab=tokenizer.vocab)
    cb = objective.corrupt(tokenizer.batch_from_texts(texts), torch.Generator().manual_seed(0))
    B, T = cb.input_ids.shape
    mask = objective.attention_mask(cb)
    assert mask.shape == (B, T, T) and mask.dtype == torch.bool
    loss = objective.loss(objreg.ModelOutputs(torch.randn(B, T, H, dtype=torch.float64),
                                              stand_in_model("lm", H, tokenizer.vocab.size)), cb)
    assert loss.shape == (B,) and torch.isfinite(loss).all()


# -- modifiers ----------------------------------------------------------------------------------


def test_keeps_the_contract_with_label_smoothing_and_consistency():
    passed = check_objective_contract("mlm", params={"label_smoothing": 0.1, "consistency_weight": 0.5})
    assert "per-sample dots by jvp equal the per-example loop" in passed


def test_label_smoothing_loss_equals_torch_cross_entropy(registry, tokenizer, texts, stand_in_model):
    objective = registry.get("mlm", vocab=tokenizer.vocab, mask_prob=0.3, label_smoothing=0.1)
    cb = objective.corrupt(tokenizer.batch_from_texts(texts * 2), torch.Generator().manual_seed(4))
    model = stand_in_model("lm", H, tokenizer.vocab.size)
    hidden = torch.randn(*cb.input_ids.shape, H, dtype=torch.float64)
    loss = objective.loss(objreg.ModelOutputs(hidden, model), cb)
    logits = model.heads["lm"](hidden)
    expected = torch.stack([F.cross_entropy(logits[b], cb.labels[b], ignore_index=IGNORE_INDEX, label_smoothing=0.1)
                            for b in range(cb.batch_size)])
    torch.testing.assert_close(loss, expected)


def test_consistency_adds_an_independent_second_view(registry):
    batch = batch_with_specials_in_text(512, 64)
    plain = registry.get("mlm", vocab=VOCAB).corrupt(batch, torch.Generator().manual_seed(6))
    cb = registry.get("mlm", vocab=VOCAB, consistency_weight=1.0).corrupt(batch, torch.Generator().manual_seed(6))
    assert torch.equal(cb.input_ids, plain.input_ids) and torch.equal(cb.labels, plain.labels)  # view 1 unchanged
    assert "consistency_input_ids" not in plain.extras
    second = cb.extras["consistency_input_ids"]
    assert not torch.equal(second, cb.input_ids)
    assert torch.equal(second[batch.is_special], batch.input_ids[batch.is_special])
    # The KL runs where both views selected: about n p^2 positions if the views are independent.
    both = int(cb.extras["consistency_weights"].sum())
    n = float((~batch.is_special).sum())
    assert within_4_sigma(both, n, 0.15**2)
    positions = cb.extras["consistency_positions"]
    picked = positions[cb.extras["consistency_weights"] > 0]
    assert (cb.labels.gather(1, positions)[cb.extras["consistency_weights"] > 0] != IGNORE_INDEX).all()
    assert len(picked) == both
