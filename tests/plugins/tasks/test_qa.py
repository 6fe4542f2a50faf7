"""Tests of the ``qa`` downstream task: the built-in cloze set, SQuAD rows and windows, the
attention mask, and the span loss against an independent float64 loop. The SQuAD reader's
validation is tested in tests/toolkit/test_squadfiles.py."""

from __future__ import annotations

import json
import types
import unicodedata
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import objreg
from objreg.plugins.tasks import qa
from objreg.toolkit.wordpiece import train_wordpiece

PARAMS = {"max_question_tokens": 32, "context_sentences": 2, "doc_stride": 128}


@pytest.fixture(scope="module")
def task() -> objreg.Objective:
    return objreg.Registry.load(load_entrypoints=False).get_task("qa")


@pytest.fixture(scope="module")
def documents(texts) -> list[list[str]]:
    return [objreg.split_sentences(t) for t in texts]


# -- helpers: read a row back independently of the plugin -----------------------------------------


def row_parts(batch: objreg.CorruptedBatch, b: int) -> tuple[list[int], list[int], list[int]]:
    """(question ids, context ids, answer ids) of row ``b``, found from the [SEP] positions."""
    ids = batch.input_ids[b][~batch.is_padding[b]].tolist()
    sep = ids.index(ids[-1])  # the row ends with [SEP]; its first occurrence closes the question
    start, end = int(batch.extras["start_positions"][b]), int(batch.extras["end_positions"][b])
    return ids[1:sep], ids[sep + 1 : -1], ids[start : end + 1]


def filled_question(tokenizer: objreg.Tokenizer, batch: objreg.CorruptedBatch, b: int) -> tuple[str, str]:
    """(question with [MASK] replaced by the answer tokens, context), both decoded."""
    question, context, answer = row_parts(batch, b)
    mask = tokenizer.vocab.mask_id
    filled = [t for q in question for t in (answer if q == mask else [q])]
    return tokenizer.decode(filled), tokenizer.decode(context)


def normalise(text: str) -> str:
    """Lower-case, accents and all whitespace removed: the WordPiece decoder puts spaces around
    punctuation ("1.5" decodes as "1. 5") and the BERT normaliser strips accents, neither of which
    says anything about whether the span is right."""
    decomposed = unicodedata.normalize("NFD", text.lower())
    return "".join(c for c in decomposed if not unicodedata.combining(c) and not c.isspace())


def check_layout(batch: objreg.CorruptedBatch, vocab: objreg.Vocabulary, seq_len: int) -> None:
    """The fixed row layout every qa batch must have."""
    B, T = batch.input_ids.shape
    assert T <= seq_len
    assert (batch.labels == objreg.IGNORE_INDEX).all()
    assert torch.equal(batch.position_ids, torch.arange(T).expand(B, T))
    assert torch.equal(batch.is_padding, batch.input_ids == vocab.pad_id)
    rows = torch.arange(B)[:, None].expand(B, T)
    assert torch.equal(batch.document_ids, torch.where(batch.is_padding, -1, rows))
    assert (batch.input_ids[:, 0] == vocab.cls_id).all()
    assert ((batch.input_ids == vocab.sep_id).sum(dim=1) == 2).all()
    ctx = batch.extras["context_mask"]
    assert ctx.dtype == torch.bool
    assert set(batch.extras) == {"start_positions", "end_positions", "context_mask"}  # no segment ids
    # context tokens are exactly those between the first [SEP] and the closing one
    is_sep = batch.input_ids == vocab.sep_id
    first_sep = is_sep.long().argmax(dim=1)
    length = (~batch.is_padding).sum(dim=1)
    j = torch.arange(T)[None]
    assert torch.equal(ctx, (j > first_sep[:, None]) & (j < length[:, None] - 1))
    assert not (ctx & batch.is_padding).any()
    start, end = batch.extras["start_positions"], batch.extras["end_positions"]
    assert start.dtype == torch.long and end.dtype == torch.long
    assert (start <= end).all()


