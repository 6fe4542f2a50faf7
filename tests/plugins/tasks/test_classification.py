"""Tests of the ``classification`` downstream task: GLUE TSV and JSONL loading (real SST-2 and RTE
dev files where present), the label set, malformed files, the built-in same-document pairs, and
the loss against an independent float64 computation and under vmap/jvp."""

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
from torch import nn

import objreg
from objreg.plugins.tasks import classification as cls

PARAMS = {"text_field": "", "text_pair_field": "", "label_field": "", "labels": "", "seed": 0}


@pytest.fixture(scope="module")
def task() -> objreg.Objective:
    return objreg.Registry.load(load_entrypoints=False).get_task("classification")


@pytest.fixture(scope="module")
def documents(texts) -> list[list[str]]:
    return [objreg.split_sentences(t) for t in texts]


def load(path, tokenizer, seq_len=64, limit=1000, **params) -> objreg.CorruptedBatch:
    return cls.objreg_task_data(str(path), [], tokenizer, seq_len, limit, {**PARAMS, **params})


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


def check_layout(batch: objreg.CorruptedBatch, vocab: objreg.Vocabulary, seq_len: int, pair: bool) -> None:
    B, T = batch.input_ids.shape
    assert T <= seq_len
    assert (batch.labels == objreg.IGNORE_INDEX).all()
    assert torch.equal(batch.is_padding, batch.input_ids == vocab.pad_id)
    assert torch.equal(batch.position_ids, torch.arange(T).expand(B, T))
    assert (batch.input_ids[:, 0] == vocab.cls_id).all()
    seps = (batch.input_ids == vocab.sep_id).sum(dim=1)
    assert (seps == (2 if pair else 1)).all()
    segment = batch.extras["segment_ids"]
    assert not (segment.bool() & batch.is_padding).any()
    if pair:  # segment 1 runs from just after the first [SEP] to the last one, inclusive
        first_sep = (batch.input_ids == vocab.sep_id).long().argmax(dim=1)
        length = (~batch.is_padding).sum(dim=1)
        j = torch.arange(T)[None]
        assert torch.equal(segment.bool(), (j > first_sep[:, None]) & (j < length[:, None]))
    else:
        assert (segment == 0).all()
    label, num_classes = batch.extras["label"], batch.extras["num_classes"]
    assert label.shape == (B,) and num_classes.shape == (B,)
    assert ((label >= 0) & (label < num_classes)).all()


# -- info and registry ----------------------------------------------------------------------------


def test_registered_as_a_downstream_task(task):
    assert "classification" in objreg.Registry.load(load_entrypoints=False).tasks()
    assert task.info.kind == "downstream"
    assert task.info.heads == (objreg.HeadSpec("classification", "classifier", cls.MAX_CLASSES),)
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
    assert cls.fit_lengths(lengths, budget) == longest_first_loop(lengths, budget)


def test_long_pair_is_cut_longest_first(tmp_path, tokenizer):
    long = " ".join(["bees collect nectar from flowers"] * 20)
    path = write(
        tmp_path, "pair.tsv", f"sentence1\tsentence2\tlabel\n{long}\tthe queen lays the eggs\tyes\nshort\t{long}\tno\n"
    )
    batch = load(path, tokenizer, seq_len=40)
    check_layout(batch, tokenizer.vocab, 40, pair=True)
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
    batch = load(path, tokenizer, seq_len=64)
    check_layout(batch, tokenizer.vocab, 64, pair=False)
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
    batch = load(path, tokenizer, seq_len=128)
    check_layout(batch, tokenizer.vocab, 128, pair=True)
    with path.open(encoding="utf-8", newline="") as f:  # this export is CSV-quoted
        rows = list(csv.DictReader(f, delimiter="\t"))
    assert batch.batch_size == len(rows) == 277
    assert torch.bincount(batch.extras["label"]).tolist() == [146, 131]
    records, classes = cls.read_records(path, PARAMS)
    assert classes == ["0", "1"]
    assert [(r.text, r.pair, r.label) for r in records] == [(r["sentence1"], r["sentence2"], r["label"]) for r in rows]
    quoted = records[13]  # line 15: "... famed as ""Dr. Death,"" has ..."
    assert quoted.line == 15 and 'famed as "Dr. Death," has' in quoted.text and not quoted.text.startswith('"')


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
    records, classes = cls.read_records(path, PARAMS)
    assert classes == ["entailment", "not_entailment"]  # alphabetical
    assert records[0].text == 'Bees said "hello" twice.' and records[2].text == 'He said "no" twice.'
    batch = load(path, tokenizer)
    assert batch.extras["label"].tolist() == [1, 0, 0]
    assert batch.extras["num_classes"].tolist() == [2, 2, 2]
    fixed = load(path, tokenizer, labels="not_entailment,entailment")  # the parameter fixes the order
    assert fixed.extras["label"].tolist() == [0, 1, 1]


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
    records, classes = cls.read_records(single, PARAMS)
    assert classes == ["2", "7", "10"]  # numeric order, not "10" < "2"
    batch = load(single, tokenizer)
    check_layout(batch, tokenizer.vocab, 64, pair=False)
    assert batch.extras["label"].tolist() == [2, 0, 2, 1]
    assert batch.extras["num_classes"].tolist() == [3] * 4

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
    batch = load(pair, tokenizer)
    check_layout(batch, tokenizer.vocab, 64, pair=True)
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
    batch = load(path, tokenizer, text_field="review", label_field="stars")
    check_layout(batch, tokenizer.vocab, 64, pair=False)
    batch = load(path, tokenizer, text_field="title", text_pair_field="review", label_field="stars")
    check_layout(batch, tokenizer.vocab, 64, pair=True)
    assert row_texts(batch, 0, tokenizer.vocab)[0] == tokenizer.encode_with_offsets("Bees")[0]


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


