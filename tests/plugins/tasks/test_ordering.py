"""Tests of the ``ordering`` downstream task: positives keep the original order, negatives differ
from it, sentence boundaries stay intact, the draws are seeded, windows come from held-out
documents or a text file, and the loss agrees with an independent computation."""

from __future__ import annotations

import itertools
import math
import types

import pytest
import torch
import torch.nn.functional as F

import objreg
from objreg.plugins.tasks import ordering

PARAMS = {"num_sentences": 3, "mode": "shuffle", "seed": 0}


@pytest.fixture(scope="module")
def task() -> objreg.Objective:
    return objreg.Registry.load(load_entrypoints=False).get_task("ordering")


@pytest.fixture(scope="module")
def documents(texts) -> list[list[str]]:
    return [objreg.split_sentences(t) for t in texts]


def build_data(documents, tokenizer, seq_len=96, limit=1000, **params) -> objreg.TaskData:
    return ordering.objreg_task_data(None, documents, tokenizer, seq_len, limit, {**PARAMS, **params})


def build(documents, tokenizer, seq_len=96, limit=1000, **params) -> objreg.CorruptedBatch:
    return build_data(documents, tokenizer, seq_len, limit, **params).batch


def segments(batch: objreg.CorruptedBatch, b: int, vocab: objreg.Vocabulary) -> list[list[int]]:
    """The token ids between [CLS] and each [SEP] of row ``b``."""
    ids = batch.input_ids[b][~batch.is_padding[b]].tolist()
    assert ids[0] == vocab.cls_id and ids[-1] == vocab.sep_id
    out, current = [], []
    for token in ids[1:]:
        if token == vocab.sep_id:
            out.append(current)
            current = []
        else:
            current.append(token)
    return out


def expected_windows(documents, tokenizer, k) -> list[list[list[int]]]:
    """Windows of k consecutive sentences, one document after another in turn, independently of
    the plugin (the fixture has no repeated sentence)."""
    encoded = [[tokenizer.encode_with_offsets(s)[0] for s in doc] for doc in documents]
    out = []
    for start in range(max(len(d) for d in documents)):
        for doc in encoded:
            if start + k <= len(doc):
                out.append(doc[start : start + k])
    return out


# -- info and registry ----------------------------------------------------------------------------


def test_registered_as_a_downstream_task(task):
    assert "ordering" in objreg.Registry.load(load_entrypoints=False).tasks()
    assert task.info.kind == "downstream"
    assert task.info.heads == (objreg.HeadSpec("ordering", "classifier"),)  # sized from the data
    assert set(task.params) == set(PARAMS)
    with pytest.raises(objreg.InvalidParameterError, match="mode"):
        objreg.Registry.load(load_entrypoints=False).get_task("ordering", mode="reverse")


def test_permutations_are_lexicographic():
    assert ordering.permutations(3) == [(0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0)]


# -- the examples ---------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("mode", ordering.MODES)
def test_rows_are_the_window_in_the_drawn_order(documents, tokenizer, k, mode):
    vocab = tokenizer.vocab
    data = build_data(documents, tokenizer, num_sentences=k, mode=mode)
    batch = data.batch
    windows = expected_windows(documents, tokenizer, k)
    assert batch.batch_size == len(windows)
    label, order = batch.extras["label"], batch.extras["order"]
    identity = tuple(range(k))
    for b, window in enumerate(windows):
        parts = segments(batch, b, vocab)
        slot_order = tuple(order[b].tolist())
        # sentence boundaries intact: each segment is one whole sentence of the window
        assert parts == [window[j] for j in slot_order]
        assert sorted(map(tuple, parts)) == sorted(map(tuple, window))
        if mode == "permutation":
            assert int(label[b]) == ordering.permutations(k).index(slot_order)
        else:
            # positives keep the original order, negatives differ from it
            assert (int(label[b]) == 0) == (slot_order == identity)
            assert (parts == window) == (int(label[b]) == 0)
        if mode == "swap" and int(label[b]) == 1:
            moved = [j for j in range(k) if slot_order[j] != j]
            assert len(moved) == 2 and moved[1] == moved[0] + 1
    classes = math.factorial(k) if mode == "permutation" else 2
    assert data.heads == (objreg.HeadSpec("ordering", "classifier", classes),)  # k! or 2 outputs, no more
    assert set(batch.extras) == {"label", "order", "sentence_ids"}
    # sentence_ids mark each segment's tokens with its slot
    for b in range(batch.batch_size):
        slots = batch.extras["sentence_ids"][b]
        ids = batch.input_ids[b]
        assert ((slots == -1) == (batch.is_padding[b] | (ids == vocab.sep_id) | (ids == vocab.cls_id))).all()
        sizes = [int((slots == j).sum()) for j in range(k)]
        assert sizes == [len(p) for p in segments(batch, b, vocab)]


