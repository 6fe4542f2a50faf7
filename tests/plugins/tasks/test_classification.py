"""Tests of the ``classification`` downstream task: GLUE TSV and JSONL rows (real SST-2 and RTE dev
files where present), heads sized from the data's labels, the built-in same-document pairs, and
the loss against an independent float64 computation and under vmap/jvp. The file readers'
validation is tested in tests/toolkit/test_classfiles.py."""

from __future__ import annotations

import csv
import json
import types
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import objreg
from objreg.plugins.tasks import classification as cls
from objreg.toolkit.classfiles import read_classification
from objreg.toolkit.lengths import fit_lengths

PARAMS = {"text_field": "", "text_pair_field": "", "label_field": "", "labels": "", "seed": 0}


@pytest.fixture(scope="module")
def task() -> objreg.Objective:
    return objreg.Registry.load(load_entrypoints=False).get_task("classification")


@pytest.fixture(scope="module")
def documents(texts) -> list[list[str]]:
    return [objreg.split_sentences(t) for t in texts]


def load_data(path, tokenizer, seq_len=64, limit=1000, **params) -> objreg.TaskData:
    return cls.objreg_task_data(str(path), [], tokenizer, seq_len, limit, {**PARAMS, **params})


def load(path, tokenizer, seq_len=64, limit=1000, **params) -> objreg.CorruptedBatch:
    return load_data(path, tokenizer, seq_len, limit, **params).batch


def num_classes(data: objreg.TaskData) -> int:
    """The width of the classifier the task sized from its data."""
    (head,) = data.heads
    assert (head.name, head.kind) == ("classification", "classifier")
    return head.num_outputs


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def row_texts(batch: objreg.CorruptedBatch, b: int, vocab: objreg.Vocabulary) -> list[list[int]]:
    """The token ids between the row's [CLS] and each [SEP], read back from the row."""
    ids = batch.input_ids[b][~batch.is_padding[b]].tolist()
    assert ids[0] == vocab.cls_id and ids[-1] == vocab.sep_id
    parts, current = [], []
    for token in ids[1:]:
        if token == vocab.sep_id:
            parts.append(current)
            current = []
        else:
            current.append(token)
    return parts


def check_layout(data: objreg.TaskData, vocab: objreg.Vocabulary, seq_len: int, pair: bool) -> None:
    batch = data.batch
    B, T = batch.input_ids.shape
    assert T <= seq_len
    assert (batch.labels == objreg.IGNORE_INDEX).all()
    assert torch.equal(batch.is_padding, batch.input_ids == vocab.pad_id)
    assert torch.equal(batch.position_ids, torch.arange(T).expand(B, T))
    assert (batch.input_ids[:, 0] == vocab.cls_id).all()
    seps = (batch.input_ids == vocab.sep_id).sum(dim=1)
    assert (seps == (2 if pair else 1)).all()
    assert set(batch.extras) == {"label"}  # no segment ids: no backbone reads them
    label = batch.extras["label"]
    assert label.shape == (B,)
    assert ((label >= 0) & (label < num_classes(data))).all()


# -- info and registry ----------------------------------------------------------------------------


def test_registered_as_a_downstream_task(task):
    assert "classification" in objreg.Registry.load(load_entrypoints=False).tasks()
    assert task.info.kind == "downstream"
    assert task.info.heads == (objreg.HeadSpec("classification", "classifier"),)  # sized from the data
    assert set(task.params) == set(PARAMS)


# -- truncation -------------------------------------------------------------------------------------


def longest_first_loop(lengths: list[int], budget: int) -> list[int]:
    """Remove one token at a time from the longest text (the last of equally long ones)."""
    out = list(lengths)
    while sum(out) > budget:
        longest = max(out)
        i = max(k for k, n in enumerate(out) if n == longest)
        out[i] -= 1
    return out


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=1, max_size=5), st.integers(0, 120))
def test_fit_lengths_is_longest_first(lengths, budget):
    assert fit_lengths(lengths, budget) == longest_first_loop(lengths, budget)