def check_answers_in_context(batch: objreg.CorruptedBatch) -> None:
    start, end = batch.extras["start_positions"], batch.extras["end_positions"]
    b = torch.arange(batch.batch_size)
    ctx = batch.extras["context_mask"]
    assert ctx[b, start].all() and ctx[b, end].all()


# -- info and registry ----------------------------------------------------------------------------


def test_registry_returns_the_task(task, tokenizer, documents):
    assert task.info.kind == "downstream"
    assert task.info.heads == (objreg.HeadSpec("qa", "span"),)
    assert "qa" in objreg.Registry.load(load_entrypoints=False).tasks()
    data = task.task_data(None, documents, tokenizer, seq_len=64, limit=5)
    assert data.heads == (objreg.HeadSpec("qa", "span"),)  # a span head needs no size from the data
    batch = data.batch
    assert batch.batch_size == 5
    check_layout(batch, tokenizer.vocab, 64)


# -- choosing the cloze answer ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sentence", "answer"),
    [
        ("The orchestra played a symphony by Johannes Brahms.", "Johannes Brahms"),  # a capitalised run
        ("Paris hosted the games in July.", "July"),  # a sentence-initial capital does not count
        ("The bridge opened in 1874 after Halvorsen left.", "1874"),  # the first entity-like word wins
        ("It approved the budget for the new library.", "approved"),  # longest content word, first of ties
        ("Bees collect nectar.", "collect"),
    ],
)
def test_cloze_answer_rule(sentence, answer):
    span = qa.cloze_answer(sentence)
    assert span is not None
    assert sentence[span[0] : span[1]] == answer


def test_cloze_answer_none_without_content_word():
    assert qa.cloze_answer("It is on the way.") is None
    assert qa.cloze_answer("") is None


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from("abcXYZ019 .,'-"), max_size=40))
def test_cloze_answer_is_a_content_span(sentence):
    span = qa.cloze_answer(sentence)
    if span is None:
        return
    text = sentence[span[0] : span[1]]
    assert text.strip() == text and text
    first = text.split()[0]
    assert first.lower() not in qa.STOPWORDS
    assert first.isdigit() or first[0].isupper() or (first.isalpha() and len(first) >= 5)


# -- the built-in cloze set --------------------------------------------------------------------------


def test_cloze_answers_decode_and_questions_are_masked(task, tokenizer, documents):
    batch = task.task_data(None, documents, tokenizer, seq_len=64, limit=100).batch
    check_layout(batch, tokenizer.vocab, 64)
    check_answers_in_context(batch)
    assert batch.batch_size == sum(len(d) for d in documents)  # every fixture sentence has an answer
    answers = set()
    for b in range(batch.batch_size):
        question, _, answer = row_parts(batch, b)
        assert question.count(tokenizer.vocab.mask_id) == 1
        filled, context = filled_question(tokenizer, batch, b)
        assert filled in context  # the masked sentence, filled with the span, is in the context
        answers.add(tokenizer.decode(answer))
    assert {"brahms", "tuesday", "sediment", "windward"} <= answers


def test_cloze_round_robin_over_documents(task, tokenizer, documents):
    batch = task.task_data(None, documents, tokenizer, seq_len=64, limit=len(documents)).batch
    doc_texts = [tokenizer.decode(tokenizer.backend.encode(" ".join(d)).ids) for d in documents]
    sources = []
    for b in range(batch.batch_size):
        filled, _ = filled_question(tokenizer, batch, b)
        sources.append([i for i, text in enumerate(doc_texts) if filled in text])
    assert sources == [[i] for i in range(len(documents))]


def test_cloze_is_deterministic(task, tokenizer, documents):
    first = task.task_data(None, documents, tokenizer, seq_len=48, limit=9).batch
    second = task.task_data(None, documents, tokenizer, seq_len=48, limit=9).batch
    for a, b in zip(first[:5], second[:5]):
        assert torch.equal(a, b)
    assert first.extras.keys() == second.extras.keys()
    for key in first.extras:
        assert torch.equal(first.extras[key], second.extras[key])


