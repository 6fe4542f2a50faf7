"""Tests of the classification file reader (objreg.toolkit.classfiles): GLUE TSV and JSONL records
(real SST-2 and RTE dev files where present), and the errors that name the file, the line and what
is allowed."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

import objreg
from objreg.toolkit.classfiles import read_classification


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


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
