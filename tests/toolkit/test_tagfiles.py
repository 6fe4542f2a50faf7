"""Tests of the token classification file reader (objreg.toolkit.tagfiles): CoNLL and JSONL tagged
sentences, and the errors that name the file, the line and what is allowed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import objreg
from objreg.toolkit.tagfiles import read_tagged


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


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