# -- malformed files --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("empty.tsv", "", r"empty\.tsv: the file is empty; allowed: a TSV file"),
        ("blank.jsonl", "\n\n", r"blank\.jsonl: the file is empty"),
        ("header.tsv", "sentence\tlabel\n", r"header\.tsv: no classification record after the header"),
        (
            "nolabel.tsv",
            "sentence\tscore\nBees fly.\t1\n",
            r"nolabel\.tsv: the header \(line 1\) has no label field \(its fields: 'sentence', 'score'\); expected one of label",
        ),
        ("notext.tsv", "words\tlabel\nBees fly.\t1\n", r"notext\.tsv: the header \(line 1\) has no text field"),
        (
            "fields.tsv",
            "sentence\tlabel\nBees fly.\t1\nRain\tfalls.\t0\n",
            r"fields\.tsv line 3: 3 tab-separated fields, but the header has 2 \(sentence, label\)",
        ),
        ("emptylabel.tsv", "sentence\tlabel\nBees fly.\t \n", r"emptylabel\.tsv line 2: empty 'label' field"),
        (
            "bad.jsonl",
            '{"text": "a", "label": 1}\n{"text": "b", "label": 0}\n{"text": "c", "label": 1\n',
            r"bad\.jsonl line 3: not valid JSON \(Expecting ',' delimiter, column 25\)",
        ),
        ("array.jsonl", '["text", "label"]\n', r"array\.jsonl line 1: a JSON array, not an object"),
        (
            "float.jsonl",
            '{"text": "a", "label": 1}\n{"text": "b", "label": 0.5}\n',
            r"float\.jsonl line 2: 'label' is a JSON number \(0\.5\); a label must be a non-empty string or an integer",
        ),
        ("bool.jsonl", '{"text": "a", "label": true}\n', r"line 1: 'label' is a JSON boolean \(true\)"),
        ("null.jsonl", '{"text": "a", "label": null}\n', r"line 1: 'label' is a JSON null \(null\)"),
        ("list.jsonl", '{"text": "a", "label": [1]}\n', r"line 1: 'label' is a JSON array \(\[1\]\)"),
        ("nolabel.jsonl", '{"text": "a", "label": 1}\n{"text": "b"}\n', r"nolabel\.jsonl line 2: no 'label' field"),
        ("textnum.jsonl", '{"text": 5, "label": 1}\n', r"line 1: 'text' must be a string, got integer"),
        (
            "nopair.jsonl",
            '{"text": "a", "text_pair": "b", "label": 1}\n{"text": "c", "label": 0}\n',
            r"nopair\.jsonl line 2: no 'text_pair' field, which the first record has",
        ),
        (
            "oneclass.tsv",
            "sentence\tlabel\nBees fly.\tpos\nRain falls.\tpos\n",
            r"oneclass\.tsv: every record has the label 'pos'; classification needs 2 classes",
        ),
    ],
)
def test_malformed_files_name_file_line_and_what_is_allowed(tmp_path, tokenizer, name, text, message):
    path = write(tmp_path, name, text)
    with pytest.raises(objreg.DataError, match=message):
        load(path, tokenizer)


def test_too_many_classes_and_labels_parameter(tmp_path, tokenizer):
    rows = "".join(f"Bees fly {i}.\tc{i}\n" for i in range(cls.MAX_CLASSES + 1))
    path = write(tmp_path, "many.tsv", "sentence\tlabel\n" + rows)
    with pytest.raises(objreg.DataError, match=rf"{cls.MAX_CLASSES + 1} distinct labels; .* at most {cls.MAX_CLASSES}"):
        load(path, tokenizer)
    path = write(tmp_path, "two.tsv", "sentence\tlabel\nBees fly.\tpos\nRain falls.\tneutral\n")
    with pytest.raises(
        objreg.DataError, match=r"two\.tsv line 3: label 'neutral' is not in the labels parameter \(pos, neg\)"
    ):
        load(path, tokenizer, labels="pos,neg")


