"""Tests of what the task file readers share (objreg.toolkit.taskfiles): the example pickers
(evenly spaced, round robin), the label order, JSON type names, WikiText headings and the line
reader."""

from __future__ import annotations

import pytest

import objreg
from objreg.toolkit import taskfiles


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
