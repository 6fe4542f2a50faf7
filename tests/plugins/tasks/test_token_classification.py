"""Tests of the ``token_classification`` downstream task: tag alignment to first subwords against a
Hugging Face-style loop over word ids, CoNLL and JSONL rows, heads sized from the data's tags, the
built-in lexical tags, and the loss against a float64 loop, with padding and unlabelled positions
inert. The file readers' validation is tested in tests/toolkit/test_tagfiles.py."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import objreg
from objreg.plugins.tasks import token_classification as tc

PARAMS = {"tokens_field": "", "tags_field": "", "labels": "", "label_all_tokens": False}
IGNORE = objreg.IGNORE_INDEX

# Long invented words split into several subwords with the small test tokenizer.
CONLL = """-DOCSTART- -X- -X- O

Bees NNS B-NP B-ANIMAL
collect VBP B-VP O
nectarofragrantly RB B-ADVP O
in IN B-PP O
Transylvaniaburg NNP B-NP B-LOC
. . O O

The DT B-NP O
queen NN I-NP B-ANIMAL
lays VBZ B-VP O
"""


@pytest.fixture(scope="module")
def task() -> objreg.Objective:
    return objreg.Registry.load(load_entrypoints=False).get_task("token_classification")


@pytest.fixture(scope="module")
def documents(texts) -> list[list[str]]:
    return [objreg.split_sentences(t) for t in texts]


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def load_data(path, tokenizer, seq_len=64, limit=1000, **params) -> objreg.TaskData:
    return tc.objreg_task_data(str(path), [], tokenizer, seq_len, limit, {**PARAMS, **params})


def load(path, tokenizer, seq_len=64, limit=1000, **params) -> objreg.CorruptedBatch:
    return load_data(path, tokenizer, seq_len, limit, **params).batch


def num_tags(data: objreg.TaskData) -> int:
    """The width of the token head the task sized from its data."""
    (head,) = data.heads
    assert (head.name, head.kind) == ("token_classification", "token_classifier")
    return head.num_outputs


def hf_style_labels(word_ids: list[int], tags: list[int], label_all_tokens: bool) -> list[int]:
    """Hugging Face's tokenize_and_align_labels loop (run_ner.py), with -1 for a None word id."""
    out, previous = [], None
    for w in word_ids:
        if w == -1:
            out.append(IGNORE)
        elif w != previous:
            out.append(tags[w])
        else:
            out.append(tags[w] if label_all_tokens else IGNORE)
        previous = w if w != -1 else None
    return out


def check_alignment(batch, sentences, tag_ids, tokenizer, label_all_tokens=False) -> None:
    """Each row: the subwords of word w are exactly w's own encoding, in order, and the labels
    are what the Hugging Face loop gives from the word ids."""
    vocab = tokenizer.vocab
    for b, (words, tags) in enumerate(sentences):
        n = int((~batch.is_padding[b]).sum())
        ids = batch.input_ids[b, :n].tolist()
        word_ids = batch.extras["word_ids"][b, :n].tolist()
        assert ids[0] == vocab.cls_id and ids[-1] == vocab.sep_id
        assert word_ids[0] == word_ids[-1] == -1
        expected_ids = [t for w in words for t in tokenizer.encode_with_offsets(w)[0]]
        expected_words = [i for i, w in enumerate(words) for _ in tokenizer.encode_with_offsets(w)[0]]
        assert ids[1:-1] == expected_ids
        assert word_ids[1:-1] == expected_words
        labels = hf_style_labels(word_ids, [tag_ids[t] for t in tags], label_all_tokens)
        assert batch.labels[b, :n].tolist() == labels
        assert (batch.labels[b, n:] == IGNORE).all() and (batch.extras["word_ids"][b, n:] == -1).all()


# -- registry and info ----------------------------------------------------------------------------


def test_registered_as_a_downstream_task(task):
    assert "token_classification" in objreg.Registry.load(load_entrypoints=False).tasks()
    assert task.info.kind == "downstream"
    assert task.info.heads == (objreg.HeadSpec("token_classification", "token_classifier"),)  # sized from the data
    assert set(task.params) == set(PARAMS)


# -- alignment --------------------------------------------------------------------------------------


SENTENCES = [
    (
        ["Bees", "collect", "nectarofragrantly", "in", "Transylvaniaburg", "."],
        ["B-ANIMAL", "O", "O", "O", "B-LOC", "O"],
    ),
    (["The", "queen", "lays"], ["O", "B-ANIMAL", "O"]),
]
TAG_IDS = {"B-ANIMAL": 0, "B-LOC": 1, "O": 2}  # alphabetical