def test_missing_file_and_bad_bytes(tmp_path, tokenizer):
    with pytest.raises(objreg.DataError, match=r"nothere\.tsv does not exist"):
        load(tmp_path / "nothere.tsv", tokenizer)
    with pytest.raises(objreg.DataError, match=r"is a directory"):
        load(tmp_path, tokenizer)
    path = tmp_path / "latin1.tsv"
    path.write_bytes("sentence\tlabel\ncaf\xe9 au lait\t1\n".encode("latin-1"))
    with pytest.raises(objreg.DataError, match=r"latin1\.tsv line 2: not UTF-8 text"):
        load(path, tokenizer)


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
    a = task.task_data(None, documents, tokenizer, seq_len=64, limit=12)
    b = task.task_data(None, documents, tokenizer, seq_len=64, limit=12)
    check_layout(a, tokenizer.vocab, 64, pair=True)
    assert a.batch_size == 12
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.extras["label"], b.extras["label"])
    assert (a.extras["num_classes"] == 2).all()
    other = cls.objreg_task_data(None, documents, tokenizer, 64, 12, {**PARAMS, "seed": 1})
    assert not torch.equal(a.input_ids, other.input_ids)
    # the first anchors come one document after another
    first_texts = [tokenizer.decode(row_texts(a, b, tokenizer.vocab)[0]) for b in range(len(documents))]
    assert first_texts == [tokenizer.decode(tokenizer.encode_with_offsets(d[0])[0]) for d in documents]


def test_builtin_set_needs_documents(tokenizer):
    with pytest.raises(objreg.DataError, match=r"too few held-out documents .*\(1 documents"):
        cls.objreg_task_data(None, [["One sentence.", "Two sentences."]], tokenizer, 64, 10, PARAMS)
    with pytest.raises(objreg.DataError, match=r"too few held-out documents"):
        cls.objreg_task_data(None, [["One."], ["Two."]], tokenizer, 64, 10, PARAMS)
    with pytest.raises(objreg.InvalidParameterError, match="limit must be at least 1"):
        cls.objreg_task_data(None, [["One."], ["Two."]], tokenizer, 64, 0, PARAMS)


# -- attention mask and loss ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def mixed_batch(tmp_path_factory, tokenizer) -> objreg.CorruptedBatch:
    """Rows of a 3-class single-sentence file, labels of every class, padded rows included."""
    path = write(
        tmp_path_factory.mktemp("cls"),
        "three.tsv",
        "sentence\tlabel\n"
        "Bees collect nectar from flowers and store honey.\tb\nRain falls.\ta\nThe queen lays eggs.\tc\n"
        "Deltas form where the current slows.\ta\nMountains.\tc\n",
    )
    return load(path, tokenizer)


def stand_in_model(hidden_size: int) -> types.SimpleNamespace:
    torch.manual_seed(0)
    head = nn.Sequential(nn.Linear(hidden_size, cls.MAX_CLASSES))
    return types.SimpleNamespace(heads={"classification": lambda h: head(h[:, 0])}, head=head.double())


def test_attention_mask_is_bidirectional(task, mixed_batch):
    B, T = mixed_batch.input_ids.shape
    expected = (~mixed_batch.is_padding)[:, None, :].expand(B, T, T)
    assert torch.equal(task.attention_mask(mixed_batch), expected)


def test_loss_is_the_cross_entropy_of_a_num_classes_head(task, mixed_batch):
    B, T = mixed_batch.input_ids.shape
    H = 8
    model = stand_in_model(H)
    hidden = torch.randn(B, T, H, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    loss = task.loss(objreg.ModelOutputs(hidden, model), mixed_batch)
    assert loss.shape == (B,) and mixed_batch.extras["num_classes"].tolist() == [3] * B
    with torch.no_grad():  # a 3-way head made of the first three rows of the weight
        small = model.head[0].weight[:3], model.head[0].bias[:3]
        logits = hidden[:, 0] @ small[0].T + small[1]
        expected = F.cross_entropy(logits, mixed_batch.extras["label"], reduction="none")
    torch.testing.assert_close(loss, expected, rtol=1e-12, atol=1e-12)
    # the unused outputs carry no probability: raising them changes nothing
    bumped = types.SimpleNamespace(
        heads={
            "classification": lambda h: model.heads["classification"](h) + 50.0 * (torch.arange(cls.MAX_CLASSES) >= 3)
        }
    )
    torch.testing.assert_close(task.loss(objreg.ModelOutputs(hidden, bumped), mixed_batch), loss)


def test_loss_is_transform_safe(task, mixed_batch):
    """vmap(grad) with a batch of one per example and jvp agree with ordinary autograd."""
    B, T = mixed_batch.input_ids.shape
    H = 8
    model = stand_in_model(H)
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
