"""Contrastive InfoNCE: two views per row in one pass, duplicates out of the denominator, loss vs a
hand-written float64 loop."""

from __future__ import annotations

import math
import types

import pytest
import torch
from torch import nn

import objreg
from objreg import IGNORE_INDEX
from objreg.testing import TINY_MODEL

H = 8

# Two sentences each, so each row has exactly one split and its views are known in advance.
TEXTS = [
    "The committee met on Tuesday. It approved the budget.",  # 0
    "Rivers carry sediment to the sea. Deltas form where the current slows.",  # 1
    "The committee met on Tuesday. Members argued about the roof.",  # 2: view A = row 0's view A
    "Bees collect nectar from flowers. They store honey in wax cells.",  # 3
    "Rivers carry sediment to the sea. Deltas form where the current slows.",  # 4: row 1's text, another document
    "Members argued about the roof. Some deltas grow every year.",  # 5: view A = row 2's view B
]
#: Row 6 repeats row 3: the same document twice in one batch.
ROWS = [0, 1, 2, 3, 4, 5, 3]
#: The rows each row must not see as negatives.
DUPLICATES = {0: {2}, 1: {4}, 2: {0, 5}, 3: {6}, 4: {1}, 5: {2}, 6: {3}}


class FirstTokenProjection(nn.Module):
    """The documented projection head: [B, T, H] -> [B, n] from the first token."""

    def __init__(self, n: int = 5):
        super().__init__()
        self.linear = nn.Linear(H, n)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.linear(hidden[:, 0])


@pytest.fixture
def batch(tokenizer):
    return tokenizer.batch_from_texts(TEXTS).select(torch.tensor(ROWS))


def views_of(row: list[int], vocab: objreg.Vocabulary) -> tuple[list[int], list[int], int]:
    """``[CLS] A [SEP] [CLS] B [SEP] pad...`` -> (A, B, index of the second [CLS])."""
    first_sep = row.index(vocab.sep_id)
    second = first_sep + 1
    assert row[0] == vocab.cls_id and row[second] == vocab.cls_id
    end = row.index(vocab.sep_id, second)
    return row[1:first_sep], row[second + 1 : end], second


def test_rows_become_two_views_of_one_document(registry, tokenizer, texts):
    batch = tokenizer.batch_from_texts(texts)
    v = tokenizer.vocab
    cb = registry.get("contrastive", vocab=v).corrupt(batch, torch.Generator().manual_seed(0))
    B, T = batch.input_ids.shape
    assert cb.input_ids.shape == (B, T + 2)
    for b in range(B):
        n = int((~batch.is_padding[b]).sum())
        body, sentences = batch.input_ids[b, 1 : n - 1].tolist(), batch.sentence_ids[b, 1 : n - 1].tolist()
        a, view_b, second = views_of(cb.input_ids[b].tolist(), v)
        assert a + view_b == body and a and view_b
        assert sentences[len(a)] != sentences[len(a) - 1]  # split at a sentence boundary
        end = n + 1
        assert cb.is_padding[b].tolist() == [j > end for j in range(T + 2)]
        assert cb.extras["second_view_start"][b] == second
        assert cb.extras["view_ids"][b].tolist() == [-1 if j > end else int(j >= second) for j in range(T + 2)]
        assert cb.position_ids[b, : end + 1].tolist() == [*range(second), *range(end + 1 - second)]
    assert (cb.labels == IGNORE_INDEX).all()


def test_the_views_never_attend_to_each_other(registry, tokenizer, batch):
    objective = registry.get("contrastive", vocab=tokenizer.vocab)
    cb = objective.corrupt(batch, torch.Generator().manual_seed(0))
    described = objective.attention(cb)  # each view a block of its own
    assert isinstance(described, objreg.AttentionMask) and described.pattern == "bidirectional"
    mask = objective.attention_mask(cb)
    views = cb.extras["view_ids"]
    expected = (views[:, :, None] == views[:, None, :]) & (views[:, None, :] >= 0)
    assert torch.equal(mask, expected)