def test_labels_are_balanced_and_permutations_uniform(documents, tokenizer):
    many = [doc for doc in documents if len(doc) >= 3] * 100
    batch = build(many, tokenizer, limit=10_000)
    n = batch.batch_size
    rate = batch.extras["label"].float().mean().item()
    assert n > 300 and abs(rate - 0.5) < 5 * 0.5 / n**0.5  # 5 standard deviations
    counts = torch.bincount(build(many, tokenizer, limit=10_000, mode="permutation").extras["label"], minlength=6)
    expected = n / 6
    chi2 = (((counts - expected) ** 2) / expected).sum().item()
    assert chi2 < 25.7  # the 0.9999 quantile of chi-square with 5 degrees of freedom


def test_shuffle_negatives_cover_every_other_order(documents, tokenizer):
    many = [doc for doc in documents if len(doc) >= 3] * 20
    batch = build(many, tokenizer, limit=10_000)
    negatives = {tuple(o) for o, y in zip(batch.extras["order"].tolist(), batch.extras["label"].tolist()) if y == 1}
    assert negatives == set(itertools.permutations(range(3))) - {(0, 1, 2)}


def test_deterministic_for_a_seed(documents, tokenizer):
    a = build(documents, tokenizer)
    b = build(documents, tokenizer)
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.extras["label"], b.extras["label"])
    many = [doc for doc in documents if len(doc) >= 3] * 10
    assert not torch.equal(build(many, tokenizer).extras["order"], build(many, tokenizer, seed=1).extras["order"])


def test_long_window_is_cut_the_same_whatever_the_order(tokenizer):
    long = " ".join(["Bees collect nectar from flowers"] * 6) + "."
    docs = [[long, "The queen lays eggs.", "Rain falls."]] * 40
    batch = build(docs, tokenizer, seq_len=24, mode="permutation")
    assert batch.input_ids.shape[1] == 24
    short = [tokenizer.encode_with_offsets(s)[0] for s in docs[0][1:]]
    budget = 24 - 1 - 3
    for b in range(batch.batch_size):
        parts = segments(batch, b, tokenizer.vocab)
        by_sentence = {int(j): part for j, part in zip(batch.extras["order"][b], parts)}
        assert by_sentence[1] == short[0] and by_sentence[2] == short[1]  # short sentences kept whole
        assert by_sentence[0] == tokenizer.encode_with_offsets(long)[0][: budget - len(short[0]) - len(short[1])]


def test_windows_with_repeated_sentences_are_skipped(tokenizer):
    docs = [["Bees fly.", "Rain falls.", "Bees fly."], ["Bees fly.", "Rain falls.", "The queen lays eggs."]]
    batch = build(docs, tokenizer)
    assert batch.batch_size == 1
    assert (
        segments(batch, 0, tokenizer.vocab)[0] != [] and len(set(map(tuple, segments(batch, 0, tokenizer.vocab)))) == 3
    )


def test_limit_and_errors(task, documents, tokenizer):
    assert build(documents, tokenizer, limit=2).batch_size == 2
    with pytest.raises(
        objreg.DataError, match=r"held-out corpus has no window of 3 consecutive sentences .*lower num_sentences"
    ):
        build([["One.", "Two."], ["Three."]], tokenizer)
    with pytest.raises(objreg.InvalidParameterError, match=r"seq_len 6 is too short for windows of 3 sentences"):
        build(documents, tokenizer, seq_len=6)
    with pytest.raises(objreg.InvalidParameterError, match="task 'ordering': limit must be an integer of at least 1"):
        task.task_data(None, documents, tokenizer, 96, 0)


def test_text_file_as_source(tmp_path, tokenizer, texts):
    path = tmp_path / "docs.txt"
    path.write_text("\n\n".join(texts) + "\n", encoding="utf-8")
    batch = ordering.objreg_task_data(str(path), [], tokenizer, 96, 1000, PARAMS).batch
    documents = [objreg.split_sentences(t) for t in texts]
    assert batch.batch_size == len(expected_windows(documents, tokenizer, 3))
    assert torch.equal(batch.input_ids, build(documents, tokenizer).input_ids)
    with pytest.raises(objreg.DataError, match=r"ordering data .*nothere\.txt does not exist"):
        ordering.objreg_task_data(str(tmp_path / "nothere.txt"), [], tokenizer, 96, 10, PARAMS)
    (tmp_path / "empty.txt").write_text("", encoding="utf-8")
    with pytest.raises(objreg.DataError, match=r"empty"):
        ordering.objreg_task_data(str(tmp_path / "empty.txt"), [], tokenizer, 96, 10, PARAMS)


def test_wikitext_as_source(shared_file, tokenizer):
    path = shared_file("wikitext-2/valid.txt")
    batch = ordering.objreg_task_data(str(path), [], tokenizer, 128, 50, PARAMS).batch
    assert batch.batch_size == 50
    assert ((batch.input_ids == tokenizer.vocab.sep_id).sum(dim=1) == 3).all()