NAMES = ["Halvorsen", "Marquette", "Okonkwo", "Ferreira", "Lindqvist", "Tanaka", "Duvall", "Brennan"]
PLACES = ["Oslo", "Lisbon", "Kyoto", "Dublin", "Quebec", "Lagos"]


def synthetic_documents(n: int) -> list[list[str]]:
    """Deterministic multi-sentence documents with entities, numbers and plain sentences."""
    docs = []
    for i in range(n):
        name, place = NAMES[i % len(NAMES)], PLACES[i % len(PLACES)]
        docs.append([
            f"The engineer {name} built a bridge near {place} in {1800 + 7 * i}.",
            "It crossed the river beside the old mill and carried heavy wagons.",
            f"Farmers from {place} used the crossing every morning.",
            "Later the structure needed careful repairs after several floods.",
            f"In {1850 + i} the town council replaced it with a stone viaduct.",
        ][: 2 + i % 4])
    return docs


def test_cloze_synthetic_set_with_trimmed_windows():
    docs = synthetic_documents(40)
    tok = train_wordpiece([" ".join(d) for d in docs] * 5, vocab_size=600, name="synthetic")
    params = {"max_question_tokens": 8, "context_sentences": 2}
    seq_len = 28  # short: questions are cut and contexts trimmed around the answer
    batch = qa.objreg_task_data(None, docs, tok, seq_len, 100, params)
    assert batch.batch_size == 100
    check_layout(batch, tok.vocab, seq_len)
    assert batch.input_ids.shape[1] == seq_len  # some rows were trimmed to fit
    check_answers_in_context(batch)
    answers = []
    for b in range(batch.batch_size):
        question, _, answer = row_parts(batch, b)
        assert len(question) <= 8 and question.count(tok.vocab.mask_id) == 1
        answers.append(normalise(tok.decode(answer)))
    # Round robin: first the opening sentence of each of the 40 documents (the engineer's name),
    # then the second sentence of each ("crossed", its longest content word), then the third
    # sentences, which only documents i with i % 4 >= 1 have (the place name).
    assert answers[:40] == [normalise(NAMES[i % len(NAMES)]) for i in range(40)]
    assert answers[40:80] == ["crossed"] * 40
    third = [normalise(PLACES[i % len(PLACES)]) for i in range(40) if i % 4 >= 1]
    assert answers[80:] == third[:20]


def test_cloze_limit_and_errors(task, tokenizer, documents):
    batch = qa.objreg_task_data(None, documents, tokenizer, 64, 3, PARAMS)
    assert batch.batch_size == 3
    with pytest.raises(objreg.DataError, match="too few held-out documents.*--downstream-data"):
        qa.objreg_task_data(None, [], tokenizer, 64, 10, PARAMS)
    with pytest.raises(objreg.DataError, match="too few held-out documents"):
        qa.objreg_task_data(None, [["It is on the way."]], tokenizer, 64, 10, PARAMS)
    with pytest.raises(objreg.InvalidParameterError, match="task 'qa': limit must be an integer of at least 1"):
        task.task_data(None, documents, tokenizer, 64, 0)


# -- SQuAD files -------------------------------------------------------------------------------------


