"""Tests of the task file readers (objreg.toolkit.taskfiles): GLUE TSV and JSONL classification
records (real SST-2 and RTE dev files where present), CoNLL and JSONL tagged sentences, SQuAD
JSON, corpus documents, and the errors that name the file, the line and what is allowed; plus
the example pickers (evenly spaced, round robin)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

import objreg
from objreg.toolkit import taskfiles
from objreg.toolkit.taskfiles import read_classification, read_squad, read_tagged


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# -- shared pieces --------------------------------------------------------------------------------


def test_evenly_spaced():
    assert taskfiles.evenly_spaced(872, 10) == [i * 872 // 10 for i in range(10)]
    assert taskfiles.evenly_spaced(3, 10) == [0, 1, 2]
    assert taskfiles.evenly_spaced(0, 5) == []


def test_round_robin_takes_one_item_per_stream_in_turn():
    streams = [["a0", "a1", "a2"], ["b0"], [], ["c0", None, "c2", "c3"]]
    assert taskfiles.round_robin(streams, 100) == ["a0", "b0", "c0", "a1", "a2", "c2", "c3"]
    assert taskfiles.round_robin(streams, 4) == ["a0", "b0", "c0", "a1"]
    # A None passes its stream's turn: "c2" waits for the third round, as "a2" does.
    assert taskfiles.round_robin([["a0", "a1", "a2"], ["c0", None, "c2"]], 100) == ["a0", "c0", "a1", "a2", "c2"]
    consumed = []

    def lazy(name):
        for i in range(100):
            consumed.append((name, i))
            yield f"{name}{i}"

    assert taskfiles.round_robin([lazy("x"), lazy("y")], 3) == ["x0", "y0", "x1"]
    assert consumed == [("x", 0), ("y", 0), ("x", 1)]  # no more drawn than needed


def test_label_order_and_json_types():
    assert taskfiles.label_order(["10", "2", "7", "2"]) == ["2", "7", "10"]  # numeric, not "10" < "2"
    assert taskfiles.label_order(["not_entailment", "entailment"]) == ["entailment", "not_entailment"]
    assert [taskfiles.json_type(v) for v in ({}, [], "", 3, 0.5, True, None)] == [
        "object", "array", "string", "integer", "number", "boolean", "null",
    ]


def test_wikitext_headings():
    assert taskfiles.is_heading(" = Valkyria Chronicles III = ") and taskfiles.is_heading(" = = Gameplay = = ")
    assert not taskfiles.is_heading("The game = a sequel.") and not taskfiles.is_heading("")


def test_read_lines(tmp_path):
    path = tmp_path / "bom.txt"
    path.write_bytes("\ufeffFirst line.\r\nSecond\x0cline.\n\nFourth.".encode())
    # A BOM is not text; only newlines split (a form feed stays inside its line).
    assert list(taskfiles.read_lines(path, "data file")) == [
        (1, "First line."), (2, "Second\x0cline."), (3, ""), (4, "Fourth."),
    ]
    with pytest.raises(objreg.DataError, match=r"data file .*nothere\.txt does not exist; allowed: text"):
        list(taskfiles.read_lines(tmp_path / "nothere.txt", "data file", "allowed: text"))
    with pytest.raises(objreg.DataError, match=r"is a directory, not a file"):
        list(taskfiles.read_lines(tmp_path, "data file"))
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("ok\ncaf\u00e9 au lait\n".encode("latin-1"))
    with pytest.raises(objreg.DataError, match=r"latin1\.txt line 2: not UTF-8 text \(byte 3: 0xe9, byte offset 6 of"):
        list(taskfiles.read_lines(bad, "data file"))


# -- classification files -------------------------------------------------------------------------


def test_sst2_dev_records(shared_file):
    path = shared_file("glue/SST-2/dev.tsv")
    records, classes = read_classification(path)
    with path.open(encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    assert classes == ["0", "1"]
    assert [(r.text, r.pair, r.label) for r in records] == [(r["sentence"], None, r["label"]) for r in rows]
    assert [r.line for r in records] == list(range(2, 874))


def test_rte_dev_records(shared_file):
    path = shared_file("glue/RTE/dev.tsv")
    with path.open(encoding="utf-8", newline="") as f:  # this export is CSV-quoted
        rows = list(csv.DictReader(f, delimiter="\t"))
    records, classes = read_classification(path)
    assert classes == ["0", "1"]
    assert [(r.text, r.pair, r.label) for r in records] == [(r["sentence1"], r["sentence2"], r["label"]) for r in rows]
    quoted = records[13]  # line 15: "... famed as ""Dr. Death,"" has ..."
    assert quoted.line == 15 and 'famed as "Dr. Death," has' in quoted.text and not quoted.text.startswith('"')


def test_tsv_with_index_column_string_labels_and_quotes(tmp_path):
    path = write(
        tmp_path,
        "rte.tsv",
        "index\tsentence1\tsentence2\tlabel\n"
        '0\t"Bees said ""hello"" twice."\tBees spoke.\tnot_entailment\n'
        "1\tRivers carry sediment.\tRivers move things.\tentailment\n"
        '2\tHe said "no" twice.\tHe spoke.\tentailment\n',  # a bare GLUE field with inner quotes stays as it is
    )
    records, classes = read_classification(path)
    assert classes == ["entailment", "not_entailment"]  # alphabetical
    assert records[0].text == 'Bees said "hello" twice.' and records[2].text == 'He said "no" twice.'
    assert read_classification(path, labels="not_entailment,entailment")[1] == ["not_entailment", "entailment"]


def test_jsonl_labels_in_numeric_order_and_field_arguments(tmp_path):
    single = write(tmp_path, "single.jsonl", "\n".join(json.dumps(r) for r in [
        {"text": "Bees collect nectar.", "label": 10},
        {"text": "Rivers carry sediment.", "label": 2},
        {"text": "The queen lays the eggs.", "label": 10},
        {"text": "Rain falls.", "label": 7},
    ]) + "\n\n")
    records, classes = read_classification(single)
    assert classes == ["2", "7", "10"]  # numeric order, not "10" < "2"
    assert [r.label for r in records] == ["10", "2", "10", "7"] and [r.line for r in records] == [1, 2, 3, 4]
    custom = write(tmp_path, "custom.jsonl", json.dumps({"review": "Bees.", "title": "B", "stars": "good"}) + "\n"
                   + json.dumps({"review": "Rain.", "title": "R", "stars": "bad"}) + "\n")
    with pytest.raises(objreg.DataError, match=r"custom\.jsonl: the first record \(line 1\) has no text field"):
        read_classification(custom)
    records, classes = read_classification(custom, text_field="title", text_pair_field="review", label_field="stars")
    assert [(r.text, r.pair, r.label) for r in records] == [("B", "Bees.", "good"), ("R", "Rain.", "bad")]
    assert classes == ["bad", "good"]


def test_skipped_records_warn(tmp_path):
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
        records, classes = read_classification(path)
    messages = " | ".join(str(w.message) for w in caught)
    assert "skipped 1 records with an empty text (first: line 4)" in messages
    assert "skipped 1 records labelled '-' (no gold label; first: line 3)" in messages
    assert [r.line for r in records] == [2, 5] and classes == ["contradiction", "entailment"]


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
def test_malformed_classification_files_name_file_line_and_what_is_allowed(tmp_path, name, text, message):
    path = write(tmp_path, name, text)
    with pytest.raises(objreg.DataError, match=message):
        read_classification(path)


def test_labels_argument_and_missing_or_bad_files(tmp_path):
    path = write(tmp_path, "two.tsv", "sentence\tlabel\nBees fly.\tpos\nRain falls.\tneutral\n")
    with pytest.raises(objreg.DataError, match=r"two\.tsv line 3: label 'neutral' is not in the labels parameter \(pos, neg\)"):
        read_classification(path, labels="pos,neg")
    with pytest.raises(objreg.DataError, match=r"classification data file .*nothere\.tsv does not exist"):
        read_classification(tmp_path / "nothere.tsv")
    with pytest.raises(objreg.DataError, match=r"is a directory"):
        read_classification(tmp_path)
    latin = tmp_path / "latin1.tsv"
    latin.write_bytes("sentence\tlabel\ncaf\xe9 au lait\t1\n".encode("latin-1"))
    with pytest.raises(objreg.DataError, match=r"latin1\.tsv line 2: not UTF-8 text"):
        read_classification(latin)


# -- tagged sentences -------------------------------------------------------------------------------


CONLL = """-DOCSTART- -X- -X- O