def test_conll_tags_land_on_first_subwords(tmp_path, tokenizer):
    data = load_data(write(tmp_path, "ner.conll", CONLL), tokenizer)
    batch = data.batch
    assert batch.batch_size == 2
    long_words = [w for w in SENTENCES[0][0] if len(tokenizer.encode_with_offsets(w)[0]) > 2]
    assert len(long_words) == 2  # the test exercises multi-subword words
    check_alignment(batch, SENTENCES, TAG_IDS, tokenizer)
    assert num_tags(data) == 3 and set(batch.extras) == {"word_ids"}
    # labelled positions: one per word
    assert (batch.labels != IGNORE).sum(dim=1).tolist() == [6, 3]


def test_label_all_tokens(tmp_path, tokenizer):
    batch = load(write(tmp_path, "ner.conll", CONLL), tokenizer, label_all_tokens=True)
    check_alignment(batch, SENTENCES, TAG_IDS, tokenizer, label_all_tokens=True)
    real = batch.extras["word_ids"] >= 0
    assert torch.equal(batch.labels != IGNORE, real)


def test_jsonl_with_integer_tags_in_numeric_order(tmp_path, tokenizer):
    records = [
        {"id": "0", "tokens": ["Bees", "collect", "nectarofragrantly"], "ner_tags": [10, 0, 2]},
        {"id": "1", "tokens": ["The", "queen"], "ner_tags": [0, 10]},
    ]
    path = write(tmp_path, "ner.jsonl", "\n".join(json.dumps(r) for r in records) + "\n")
    data = load_data(path, tokenizer)
    batch = data.batch
    assert num_tags(data) == 3
    ids = {"0": 0, "2": 1, "10": 2}  # numeric order
    check_alignment(batch, [(r["tokens"], [str(t) for t in r["ner_tags"]]) for r in records], ids, tokenizer)
    fixed_data = load_data(path, tokenizer, labels="10,2,0,7")  # the parameter fixes order and size
    fixed = fixed_data.batch
    assert num_tags(fixed_data) == 4
    first = fixed.labels[0][fixed.labels[0] != IGNORE].tolist()
    assert first == [0, 2, 1]


def test_limit_is_evenly_spaced(tmp_path, tokenizer):
    text = "".join(f"word{i}\tT{i % 3}\n\n" for i in range(20))
    path = write(tmp_path, "many.conll", text)
    batch = load(path, tokenizer, limit=5)
    assert batch.batch_size == 5
    picked = [i * 20 // 5 for i in range(5)]
    expected = [tokenizer.encode_with_offsets(f"word{i}")[0] for i in picked]
    assert [batch.input_ids[b][1 : 1 + len(e)].tolist() for b, e in enumerate(expected)] == expected


def test_truncation_and_dropped_words_warn(tmp_path, tokenizer):
    long = "".join("bees\tO\ncollect\tV\n" for _ in range(20))
    path = write(tmp_path, "long.conll", long + "\nThe\tO\n\x07\tX\nqueen\tN\n")
    with pytest.warns(UserWarning) as caught:
        batch = load(path, tokenizer, seq_len=16)
    messages = " | ".join(str(w.message) for w in caught)
    assert "cut 1 sentences longer than seq_len 16" in messages
    assert "dropped 1 words that the tokenizer turns into no token" in messages
    assert batch.input_ids.shape[1] == 16
    assert batch.input_ids[0, 15] == tokenizer.vocab.sep_id
    # the dropped word keeps the other words' alignment: "queen" is word 2 of its sentence
    word_ids = batch.extras["word_ids"][1]
    queen = (word_ids == 2).nonzero().flatten()
    assert queen.numel() > 0 and batch.labels[1, queen[0]] == ["N", "O", "V", "X"].index("N")
    assert not (word_ids == 1).any()


# -- heads sized from the data ---------------------------------------------------------------------


def test_head_has_as_many_outputs_as_tags(tmp_path, tokenizer):
    data = load_data(write(tmp_path, "many.conll", "".join(f"w\tT{i}\n\n" for i in range(129))), tokenizer)
    assert num_tags(data) == 129  # no cap: a head as wide as the tag set
    task = objreg.Registry.load(load_entrypoints=False).get_task("token_classification")
    assert task.task_data(str(tmp_path / "many.conll"), [], tokenizer, 64, 10).heads == data.heads


def test_empty_records_are_skipped_with_a_warning(tmp_path, tokenizer):
    empty = write(tmp_path, "empty.jsonl", '{"tokens": [], "tags": []}\n{"tokens": ["a"], "tags": ["O"]}\n')
    with pytest.warns(UserWarning, match=r"skipped 1 records with no tokens \(first: line 1\)"):
        assert load(empty, tokenizer).batch_size == 1


def test_a_built_model_has_the_sized_head(task, tokenizer, documents):
    data = task.task_data(None, documents, tokenizer, seq_len=64, limit=4)
    registry = objreg.Registry.load(load_entrypoints=False)
    tiny = {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "intermediate_size": 32}
    model = registry.load_model("default", tokenizer.vocab, data.heads, tiny, torch.Generator().manual_seed(0))
    assert model.heads["token_classification"].weight.shape == (len(tc.BUILTIN_TAGS), 16)
    batch = data.batch
    hidden = model.encode(batch.input_ids, task.attention_mask(batch), batch.position_ids)
    assert torch.isfinite(task.loss(objreg.ModelOutputs(hidden, model), batch)).all()


# -- the built-in lexical tags ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("word", "tag"),
    [
        ("the", "FUNC"),
        ("The", "FUNC"),
        ("BETWEEN", "FUNC"),
        ("library", "WORD"),
        ("don't", "WORD"),
        ("os.path", "CODE"),
        ("os.path.join()", "CODE"),
        ("close()", "CODE"),
        ("__init__", "CODE"),
        ("utf8", "CODE"),
        ("e.g", "WORD"),
        ("3.4", "NUM"),
        ("2,047", "NUM"),
        ("1993", "NUM"),
        (".", "PUNCT"),
        ("'", "PUNCT"),
        ("(", "PUNCT"),
    ],
)
def test_builtin_tag_rule(word, tag):
    assert tc.builtin_tag(word) == tag