def write_json(tmp_path: Path, data: object, name: str = "squad.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(data), encoding="utf-8")
    return str(path)


def squad(paragraphs: list[dict]) -> dict:
    return {"version": "v2.0", "data": [{"title": "t", "paragraphs": paragraphs}]}


CONTEXT = "Bees collect nectar from flowers. They store honey in wax cells. The queen lays the eggs."


def test_squad_v2_unanswerable_points_at_cls(tmp_path, tokenizer):
    data = squad([{
        "context": CONTEXT,
        "qas": [
            {"question": "What do bees store?", "answers": [{"text": "honey", "answer_start": CONTEXT.index("honey")}]},
            {"question": "Who stole the honey?", "answers": [], "is_impossible": True,
             "plausible_answers": [{"text": "queen", "answer_start": CONTEXT.index("queen")}]},
        ],
    }])
    batch = qa.objreg_task_data(write_json(tmp_path, data), [], tokenizer, 64, 10, PARAMS)
    check_layout(batch, tokenizer.vocab, 64)
    assert batch.batch_size == 2
    assert tokenizer.decode(row_parts(batch, 0)[2]) == "honey"
    assert (int(batch.extras["start_positions"][1]), int(batch.extras["end_positions"][1])) == (0, 0)


@pytest.mark.parametrize("seq_len, stride", [(24, 128), (24, 4), (30, 0), (40, 7)])
def test_squad_long_context_becomes_overlapping_windows(tmp_path, tokenizer, seq_len, stride):
    context = " ".join(["The committee met on Tuesday."] * 12 + ["Bees collect nectar from flowers."])
    start = context.index("nectar")
    data = squad([{"context": context, "qas": [
        {"question": "What do bees collect?", "answers": [{"text": "nectar", "answer_start": start}]},
    ]}])
    batch = qa.objreg_task_data(write_json(tmp_path, data), [], tokenizer, seq_len, 100,
                                {**PARAMS, "doc_stride": stride})
    check_layout(batch, tokenizer.vocab, seq_len)
    full = tokenizer.encode_with_offsets(context)[0]
    question = row_parts(batch, 0)[0]
    budget = seq_len - 3 - len(question)
    overlap = min(stride, budget // 2)
    windows = [row_parts(batch, b)[1] for b in range(batch.batch_size)]
    # Rebuild the context from the windows: each starts `overlap` tokens before the last one ended.
    rebuilt = list(windows[0])
    for previous, window in zip(windows, windows[1:]):
        assert len(previous) == budget  # only the last window may be short
        assert window[:overlap] == previous[len(previous) - overlap :]
        rebuilt += window[overlap:]
    assert rebuilt == full
    # Exactly the windows holding the whole answer point at it; the others at [CLS].
    nectar = tokenizer.encode_with_offsets("nectar")[0]
    for b, window in enumerate(windows):
        holds = any(window[i : i + len(nectar)] == nectar for i in range(len(window)))
        answer = row_parts(batch, b)[2]
        if holds:
            assert answer == nectar
        else:
            assert int(batch.extras["start_positions"][b]) == 0 == int(batch.extras["end_positions"][b])
    assert sum(row_parts(batch, b)[2] == nectar for b in range(len(windows))) >= 1


def test_squad_limit_counts_windows(tmp_path, tokenizer):
    context = " ".join(["The committee met on Tuesday."] * 30)
    data = squad([{"context": context, "qas": [
        {"question": f"Question {i}?", "answers": [{"text": "committee", "answer_start": 4}]} for i in range(4)
    ]}])
    batch = qa.objreg_task_data(write_json(tmp_path, data), [], tokenizer, 24, 7, PARAMS)
    assert batch.batch_size == 7


@pytest.fixture(scope="module")
def squad_a(shared_file) -> Path:
    return shared_file("squad_v1.1/dev-v1.1.half-a.json")


@pytest.fixture(scope="module")
def squad_tokenizer(squad_a) -> objreg.Tokenizer:
    data = json.loads(squad_a.read_text(encoding="utf-8"))
    contexts = [p["context"] for a in data["data"] for p in a["paragraphs"]]
    return train_wordpiece(contexts[:300], vocab_size=3000, name="squad")


def test_squad_real_answers_decode(squad_tokenizer, squad_a):
    data = json.loads(squad_a.read_text(encoding="utf-8"))
    answers: dict[str, set[str]] = {}
    for article in data["data"]:
        for paragraph in article["paragraphs"]:
            for question in paragraph["qas"]:
                key = normalise(squad_tokenizer.decode(squad_tokenizer.encode_with_offsets(question["question"])[0][:32]))
                answers.setdefault(key, set()).update(normalise(a["text"]) for a in question["answers"])
    batch = qa.objreg_task_data(str(squad_a), [], squad_tokenizer, 192, 200, PARAMS)
    check_layout(batch, squad_tokenizer.vocab, 192)
    assert batch.batch_size == 200
    answerable = [b for b in range(200) if int(batch.extras["start_positions"][b]) > 0]
    assert len(answerable) >= 100  # long contexts add windows without the answer (125 of 200 here)
    check_answers_in_context(batch.select(torch.tensor(answerable)))
    matches = 0
    for b in answerable:
        question, _, answer = row_parts(batch, b)
        matches += normalise(squad_tokenizer.decode(answer)) in answers[normalise(squad_tokenizer.decode(question))]
    assert matches >= 0.95 * len(answerable)
    again = qa.objreg_task_data(str(squad_a), [], squad_tokenizer, 192, 200, PARAMS)
    assert torch.equal(batch.input_ids, again.input_ids)


# -- SQuAD files: what is skipped ---------------------------------------------------------------------


GOOD_QA = {"question": "What?", "answers": [{"text": "Bees", "answer_start": 0}]}


def test_mismatched_answers_are_skipped_and_counted(tmp_path, tokenizer):
    bad = {"question": "What?", "answers": [{"text": "wasps", "answer_start": 0}]}
    data = squad([{"context": CONTEXT, "qas": [GOOD_QA, bad, bad]}])
    with pytest.warns(UserWarning, match=r"skipped 2 questions.*qas\[1\]\.answers\[0\]"):
        batch = qa.objreg_task_data(write_json(tmp_path, data), [], tokenizer, 64, 10, PARAMS)
    assert batch.batch_size == 1


def test_no_usable_example(tmp_path, tokenizer):
    bad = {"question": "What?", "answers": [{"text": "wasps", "answer_start": 0}]}
    path = write_json(tmp_path, squad([{"context": CONTEXT, "qas": [bad]}]))
    with pytest.warns(UserWarning), pytest.raises(objreg.DataError, match=r"no usable qa example.*1 with an answer"):
        qa.objreg_task_data(path, [], tokenizer, 64, 10, PARAMS)
    # a control character the BERT normaliser drops: the answer has no token, and must not be
    # mistaken for an unanswerable question
    dropped = squad([{"context": "Bees \x07 collect nectar.", "qas": [
        {"question": "What?", "answers": [{"text": "\x07", "answer_start": 5}]},
    ]}])
    with pytest.raises(objreg.DataError, match=r"1 whose answer has no tokens"):
        qa.objreg_task_data(write_json(tmp_path, dropped, "dropped.json"), [], tokenizer, 64, 10, PARAMS)
    empty = write_json(tmp_path, {"data": []}, "empty.json")
    with pytest.raises(objreg.DataError, match=r"empty\.json: no usable qa example \(0 questions"):
        qa.objreg_task_data(empty, [], tokenizer, 64, 10, PARAMS)


# -- attention mask and loss ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mixed_batch(tmp_path_factory, tokenizer, documents) -> objreg.CorruptedBatch:
    """Cloze rows plus a SQuAD v2 unanswerable row, padded to one length."""
    data = squad([{"context": CONTEXT, "qas": [
        {"question": "Who stole the honey?", "answers": [], "is_impossible": True},
        {"question": "What do bees store?", "answers": [{"text": "honey", "answer_start": CONTEXT.index("honey")}]},
    ]}])
    path = write_json(tmp_path_factory.mktemp("qa"), data)
    squad_rows = qa.objreg_task_data(path, [], tokenizer, 40, 10, PARAMS)
    cloze_rows = qa.objreg_task_data(None, documents, tokenizer, 40, 4, PARAMS)
    T = 40
    parts = [squad_rows, cloze_rows]

    def pad(t: torch.Tensor, value) -> torch.Tensor:
        return F.pad(t, (0, T - t.shape[1]), value=value)

    def cat(i: int, value) -> torch.Tensor:
        return torch.cat([pad(p[i], value) for p in parts])

    B = sum(p.batch_size for p in parts)
    is_padding = cat(2, True)
    extras = {
        "start_positions": torch.cat([p.extras["start_positions"] for p in parts]),
        "end_positions": torch.cat([p.extras["end_positions"] for p in parts]),
        "context_mask": torch.cat([pad(p.extras["context_mask"], False) for p in parts]),
    }
    rows = torch.arange(B)[:, None].expand(B, T)
    return objreg.CorruptedBatch(
        cat(0, tokenizer.vocab.pad_id), cat(1, objreg.IGNORE_INDEX), is_padding,
        torch.arange(T).repeat(B, 1), torch.where(is_padding, -1, rows), extras,
    )


def reference_loss(logits: torch.Tensor, batch: objreg.CorruptedBatch) -> torch.Tensor:
    """Per-example float64 loop: cross-entropy over the allowed positions only, picked out by
    boolean indexing (which the plugin's vmap-safe loss must not use)."""
    out = []
    for b in range(logits.shape[0]):
        allowed = batch.extras["context_mask"][b].clone()
        allowed[0] = True
        positions = allowed.nonzero().flatten().tolist()
        total = 0.0
        for k, key in enumerate(("start_positions", "end_positions")):
            target = positions.index(int(batch.extras[key][b]))
            scores = logits[b, allowed, k].double()
            total = total + F.cross_entropy(scores[None], torch.tensor([target]))
        out.append(total / 2)
    return torch.stack(out)


def test_attention_mask_is_bidirectional(task, mixed_batch):
    mask = task.attention_mask(mixed_batch)
    B, T = mixed_batch.input_ids.shape
    expected = (~mixed_batch.is_padding)[:, None, :].expand(B, T, T)
    assert torch.equal(mask, expected)


def test_loss_matches_float64_loop(task, mixed_batch, stand_in_model):
    B, T = mixed_batch.input_ids.shape
    H = 8
    model = stand_in_model("qa", H, 2)
    hidden = torch.randn(B, T, H, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    loss = task.loss(objreg.ModelOutputs(hidden, model), mixed_batch)
    with torch.no_grad():
        expected = reference_loss(model.heads["qa"](hidden), mixed_batch)
    assert loss.shape == (B,)
    torch.testing.assert_close(loss, expected, rtol=1e-10, atol=1e-10)
    unanswerable = mixed_batch.extras["start_positions"] == 0
    assert unanswerable.any() and torch.isfinite(loss[unanswerable]).all()
    # padding, question tokens and [SEP] carry no probability: raising their logits changes nothing
    bump = (~mixed_batch.extras["context_mask"]).double()
    bump[:, 0] = 0.0
    raised = task.loss(objreg.ModelOutputs(hidden, _BumpedHeads(model, bump)), mixed_batch)
    torch.testing.assert_close(raised, loss)


class _BumpedHeads:
    """A stand-in whose qa head adds a large value to the logits where ``bump`` is 1."""

    def __init__(self, model: types.SimpleNamespace, bump: torch.Tensor):
        head = model.heads["qa"]
        self.heads = {"qa": lambda h: head(h) + 50.0 * bump[..., None]}


def test_loss_is_transform_safe(task, mixed_batch, stand_in_model):
    """vmap(grad) with a batch of one per example and jvp agree with ordinary autograd."""
    B, T = mixed_batch.input_ids.shape
    H = 8
    model = stand_in_model("qa", H, 2)
    hidden = torch.randn(B, T, H, dtype=torch.float64, generator=torch.Generator().manual_seed(2))

    def one(h: torch.Tensor, example: objreg.CorruptedBatch) -> torch.Tensor:
        batch = objreg.CorruptedBatch(*(t[None] for t in example[:5]), {k: v[None] for k, v in example.extras.items()})
        return task.loss(objreg.ModelOutputs(h[None], model), batch)[0]

    per_sample = torch.func.vmap(torch.func.grad(one))(hidden, mixed_batch)
    leaf = hidden.clone().requires_grad_(True)
    (expected,) = torch.autograd.grad(task.loss(objreg.ModelOutputs(leaf, model), mixed_batch).sum(), leaf)
    torch.testing.assert_close(per_sample, expected)

    direction = torch.randn_like(hidden)
    def batch_loss(h: torch.Tensor) -> torch.Tensor:
        return task.loss(objreg.ModelOutputs(h, model), mixed_batch)

    _, tangent = torch.func.jvp(batch_loss, (hidden,), (direction,))
    torch.testing.assert_close(tangent, (expected * direction).sum(dim=(1, 2)))
