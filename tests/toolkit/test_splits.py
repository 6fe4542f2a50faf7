"""objreg split's function: a classification file into train and held-out files that partition its
lines, and the training rows' text as a corpus."""

from __future__ import annotations

import json

import pytest

import objreg
from objreg.toolkit.splits import split_classification_file


def tsv(tmp_path, rows: int = 30):
    path = tmp_path / "data.tsv"
    path.write_text("sentence1\tsentence2\tlabel\n" + "".join(f"premise {i} here .\thypothesis {i} .\t{i % 2}\n"
                                                                 for i in range(rows)))
    return path


def test_the_files_partition_the_rows_and_keep_the_header(tmp_path):
    path = tsv(tmp_path)
    files = split_classification_file(path, tmp_path / "out", held_out=0.3, seed=4)
    train, held = files.train.read_text().splitlines(), files.heldout.read_text().splitlines()
    assert train[0] == held[0] == "sentence1\tsentence2\tlabel"
    body = path.read_text().splitlines()[1:]
    assert sorted(train[1:] + held[1:]) == sorted(body) and not set(train[1:]) & set(held[1:])
    assert (files.train_rows, files.heldout_rows) == (21, 9) == (len(train) - 1, len(held) - 1)
    documents = files.text.read_text().strip().split("\n\n")
    expected = ["\n".join(line.split("\t")[:2]) for line in train[1:]]
    assert documents == expected  # each training row's two texts, as one document
    again = split_classification_file(path, tmp_path / "again", held_out=0.3, seed=4)
    assert again.heldout.read_text() == files.heldout.read_text()
    other = split_classification_file(path, tmp_path / "other", held_out=0.3, seed=5)
    assert other.heldout.read_text() != files.heldout.read_text()


def test_jsonl(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps({"text": f"row {i} text", "label": i % 2}) + "\n" for i in range(10)))
    files = split_classification_file(path, tmp_path / "out", held_out=0.5)
    lines = files.train.read_text().splitlines() + files.heldout.read_text().splitlines()
    assert sorted(lines) == sorted(path.read_text().splitlines())
    assert files.train.suffix == ".jsonl"


@pytest.mark.parametrize("held_out", [0, 1, -0.1, 1.5, float("nan")])
def test_a_share_outside_zero_to_one_is_refused(tmp_path, held_out):
    with pytest.raises(objreg.InvalidParameterError, match="strictly between 0 and 1"):
        split_classification_file(tsv(tmp_path), tmp_path / "out", held_out=held_out)


def test_nothing_is_overwritten(tmp_path):
    path = tsv(tmp_path)
    split_classification_file(path, tmp_path / "out")
    before = (tmp_path / "out" / "train.tsv").read_text()
    with pytest.raises(objreg.DataError, match="exists already"):
        split_classification_file(path, tmp_path / "out", seed=1)
    assert (tmp_path / "out" / "train.tsv").read_text() == before


def test_rows_that_share_text_stay_on_one_side(tmp_path, distinct_sentences):
    path = tmp_path / "pairs.tsv"
    texts = distinct_sentences(12)
    rows = [f"{texts[i // 3]}\thypothesis number {i} .\t{i % 2}" for i in range(36)]  # each premise thrice
    path.write_text("sentence1\tsentence2\tlabel\n" + "\n".join(rows) + "\n")
    for seed in range(5):
        files = split_classification_file(path, tmp_path / f"out{seed}", held_out=0.3, seed=seed)
        held_premises = {line.split("\t")[0] for line in files.heldout.read_text().splitlines()[1:]}
        train_premises = {line.split("\t")[0] for line in files.train.read_text().splitlines()[1:]}
        assert held_premises and train_premises and not held_premises & train_premises
        assert files.heldout_rows % 3 == 0 and files.heldout_rows >= 0.3 * 36