def test_builtin_words():
    assert tc.builtin_words("Call os.path.join() on self._file, e.g. twice.") == [
        "Call",
        "os.path.join()",
        "on",
        "self._file",
        ",",
        "e.g",
        ".",
        "twice",
        ".",
    ]


def test_builtin_set(task, tokenizer, documents):
    data = task.task_data(None, documents, tokenizer, seq_len=64, limit=100)
    batch = data.batch
    a_again = task.task_data(None, documents, tokenizer, seq_len=64, limit=100).batch
    assert torch.equal(batch.input_ids, a_again.input_ids) and torch.equal(batch.labels, a_again.labels)
    order = [s for k in range(max(map(len, documents))) for d in documents if k < len(d) for s in [d[k]]]
    assert batch.batch_size == len(order)  # every sentence, one document after another
    tag_ids = {t: i for i, t in enumerate(tc.BUILTIN_TAGS)}
    sentences = [(tc.builtin_words(s), [tc.builtin_tag(w) for w in tc.builtin_words(s)]) for s in order]
    check_alignment(batch, sentences, tag_ids, tokenizer)
    assert num_tags(data) == len(tc.BUILTIN_TAGS)
    small = task.task_data(None, documents, tokenizer, seq_len=64, limit=3).batch
    assert small.batch_size == 3
    with pytest.raises(objreg.DataError, match=r"too few held-out sentences"):
        task.task_data(None, [], tokenizer, seq_len=64, limit=3)


# -- attention mask and loss ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def batch(tmp_path_factory, tokenizer) -> objreg.CorruptedBatch:
    path = write(tmp_path_factory.mktemp("tok"), "ner.conll", CONLL)
    data = load_data(path, tokenizer)
    assert num_tags(data) == 3
    return data.batch


def loop_loss(logits: torch.Tensor, batch: objreg.CorruptedBatch) -> torch.Tensor:
    """Per row, the mean float64 cross-entropy over the labelled positions, found one by one."""
    out = []
    for b in range(logits.shape[0]):
        terms = [
            F.cross_entropy(logits[b, t][None].double(), batch.labels[b, t][None])
            for t in range(logits.shape[1])
            if int(batch.labels[b, t]) != IGNORE and not bool(batch.is_padding[b, t])
        ]
        out.append(torch.stack(terms).mean())
    return torch.stack(out)


def test_attention_mask_is_bidirectional(task, batch):
    B, T = batch.input_ids.shape
    expected = (~batch.is_padding)[:, None, :].expand(B, T, T)
    assert torch.equal(task.attention_mask(batch), expected)