def test_each_view_is_encoded_exactly_as_if_alone(registry, tokenizer, batch):
    objective = registry.get("contrastive", vocab=tokenizer.vocab)
    cb = objective.corrupt(batch, torch.Generator().manual_seed(0))
    model = registry.load_model("default", tokenizer.vocab, list(objective.info.heads), TINY_MODEL,
                                torch.Generator().manual_seed(0)).double()
    hidden = model.encode(cb.input_ids, objective.attention_mask(cb), cb.position_ids)
    v = tokenizer.vocab
    for b in range(cb.batch_size):
        a, view_b, second = views_of(cb.input_ids[b].tolist(), v)
        for tokens, offset in ((a, 0), (view_b, second)):
            alone = torch.tensor([[v.cls_id, *tokens, v.sep_id]])
            n = alone.shape[1]
            reference = model.encode(alone, torch.ones(1, n, n, dtype=torch.bool), torch.arange(n)[None])
            torch.testing.assert_close(hidden[b, offset : offset + n], reference[0])


def loop_losses(hidden: torch.Tensor, cb: objreg.CorruptedBatch, head: nn.Module, vocab: objreg.Vocabulary,
                documents: list[int], temperature: float, drop_duplicates: bool = True) -> list[float]:
    """InfoNCE written out: cosine / temperature, duplicates (same document or a shared view text,
    found by comparing token lists) left out of each denominator."""
    B = cb.batch_size
    parsed = [views_of(cb.input_ids[b].tolist(), vocab) for b in range(B)]
    anchors = [head(hidden[b : b + 1, 0:1])[0].tolist() for b in range(B)]
    candidates = [head(hidden[b : b + 1, parsed[b][2] : parsed[b][2] + 1])[0].tolist() for b in range(B)]

    def cosine(x: list[float], y: list[float]) -> float:
        dot = sum(p * q for p, q in zip(x, y))
        return dot / (math.sqrt(sum(p * p for p in x)) * math.sqrt(sum(q * q for q in y)))

    losses = []
    for i in range(B):
        texts_i = {tuple(parsed[i][0]), tuple(parsed[i][1])}
        total = 0.0
        for j in range(B):
            texts_j = {tuple(parsed[j][0]), tuple(parsed[j][1])}
            duplicate = documents[i] == documents[j] or bool(texts_i & texts_j)
            if j != i and drop_duplicates and duplicate:
                continue
            total += math.exp(cosine(anchors[i], candidates[j]) / temperature)
        losses.append(-(cosine(anchors[i], candidates[i]) / temperature - math.log(total)))
    return losses


@pytest.mark.parametrize("temperature", [0.05, 0.5])
def test_loss_equals_a_float64_loop_that_drops_duplicates(registry, tokenizer, batch, temperature):
    objective = registry.get("contrastive", vocab=tokenizer.vocab, temperature=temperature)
    # The temperature is the loss's parameter, not data of the batch: any corruption serves.
    cb = registry.get("contrastive", vocab=tokenizer.vocab).corrupt(batch, torch.Generator().manual_seed(1))
    assert set(cb.extras) == {"view_ids", "second_view_start", "view_groups"}
    torch.manual_seed(0)
    head = FirstTokenProjection().double()
    model = types.SimpleNamespace(heads=nn.ModuleDict({"embedding": head}))
    hidden = torch.randn(*cb.input_ids.shape, H, dtype=torch.float64)
    loss = objective.loss(objreg.ModelOutputs(hidden, model), cb)
    documents = batch.document_ids[:, 0].tolist()
    with torch.no_grad():
        expected = loop_losses(hidden, cb, head, tokenizer.vocab, documents, temperature)
        counted_all = loop_losses(hidden, cb, head, tokenizer.vocab, documents, temperature, drop_duplicates=False)
    torch.testing.assert_close(loss, torch.tensor(expected, dtype=torch.float64), rtol=1e-10, atol=1e-10)
    # The batch has duplicates, so counting them as negatives would give other losses.
    assert max(abs(x - y) for x, y in zip(expected, counted_all)) > 1e-3