def test_long_pair_is_cut_longest_first(tmp_path, tokenizer):
    long = " ".join(["bees collect nectar from flowers"] * 20)
    path = write(
        tmp_path, "pair.tsv", f"sentence1\tsentence2\tlabel\n{long}\tthe queen lays the eggs\tyes\nshort\t{long}\tno\n"
    )
    data = load_data(path, tokenizer, seq_len=40)
    check_layout(data, tokenizer.vocab, 40, pair=True)
    batch = data.batch
    assert (~batch.is_padding).sum(dim=1).tolist() == [40, 40]
    short_ids = tokenizer.encode_with_offsets("the queen lays the eggs")[0]
    first, second = row_texts(batch, 0, tokenizer.vocab)
    assert second == short_ids and len(first) == 37 - len(short_ids)  # the short text is kept whole
    first, second = row_texts(batch, 1, tokenizer.vocab)
    assert first == tokenizer.encode_with_offsets("short")[0]
    assert second == tokenizer.encode_with_offsets(long)[0][: 37 - len(first)]  # cut at its end


# -- real GLUE files --------------------------------------------------------------------------------


def test_sst2_dev(shared_file, tokenizer):
    path = shared_file("glue/SST-2/dev.tsv")
    data = load_data(path, tokenizer, seq_len=64)
    check_layout(data, tokenizer.vocab, 64, pair=False)
    batch = data.batch
    assert num_classes(data) == 2  # exactly the data's labels
    with path.open(encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    assert batch.batch_size == len(rows) == 872
    assert torch.bincount(batch.extras["label"]).tolist() == [428, 444]  # the official counts
    assert batch.extras["label"].tolist() == [int(r["label"]) for r in rows]  # "0" -> class 0
    (text,) = row_texts(batch, 0, tokenizer.vocab)
    assert text == tokenizer.encode_with_offsets(rows[0]["sentence"])[0][:62]


def test_sst2_limit_is_evenly_spaced(shared_file, tokenizer):
    path = shared_file("glue/SST-2/dev.tsv")
    full = load(path, tokenizer, seq_len=64)
    part = load(path, tokenizer, seq_len=64, limit=10)
    assert part.batch_size == 10
    picked = [i * 872 // 10 for i in range(10)]
    assert torch.equal(part.extras["label"], full.extras["label"][picked])
    T = part.input_ids.shape[1]
    assert torch.equal(part.input_ids, full.input_ids[picked][:, :T])


def test_rte_dev(shared_file, tokenizer):
    path = shared_file("glue/RTE/dev.tsv")
    data = load_data(path, tokenizer, seq_len=128)
    check_layout(data, tokenizer.vocab, 128, pair=True)
    batch = data.batch
    with path.open(encoding="utf-8", newline="") as f:  # this export is CSV-quoted
        rows = list(csv.DictReader(f, delimiter="\t"))
    assert batch.batch_size == len(rows) == 277
    assert torch.bincount(batch.extras["label"]).tolist() == [146, 131]
    assert num_classes(data) == 2
    records, _ = read_classification(path)
    first, second = row_texts(batch, 13, tokenizer.vocab)  # the quoted record of line 15, unquoted
    assert first == tokenizer.encode_with_offsets(records[13].text)[0][: len(first)]
    assert second == tokenizer.encode_with_offsets(records[13].pair)[0][: len(second)]


# -- synthetic files --------------------------------------------------------------------------------


def test_tsv_with_index_column_string_labels_and_quotes(tmp_path, tokenizer):
    path = write(
        tmp_path,
        "rte.tsv",
        "index\tsentence1\tsentence2\tlabel\n"
        '0\t"Bees said ""hello"" twice."\tBees spoke.\tnot_entailment\n'
        "1\tRivers carry sediment.\tRivers move things.\tentailment\n"
        '2\tHe said "no" twice.\tHe spoke.\tentailment\n',  # a bare GLUE field with inner quotes stays as it is
    )
    data = load_data(path, tokenizer)
    batch = data.batch
    assert batch.extras["label"].tolist() == [1, 0, 0]  # entailment, not_entailment: alphabetical
    assert num_classes(data) == 2
    assert row_texts(batch, 0, tokenizer.vocab)[0] == tokenizer.encode_with_offsets('Bees said "hello" twice.')[0]
    fixed = load(path, tokenizer, labels="not_entailment,entailment")  # the parameter fixes the order
    assert fixed.extras["label"].tolist() == [0, 1, 1]
    wider = load_data(path, tokenizer, labels="not_entailment,entailment,neutral")  # and the head's width
    assert num_classes(wider) == 3 and wider.batch.extras["label"].tolist() == [0, 1, 1]


def test_jsonl_single_and_pair(tmp_path, tokenizer):
    single = write(
        tmp_path,
        "single.jsonl",
        "\n".join(
            json.dumps(r)
            for r in [
                {"text": "Bees collect nectar.", "label": 10},
                {"text": "Rivers carry sediment.", "label": 2},
                {"text": "The queen lays the eggs.", "label": 10},
                {"text": "Rain falls.", "label": 7},
            ]
        )
        + "\n\n",
    )
    data = load_data(single, tokenizer)
    check_layout(data, tokenizer.vocab, 64, pair=False)
    assert data.batch.extras["label"].tolist() == [2, 0, 2, 1]  # classes "2", "7", "10": numeric order
    assert num_classes(data) == 3

    pair = write(
        tmp_path,
        "pair.jsonl",
        "\n".join(
            json.dumps(r)
            for r in [
                {"text": "Bees collect nectar.", "text_pair": "They make honey.", "label": "yes"},
                {"text": "Rivers carry sediment.", "text_pair": "Bees sting.", "label": "no"},
            ]
        ),
    )
    data = load_data(pair, tokenizer)
    check_layout(data, tokenizer.vocab, 64, pair=True)
    batch = data.batch
    first, second = row_texts(batch, 0, tokenizer.vocab)
    assert first == tokenizer.encode_with_offsets("Bees collect nectar.")[0]
    assert second == tokenizer.encode_with_offsets("They make honey.")[0]
    assert batch.extras["label"].tolist() == [1, 0]


def test_field_parameters(tmp_path, tokenizer):
    path = write(
        tmp_path,
        "custom.jsonl",
        "\n".join(
            json.dumps(r)
            for r in [
                {"review": "Bees collect nectar.", "title": "Bees", "stars": "good"},
                {"review": "Rain falls.", "title": "Rain", "stars": "bad"},
            ]
        ),
    )
    with pytest.raises(objreg.DataError, match=r"custom\.jsonl: the first record \(line 1\) has no text field"):
        load(path, tokenizer)
    check_layout(load_data(path, tokenizer, text_field="review", label_field="stars"), tokenizer.vocab, 64, pair=False)
    data = load_data(path, tokenizer, text_field="title", text_pair_field="review", label_field="stars")
    check_layout(data, tokenizer.vocab, 64, pair=True)
    assert row_texts(data.batch, 0, tokenizer.vocab)[0] == tokenizer.encode_with_offsets("Bees")[0]


def test_skipped_records_warn(tmp_path, tokenizer):
    path = write(
        tmp_path,
        "snli.tsv",
        "sentence1\tsentence2\tgold_label\n"
        "Bees fly.\tBees move.\tentailment\n"
        "Bees fly.\tBees sleep.\t-\n"
        "\tBees sleep.\tneutral\n"
        "Rain falls.\tIt is dry.\tcontradiction\n",
    )
    with pytest.warns(UserWarning) as caught:
        batch = load(path, tokenizer)
    messages = " | ".join(str(w.message) for w in caught)
    assert "skipped 1 records with an empty text (first: line 4)" in messages
    assert "skipped 1 records labelled '-'" in messages and "line 3" in messages
    assert batch.batch_size == 2
    assert batch.extras["label"].tolist() == [1, 0]  # contradiction, entailment; neutral only on a skipped line


# -- heads sized from the data ---------------------------------------------------------------------


def test_head_has_as_many_outputs_as_labels(tmp_path, tokenizer):
    rows = "".join(f"Bees fly {i}.\tc{i}\n" for i in range(129))
    data = load_data(write(tmp_path, "many.tsv", "sentence\tlabel\n" + rows), tokenizer)
    assert num_classes(data) == 129  # no cap: a head as wide as the label set
    assert sorted(data.batch.extras["label"].tolist()) == list(range(129))


def test_sst2_builds_a_two_output_head(shared_file, tokenizer):
    task = objreg.Registry.load(load_entrypoints=False).get_task("classification")
    data = task.task_data(str(shared_file("glue/SST-2/dev.tsv")), [], tokenizer, seq_len=64, limit=8)
    assert data.heads == (objreg.HeadSpec("classification", "classifier", 2),)
    registry = objreg.Registry.load(load_entrypoints=False)
    tiny = {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "intermediate_size": 32}
    model = registry.load_model("default", tokenizer.vocab, data.heads, tiny, torch.Generator().manual_seed(0))
    head = model.heads["classification"]
    assert head.classifier.out_features == 2 and head.classifier.weight.shape == (2, 16)
    batch = data.batch
    hidden = model.encode(batch.input_ids, task.attention_mask(batch), batch.position_ids)
    assert head(hidden).shape == (8, 2)
    loss = task.loss(objreg.ModelOutputs(hidden, model), batch)
    assert loss.shape == (8,) and torch.isfinite(loss).all()


# -- the built-in same-document set ---------------------------------------------------------------


def test_same_document_pairs_are_labelled_right(documents):
    triples = cls.same_document_pairs(documents, 1000, seed=0)
    anchors = sum(len(d) for d in documents if len(d) >= 2)
    assert len(triples) == anchors  # one example per sentence of a multi-sentence document
    home = {s: d for d, doc in enumerate(documents) for s in doc}  # the fixture's sentences are unique
    for anchor, partner, label in triples:
        assert anchor != partner
        assert label == int(home[anchor] == home[partner])
    labels = [label for _, _, label in triples]
    assert 0 < sum(labels) < len(labels)


def test_same_document_label_rate(documents):
    many = [list(doc) for doc in documents] * 50
    labels = torch.tensor([label for _, _, label in cls.same_document_pairs(many, 10_000, seed=3)], dtype=torch.float)
    # Bernoulli(1/2): 5 standard deviations of the mean
    assert abs(labels.mean().item() - 0.5) < 5 * 0.5 / len(labels) ** 0.5


def test_builtin_set_is_deterministic_and_seeded(task, tokenizer, documents):
    data = task.task_data(None, documents, tokenizer, seq_len=64, limit=12)
    a, b = data.batch, task.task_data(None, documents, tokenizer, seq_len=64, limit=12).batch
    check_layout(data, tokenizer.vocab, 64, pair=True)
    assert a.batch_size == 12
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.extras["label"], b.extras["label"])
    assert num_classes(data) == 2
    other = cls.objreg_task_data(None, documents, tokenizer, 64, 12, {**PARAMS, "seed": 1}).batch
    assert not torch.equal(a.input_ids, other.input_ids)
    # the first anchors come one document after another
    first_texts = [tokenizer.decode(row_texts(a, b, tokenizer.vocab)[0]) for b in range(len(documents))]
    assert first_texts == [tokenizer.decode(tokenizer.encode_with_offsets(d[0])[0]) for d in documents]


def test_builtin_set_needs_documents(task, tokenizer):
    with pytest.raises(objreg.DataError, match=r"too few held-out documents .*\(1 documents"):
        cls.objreg_task_data(None, [["One sentence.", "Two sentences."]], tokenizer, 64, 10, PARAMS)
    with pytest.raises(objreg.DataError, match=r"too few held-out documents"):
        cls.objreg_task_data(None, [["One."], ["Two."]], tokenizer, 64, 10, PARAMS)
    with pytest.raises(objreg.InvalidParameterError, match="task 'classification': limit must be an integer of at"):
        task.task_data(None, [["One."], ["Two."]], tokenizer, 64, 0)


# -- attention mask and loss ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def mixed_data(tmp_path_factory, tokenizer) -> objreg.TaskData:
    """Rows of a 3-class single-sentence file, labels of every class, padded rows included."""
    path = write(
        tmp_path_factory.mktemp("cls"),
        "three.tsv",
        "sentence\tlabel\n"
        "Bees collect nectar from flowers and store honey.\tb\nRain falls.\ta\nThe queen lays eggs.\tc\n"
        "Deltas form where the current slows.\ta\nMountains.\tc\n",
    )
    return load_data(path, tokenizer)


@pytest.fixture(scope="module")
def mixed_batch(mixed_data) -> objreg.CorruptedBatch:
    return mixed_data.batch


def test_attention_mask_is_bidirectional(task, mixed_batch):
    B, T = mixed_batch.input_ids.shape
    expected = (~mixed_batch.is_padding)[:, None, :].expand(B, T, T)
    assert torch.equal(task.attention_mask(mixed_batch), expected)


def test_loss_is_the_cross_entropy_of_the_sized_head(task, mixed_data, mixed_batch, stand_in_model):
    B, T = mixed_batch.input_ids.shape
    H = 8
    assert num_classes(mixed_data) == 3
    model = stand_in_model("classification", H, 3, first_token=True)
    hidden = torch.randn(B, T, H, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    loss = task.loss(objreg.ModelOutputs(hidden, model), mixed_batch)
    assert loss.shape == (B,)
    with torch.no_grad():  # the 3-way head
        logits = hidden[:, 0] @ model.head.weight.T + model.head.bias
        expected = F.cross_entropy(logits, mixed_batch.extras["label"], reduction="none")
    torch.testing.assert_close(loss, expected, rtol=1e-12, atol=1e-12)


def test_sized_head_equals_the_old_masked_wide_head(task, mixed_batch):
    """A C-output head gives the loss the old 128-output head gave with its unused logits masked
    (their exp is exactly 0), when its weight is the first C rows of the wide one."""
    B, T = mixed_batch.input_ids.shape
    H, wide = 8, 128
    g = torch.Generator().manual_seed(4)
    hidden = torch.randn(B, T, H, dtype=torch.float64, generator=g)
    weight, bias = torch.randn(wide, H, dtype=torch.float64, generator=g), torch.randn(wide, dtype=torch.float64, generator=g)
    logits = hidden[:, 0] @ weight.T + bias  # (B, 128)
    floor = torch.finfo(logits.dtype).min
    masked = torch.where(torch.arange(wide) < 3, logits, floor)  # the old loss's masking, num_classes = 3
    old = torch.logsumexp(masked, dim=1) - masked.gather(1, mixed_batch.extras["label"][:, None]).squeeze(1)
    sized = types.SimpleNamespace(heads={"classification": lambda h: logits[:, :3]})
    assert torch.equal(task.loss(objreg.ModelOutputs(hidden, sized), mixed_batch), old)  # the same logits: bit for bit
    narrow = types.SimpleNamespace(heads={"classification": lambda h: h[:, 0] @ weight[:3].T + bias[:3]})
    torch.testing.assert_close(task.loss(objreg.ModelOutputs(hidden, narrow), mixed_batch), old, rtol=1e-13, atol=1e-13)


def test_loss_is_transform_safe(task, mixed_batch, stand_in_model):
    """vmap(grad) with a batch of one per example and jvp agree with ordinary autograd."""
    B, T = mixed_batch.input_ids.shape
    H = 8
    model = stand_in_model("classification", H, 3, first_token=True)
    hidden = torch.randn(B, T, H, dtype=torch.float64, generator=torch.Generator().manual_seed(2))

    def one(h: torch.Tensor, example: objreg.CorruptedBatch) -> torch.Tensor:
        batch = objreg.CorruptedBatch(*(t[None] for t in example[:5]), {k: v[None] for k, v in example.extras.items()})
        return task.loss(objreg.ModelOutputs(h[None], model), batch)[0]

    per_sample = torch.func.vmap(torch.func.grad(one))(hidden, mixed_batch)
    leaf = hidden.clone().requires_grad_(True)
    (expected,) = torch.autograd.grad(task.loss(objreg.ModelOutputs(leaf, model), mixed_batch).sum(), leaf)
    torch.testing.assert_close(per_sample, expected)
    assert (expected[:, 1:] == 0).all()  # only [CLS] feeds the classifier

    direction = torch.randn_like(hidden)
    _, tangent = torch.func.jvp(
        lambda h: task.loss(objreg.ModelOutputs(h, model), mixed_batch), (hidden,), (direction,)
    )
    torch.testing.assert_close(tangent, (expected * direction).sum(dim=(1, 2)))