Bees NNS B-NP B-ANIMAL
collect VBP B-VP O
in IN B-PP O

The DT B-NP O
queen NN I-NP B-ANIMAL
"""


def test_conll_last_column_docstart_and_line_numbers(tmp_path):
    sentences, tags = read_tagged(write(tmp_path, "ner.conll", CONLL))
    assert [(s.line, s.words, s.tags) for s in sentences] == [
        (3, ("Bees", "collect", "in"), ("B-ANIMAL", "O", "O")),
        (7, ("The", "queen"), ("O", "B-ANIMAL")),
    ]
    assert tags == ["B-ANIMAL", "O"]


def test_conll_with_tabs_and_sentence_line_numbers(tmp_path):
    path = write(tmp_path, "pos.tsv", "Bees\tNNS\nfly\tVBP\n\n\nRain\tNN\n")  # no final blank line
    sentences, tags = read_tagged(path)
    assert [(s.line, s.words, s.tags) for s in sentences] == [
        (1, ("Bees", "fly"), ("NNS", "VBP")),
        (5, ("Rain",), ("NN",)),
    ]
    assert tags == ["NN", "NNS", "VBP"]


def test_jsonl_with_integer_tags_in_numeric_order(tmp_path):
    records = [
        {"id": "0", "tokens": ["Bees", "collect", "nectarofragrantly"], "ner_tags": [10, 0, 2]},
        {"id": "1", "tokens": ["The", "queen"], "ner_tags": [0, 10]},
    ]
    path = write(tmp_path, "ner.jsonl", "\n".join(json.dumps(r) for r in records) + "\n")
    sentences, tags = read_tagged(path)
    assert tags == ["0", "2", "10"]
    assert [s.tags for s in sentences] == [("10", "0", "2"), ("0", "10")]
    assert read_tagged(path, labels="10,2,0,7")[1] == ["10", "2", "0", "7"]
    named = write(tmp_path, "named.jsonl", json.dumps({"w": ["a", "b"], "t": ["X", "Y"]}) + "\n")
    assert read_tagged(named, tokens_field="w", tags_field="t")[0][0].words == ("a", "b")


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("empty.conll", "", r"empty\.conll: no tagged sentence in the file; allowed: CoNLL style"),
        ("empty.jsonl", "\n", r"empty\.jsonl: the file is empty"),
        ("notag.conll", "Bees\tNNS\nfly\n", r"notag\.conll line 2: 'fly' has no tag: expected a token and its tag"),
        (
            "bad.jsonl",
            '{"tokens": ["a"], "tags": ["O"]}\n{"tokens": ["a"], "tags": ["O"}\n',
            r"bad\.jsonl line 2: not valid JSON \(Expecting ',' delimiter",
        ),
        ("len.jsonl", '{"tokens": ["a", "b"], "tags": ["O"]}\n', r"len\.jsonl line 1: 2 tokens but 1 tags"),
        (
            "float.jsonl",
            '{"tokens": ["a"], "tags": [0.5]}\n',
            r"line 1: 'tags' holds a JSON number \(0\.5\); a tag must be a non-empty string or an integer",
        ),
        ("bool.jsonl", '{"tokens": ["a"], "tags": [true]}\n', r"'tags' holds a JSON boolean \(true\)"),
        ("null.jsonl", '{"tokens": ["a"], "tags": [null]}\n', r"'tags' holds a JSON null"),
        ("word.jsonl", '{"tokens": [1], "tags": ["O"]}\n', r"line 1: 'tokens' holds a JSON integer; every token is"),
        ("str.jsonl", '{"tokens": "a b", "tags": ["O"]}\n', r"line 1: 'tokens' must be a list, got string"),
        (
            "keys.jsonl",
            '{"text": "a b", "tags": ["O"]}\n',
            r"keys\.jsonl line 1: no tokens list \(its fields: 'text', 'tags'\); expected one of tokens, words",
        ),
        (
            "later.jsonl",
            '{"tokens": ["a"], "tags": ["O"]}\n{"tokens": ["a"]}\n',
            r"later\.jsonl line 2: no 'tags' field, which the first record has",
        ),
        ("object.jsonl", '["a", "O"]\n', r"object\.jsonl line 1: a JSON array, not an object"),
        ("given.jsonl", '{"tokens": ["a"], "tags": ["O"]}\n', r"given\.jsonl line 1: no 'words' field \(tokens_field\)"),
    ],
)
def test_malformed_tagging_files(tmp_path, name, text, message):
    path = write(tmp_path, name, text)
    with pytest.raises(objreg.DataError, match=message):
        read_tagged(path, tokens_field="words" if name == "given.jsonl" else "")


def test_unknown_tag_missing_file_and_empty_records(tmp_path):
    path = write(tmp_path, "ner.conll", CONLL)
    with pytest.raises(objreg.DataError, match=r"ner\.conll line 3: tag 'B-ANIMAL' is not in the labels parameter"):
        read_tagged(path, labels="O,B-LOC")
    with pytest.raises(objreg.DataError, match=r"none\.conll does not exist"):
        read_tagged(tmp_path / "none.conll")
    empty = write(tmp_path, "empty.jsonl", '{"tokens": [], "tags": []}\n{"tokens": ["a"], "tags": ["O"]}\n')
    with pytest.warns(UserWarning, match=r"skipped 1 records with no tokens \(first: line 1\)"):
        sentences, _ = read_tagged(empty)
    assert [s.line for s in sentences] == [2]


# -- SQuAD ------------------------------------------------------------------------------------------


CONTEXT = "Bees collect nectar from flowers. They store honey in wax cells. The queen lays the eggs."
GOOD_QA = {"question": "What?", "answers": [{"text": "Bees", "answer_start": 0}]}


def write_json(tmp_path: Path, data: object, name: str = "squad.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def squad(paragraphs: list[dict]) -> dict:
    return {"version": "v2.0", "data": [{"title": "t", "paragraphs": paragraphs}]}


def test_squad_questions_unanswerable_and_skipped(tmp_path):
    bad = {"question": "Who?", "answers": [{"text": "wasps", "answer_start": 0}]}
    data = squad([
        {"context": CONTEXT, "qas": [
            GOOD_QA, bad,
            {"question": "Who stole it?", "answers": [], "is_impossible": True},
            {"question": "Where?", "answers": []},
        ]},
        {"context": "Rain falls.", "qas": [{"question": "What falls?", "answers": [{"text": "Rain", "answer_start": 0}]}]},
    ])
    read = read_squad(write_json(tmp_path, data))
    assert read.contexts == [CONTEXT, "Rain falls."]
    assert [(q.paragraph, q.question, q.answer) for q in read.questions] == [
        (0, "What?", (0, 4)), (0, "Who stole it?", None), (1, "What falls?", (0, 4)),
    ]
    assert read.mismatched == ["data[0].paragraphs[0].qas[1].answers[0]"]
    assert read.no_answer == ["data[0].paragraphs[0].qas[3]"]
    assert read.first_answers == ["Bees", "wasps", "Rain"]


def test_squad_real_file(shared_file):
    path = shared_file("squad_v1.1/dev-v1.1.half-a.json")
    data = json.loads(path.read_text(encoding="utf-8"))["data"]
    qas = [qa for article in data for paragraph in article["paragraphs"] for qa in paragraph["qas"]]
    read = read_squad(path)
    assert read.first_answers == [qa["answers"][0]["text"] for qa in qas]
    assert len(read.questions) + len(read.mismatched) == len(qas) and not read.no_answer
    for q in read.questions[:200]:
        start, end = q.answer
        assert read.contexts[q.paragraph][start:end].strip()


def test_missing_file(tmp_path):
    with pytest.raises(objreg.DataError, match=r"nope\.json does not exist.*SQuAD"):
        read_squad(tmp_path / "nope.json")
    with pytest.raises(objreg.DataError, match=r"SQuAD file .*nope\.json does not exist"):
        read_squad(tmp_path / "nope.json", what="SQuAD file")


def test_invalid_json_names_line_and_column(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{\n  "data": [\n    {"paragraphs": [}\n  ]\n}\n', encoding="utf-8")
    # the stray "}" is character 21 of line 3
    with pytest.raises(objreg.DataError, match=r"bad\.json: not valid JSON at line 3, column 21"):
        read_squad(path)
    path.write_bytes(b'{"data": "\xff"}')
    with pytest.raises(objreg.DataError, match=r"bad\.json: not UTF-8 text"):
        read_squad(path)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], r"the top level must be a JSON object, got list"),
        ({"version": "1.1"}, r"the top level has no 'data' key"),
        ({"data": {}}, r"the top level\.data must be a list, got object"),
        ({"data": [{"title": "x"}]}, r"data\[0\] has no 'paragraphs' key"),
        (squad([{"qas": []}]), r"data\[0\]\.paragraphs\[0\] has no 'context' key \(expected a string\)"),
        (squad([{"context": 3, "qas": []}]), r"data\[0\]\.paragraphs\[0\]\.context must be a string, got integer"),
        (squad([{"context": CONTEXT, "qas": [GOOD_QA, {"answers": []}]}]),
         r"data\[0\]\.paragraphs\[0\]\.qas\[1\] has no 'question' key"),
        (squad([{"context": CONTEXT, "qas": [{"question": "q"}]}]), r"qas\[0\] has no 'answers' key"),
        (squad([{"context": CONTEXT, "qas": [{"question": "q", "answers": [{"text": "Bees", "answer_start": "0"}]}]}]),
         r"qas\[0\]\.answers\[0\]\.answer_start must be an integer, got string"),
        (squad([{"context": CONTEXT, "qas": [{"question": "q", "answers": [], "is_impossible": "yes"}]}]),
         r"qas\[0\]\.is_impossible must be a boolean"),
    ],
)
def test_wrong_shape_names_the_key_and_place(tmp_path, data, message):
    with pytest.raises(objreg.DataError, match=message) as info:
        read_squad(write_json(tmp_path, data))
    assert "squad.json" in str(info.value)


# -- documents --------------------------------------------------------------------------------------


def test_documents_are_read_as_the_corpus_providers_read_them(tmp_path, texts):
    path = write(tmp_path, "docs.txt", "\n\n".join(texts) + "\n")
    assert taskfiles.read_documents(str(path), "ordering data") == [tuple(objreg.split_sentences(t)) for t in texts]
    jsonl = write(tmp_path, "docs.jsonl", "".join(json.dumps({"text": t}) + "\n" for t in texts[:2]))
    assert taskfiles.read_documents(str(jsonl), "ordering data") == [tuple(objreg.split_sentences(t)) for t in texts[:2]]
    with pytest.raises(objreg.DataError, match=r"ordering data .*nothere\.txt does not exist; give a plain-text file"):
        taskfiles.read_documents(str(tmp_path / "nothere.txt"), "ordering data")