def test_duplicates_get_no_gradient_from_a_row(registry, tokenizer, batch):
    """∂ℓ_i/∂(view B of row j) is zero exactly for j a duplicate of i, and non-zero for every negative."""
    objective = registry.get("contrastive", vocab=tokenizer.vocab)
    cb = objective.corrupt(batch, torch.Generator().manual_seed(2))
    torch.manual_seed(0)
    model = types.SimpleNamespace(heads=nn.ModuleDict({"embedding": FirstTokenProjection().double()}))
    hidden = torch.randn(*cb.input_ids.shape, H, dtype=torch.float64, requires_grad=True)
    loss = objective.loss(objreg.ModelOutputs(hidden, model), cb)
    start = cb.extras["second_view_start"]
    B = cb.batch_size
    for i in range(B):
        (g,) = torch.autograd.grad(loss[i], hidden, retain_graph=True)
        touched = {j for j in range(B) if j != i and g[j, start[j]].abs().sum() > 0}
        assert touched == set(range(B)) - {i} - DUPLICATES[i], i


def test_a_row_without_negatives_is_an_error(registry, tokenizer, texts):
    objective = registry.get("contrastive", vocab=tokenizer.vocab)
    one = tokenizer.batch_from_texts([texts[0]])
    with pytest.raises(objreg.DataError, match="contrastive needs an in-batch negative for every row, but row 0 of 1"):
        objective.corrupt(one, torch.Generator())
    same_document = one.select(torch.tensor([0, 0, 0]))
    with pytest.raises(objreg.DataError, match="row 0 of 3 has none"):
        objective.corrupt(same_document, torch.Generator())
    same_text = tokenizer.batch_from_texts([TEXTS[1], TEXTS[4]])  # two documents, one text
    with pytest.raises(objreg.DataError, match="shares its document or a view's text"):
        objective.corrupt(same_text, torch.Generator())


def test_one_sentence_row_is_an_error(registry, tokenizer, texts):
    batch = tokenizer.batch_from_texts([texts[0], "Only one sentence here."])
    with pytest.raises(objreg.DataError, match="contrastive needs at least 2 sentences in each row; row 1 has 1"):
        registry.get("contrastive", vocab=tokenizer.vocab).corrupt(batch, torch.Generator())


def test_packed_row_is_an_error(registry, tokenizer, texts):
    batch = tokenizer.batch_from_texts(texts)
    docs = batch.document_ids.clone()
    docs[2, 5:] = torch.where(batch.is_padding[2, 5:], -1, 99)
    with pytest.raises(objreg.DataError, match="row 2"):
        registry.get("contrastive", vocab=tokenizer.vocab).corrupt(batch._replace(document_ids=docs), torch.Generator())


def test_same_seed_same_output_other_seed_differs(registry, tokenizer, texts):
    big = tokenizer.batch_from_texts(texts).select(torch.arange(6).repeat(5))
    objective = registry.get("contrastive", vocab=tokenizer.vocab)
    a, b, c = (objective.corrupt(big, torch.Generator().manual_seed(s)) for s in (5, 5, 6))
    assert all(torch.equal(x, y) for x, y in zip(a[:5], b[:5]))
    assert all(torch.equal(a.extras[k], b.extras[k]) for k in a.extras)
    assert not torch.equal(a.input_ids, c.input_ids)


def test_info_declares_a_batch_coupled_loss_and_simcse_temperature(registry):
    info = registry.info("contrastive")
    assert info.batch_coupled and info.min_sentences == 2
    assert info.defaults() == {"temperature": 0.05}
    assert info.heads[0].kind == "projection"
    with pytest.raises(objreg.InvalidParameterError, match="temperature"):
        registry.get("contrastive", temperature=0.0)
