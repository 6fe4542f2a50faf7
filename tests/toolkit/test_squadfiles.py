"""Tests of the SQuAD file reader (objreg.toolkit.squadfiles): questions, unanswerable and skipped
ones, a real file where present, and the errors that name the JSON path and the shape expected."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import objreg
from objreg.toolkit.squadfiles import read_squad

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