def test_loss_matches_a_loop_over_labelled_positions(task, batch, stand_in_model):
    B, T = batch.input_ids.shape
    assert batch.is_padding.any()  # the second row is padded
    H = 8
    model = stand_in_model("token_classification", H, 3)
    hidden = torch.randn(B, T, H, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    loss = task.loss(objreg.ModelOutputs(hidden, model), batch)
    with torch.no_grad():
        expected = loop_loss(model.heads["token_classification"](hidden), batch)
    torch.testing.assert_close(loss, expected, rtol=1e-12, atol=1e-12)
    # unlabelled positions (later subwords, [CLS], [SEP], padding) are inert
    inert = (batch.labels == IGNORE)[..., None].expand(B, T, 3)
    head = model.heads["token_classification"]
    bumped = types.SimpleNamespace(heads={"token_classification": lambda h: head(h) + 50.0 * inert})
    torch.testing.assert_close(task.loss(objreg.ModelOutputs(hidden, bumped), batch), loss)


def test_sized_head_equals_the_old_masked_wide_head(task, batch):
    """A C-output head gives the loss of the old 128-output head with its unused logits masked,
    when its weight is the first C rows of the wide one."""
    B, T = batch.input_ids.shape
    H, wide = 8, 128
    g = torch.Generator().manual_seed(4)
    hidden = torch.randn(B, T, H, dtype=torch.float64, generator=g)
    weight, bias = torch.randn(wide, H, dtype=torch.float64, generator=g), torch.randn(wide, dtype=torch.float64, generator=g)
    logits = hidden @ weight.T + bias  # (B, T, 128)
    masked = torch.where(torch.arange(wide) < 3, logits, torch.finfo(logits.dtype).min)  # num_tags = 3
    labelled = (batch.labels != IGNORE) & ~batch.is_padding
    target = torch.where(labelled, batch.labels, 0)
    nll = torch.where(labelled, torch.logsumexp(masked, dim=2) - masked.gather(2, target[..., None]).squeeze(2), 0.0)
    old = nll.sum(dim=1) / labelled.sum(dim=1).clamp(min=1)
    sized = types.SimpleNamespace(heads={"token_classification": lambda h: logits[..., :3]})
    assert torch.equal(task.loss(objreg.ModelOutputs(hidden, sized), batch), old)  # the same logits: bit for bit
    narrow = types.SimpleNamespace(heads={"token_classification": lambda h: h @ weight[:3].T + bias[:3]})
    torch.testing.assert_close(task.loss(objreg.ModelOutputs(hidden, narrow), batch), old, rtol=1e-13, atol=1e-13)


def test_padding_is_excluded_by_position(task, batch, stand_in_model):
    """A label written at a padding position (which a buggy collator might leave) is ignored."""
    H = 8
    model = stand_in_model("token_classification", H, 3)
    B, T = batch.input_ids.shape
    hidden = torch.randn(B, T, H, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    labels = torch.where(batch.is_padding, 0, batch.labels)
    dirty = batch._replace(labels=labels)
    torch.testing.assert_close(
        task.loss(objreg.ModelOutputs(hidden, model), dirty), task.loss(objreg.ModelOutputs(hidden, model), batch)
    )


def test_loss_is_transform_safe(task, batch, stand_in_model):
    """vmap(grad) with a batch of one per example and jvp agree with ordinary autograd."""
    B, T = batch.input_ids.shape
    H = 8
    model = stand_in_model("token_classification", H, 3)
    hidden = torch.randn(B, T, H, dtype=torch.float64, generator=torch.Generator().manual_seed(2))

    def one(h: torch.Tensor, example: objreg.CorruptedBatch) -> torch.Tensor:
        single = objreg.CorruptedBatch(*(t[None] for t in example[:5]), {k: v[None] for k, v in example.extras.items()})
        return task.loss(objreg.ModelOutputs(h[None], model), single)[0]

    per_sample = torch.func.vmap(torch.func.grad(one))(hidden, batch)
    leaf = hidden.clone().requires_grad_(True)
    (expected,) = torch.autograd.grad(task.loss(objreg.ModelOutputs(leaf, model), batch).sum(), leaf)
    torch.testing.assert_close(per_sample, expected)
    unlabelled = batch.labels == IGNORE
    assert (expected[unlabelled] == 0).all() and (expected[~unlabelled].abs().sum(-1) > 0).all()

    direction = torch.randn_like(hidden)
    _, tangent = torch.func.jvp(lambda h: task.loss(objreg.ModelOutputs(h, model), batch), (hidden,), (direction,))
    torch.testing.assert_close(tangent, (expected * direction).sum(dim=(1, 2)))