# -- attention mask and loss ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def perm_batch(documents, tokenizer) -> objreg.CorruptedBatch:
    data = build_data(documents, tokenizer, mode="permutation")
    assert data.heads == (objreg.HeadSpec("ordering", "classifier", 6),)
    return data.batch


def test_a_built_model_has_a_k_factorial_head(task, documents, tokenizer):
    data = task.task_data(None, documents, tokenizer, seq_len=96, limit=4)
    assert data.heads == (objreg.HeadSpec("ordering", "classifier", 2),)  # shuffle: binary
    permuted = objreg.Registry.load(load_entrypoints=False).get_task("ordering", mode="permutation", num_sentences=4)
    longer = [list(a) + list(b) for a, b in zip(documents, documents[1:])]  # windows of 4 sentences
    heads = permuted.task_data(None, longer, tokenizer, seq_len=96, limit=4).heads
    assert heads == (objreg.HeadSpec("ordering", "classifier", 24),)
    registry = objreg.Registry.load(load_entrypoints=False)
    tiny = {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "intermediate_size": 32}
    model = registry.load_model("default", tokenizer.vocab, heads, tiny, torch.Generator().manual_seed(0))
    assert model.heads["ordering"].classifier.weight.shape == (24, 16)


def test_attention_mask_is_bidirectional(task, perm_batch):
    B, T = perm_batch.input_ids.shape
    assert torch.equal(task.attention_mask(perm_batch), (~perm_batch.is_padding)[:, None, :].expand(B, T, T))


def test_loss_is_the_cross_entropy_over_the_permutations(task, perm_batch, stand_in_model):
    B, T = perm_batch.input_ids.shape
    model = stand_in_model("ordering", 8, 6, first_token=True)
    hidden = torch.randn(B, T, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    loss = task.loss(objreg.ModelOutputs(hidden, model), perm_batch)
    with torch.no_grad():
        logits = hidden[:, 0] @ model.head.weight.T + model.head.bias  # the 6-way head
        expected = F.cross_entropy(logits, perm_batch.extras["label"], reduction="none")
    torch.testing.assert_close(loss, expected, rtol=1e-12, atol=1e-12)


def test_loss_is_transform_safe(task, perm_batch, stand_in_model):
    B, T = perm_batch.input_ids.shape
    model = stand_in_model("ordering", 8, 6, first_token=True)
    hidden = torch.randn(B, T, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(2))

    def one(h: torch.Tensor, example: objreg.CorruptedBatch) -> torch.Tensor:
        single = objreg.CorruptedBatch(*(t[None] for t in example[:5]), {k: v[None] for k, v in example.extras.items()})
        return task.loss(objreg.ModelOutputs(h[None], model), single)[0]

    per_sample = torch.func.vmap(torch.func.grad(one))(hidden, perm_batch)
    leaf = hidden.clone().requires_grad_(True)
    (expected,) = torch.autograd.grad(task.loss(objreg.ModelOutputs(leaf, model), perm_batch).sum(), leaf)
    torch.testing.assert_close(per_sample, expected)
    direction = torch.randn_like(hidden)
    _, tangent = torch.func.jvp(lambda h: task.loss(objreg.ModelOutputs(h, model), perm_batch), (hidden,), (direction,))
    torch.testing.assert_close(tangent, (expected * direction).sum(dim=(1, 2)))


def test_sized_head_equals_the_old_masked_wide_head(task, perm_batch):
    """A 6-output head gives the loss of the old 120-output head with its unused logits masked,
    when its weight is the first 6 rows of the wide one."""
    B, T = perm_batch.input_ids.shape
    g = torch.Generator().manual_seed(4)
    hidden = torch.randn(B, T, 8, dtype=torch.float64, generator=g)
    weight, bias = torch.randn(120, 8, dtype=torch.float64, generator=g), torch.randn(120, dtype=torch.float64, generator=g)
    logits = hidden[:, 0] @ weight.T + bias
    masked = torch.where(torch.arange(120) < 6, logits, torch.finfo(logits.dtype).min)
    old = torch.logsumexp(masked, dim=1) - masked.gather(1, perm_batch.extras["label"][:, None]).squeeze(1)
    sized = types.SimpleNamespace(heads={"ordering": lambda h: logits[:, :6]})
    torch.testing.assert_close(task.loss(objreg.ModelOutputs(hidden, sized), perm_batch), old, rtol=1e-15, atol=1e-15)
    narrow = types.SimpleNamespace(heads={"ordering": lambda h: h[:, 0] @ weight[:6].T + bias[:6]})
    torch.testing.assert_close(task.loss(objreg.ModelOutputs(hidden, narrow), perm_batch), old, rtol=1e-13, atol=1e-13)
