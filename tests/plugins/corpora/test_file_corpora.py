"""User corpora: plain text, JSONL and directories of them, and every way they can be wrong."""

from __future__ import annotations

import json
import os
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import objreg
from objreg.plugins.corpora import files

HEADING = re.compile(r"^\s*(= )+.*( =)+\s*$")


def load(path, tmp_path=None):
    return files.load_corpus(str(path), tmp_path or path.parent)


def claims(name: str) -> bool:
    """Whether the files plugin's provider answers to ``name``."""
    provided = []
    files.objreg_register_corpora(provided.append)
    (provider,) = provided
    return provider.handles(name)


# -- plain text -----------------------------------------------------------------------------------


def test_blank_lines_separate_documents(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text(
        "The first document starts here. It has\ntwo lines of wrapped text.\n\n\n"
        "The second document is short.\n",
        encoding="utf-8",
    )
    corpus = load(path)
    assert corpus.documents == (
        ("The first document starts here.", "It has two lines of wrapped text."),
        ("The second document is short.",),
    )
    assert corpus.name == str(path)
    assert "2 documents, 3 sentences" in corpus.description


def test_without_blank_lines_each_line_is_a_document(tmp_path):
    path = tmp_path / "lines.txt"
    path.write_text("One line here. Two sentences.\r\nAnother line.\r\nA third line.", encoding="utf-8")
    assert load(path).documents == (("One line here.", "Two sentences."), ("Another line.",), ("A third line.",))


def test_wikitext_headings_are_dropped(tmp_path):
    path = tmp_path / "wiki.txt"
    path.write_text(
        " = Valkyria Chronicles = \n \n The game was released in 2011 . It sold well .\n \n"
        " = = Gameplay = = \n The player moves units . \n",
        encoding="utf-8",
    )
    corpus = load(path)
    assert corpus.documents == (
        ("The game was released in 2011 .", "It sold well ."),
        ("The player moves units .",),
    )


def test_headings_are_dropped_in_line_mode(tmp_path):
    path = tmp_path / "wiki.txt"
    path.write_text(" = Title = \nFirst paragraph line.\n = = Section = = \nSecond one.\n", encoding="utf-8")
    assert load(path).documents == (("First paragraph line.",), ("Second one.",))


def test_byte_order_mark_is_not_text(tmp_path):
    path = tmp_path / "bom.txt"
    path.write_bytes("\ufeffHello there, reader.".encode())
    assert load(path).documents == (("Hello there, reader.",),)


def test_markdown_is_read_as_plain_text(tmp_path):
    path = tmp_path / "notes.md"
    path.write_text("Some notes are here.\n", encoding="utf-8")
    assert load(path).num_sentences == 1


_word = st.text(alphabet="abcdefghij", min_size=1, max_size=6)
_sentence = st.lists(_word, min_size=1, max_size=6).map(lambda ws: "A " + " ".join(ws) + ".")
_documents = st.lists(st.lists(_sentence, min_size=1, max_size=4), min_size=1, max_size=5)


@settings(max_examples=50, deadline=None)
@given(documents=_documents)
def test_text_and_jsonl_round_trip(tmp_path_factory, documents):
    folder = tmp_path_factory.mktemp("roundtrip")
    expected = tuple(tuple(doc) for doc in documents)
    text = folder / "c.txt"
    text.write_text("\n\n".join(" ".join(doc) for doc in documents) + "\n", encoding="utf-8")
    lines = folder / "c.jsonl"
    lines.write_text("".join(json.dumps({"text": " ".join(doc)}) + "\n" for doc in documents), encoding="utf-8")
    assert load(text).documents == expected
    assert load(lines).documents == expected


# -- JSONL ----------------------------------------------------------------------------------------


def test_jsonl_records_are_documents(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text(
        '{"text": "First record. It has two sentences.", "id": 1}\n\n{"text": "Second record."}\n',
        encoding="utf-8",
    )
    assert load(path).documents == (("First record.", "It has two sentences."), ("Second record.",))


def test_malformed_jsonl_line_is_named(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text('{"text": "Fine."}\n{"text": "broken\n', encoding="utf-8")
    with pytest.raises(objreg.DataError, match=r"c\.jsonl' line 2: not valid JSON \(.*column \d+\).*\"text\" field"):
        load(path)


@pytest.mark.parametrize(
    ("record", "what"),
    [
        ('{"body": "No text field."}', 'without a "text" field'),
        ('{"text": 3}', "JSON integer, not a string"),
        ('["text", "a list"]', "JSON array"),
    ],
)
def test_jsonl_record_without_string_text_is_named(tmp_path, record, what):
    path = tmp_path / "c.jsonl"
    path.write_text('{"text": "Fine."}\n' + record + "\n", encoding="utf-8")
    with pytest.raises(objreg.DataError) as info:
        load(path)
    message = str(info.value)
    assert "c.jsonl' line 2" in message
    assert 'one JSON object per line with a string "text" field' in message
    assert what in message


def test_pretty_printed_json_says_how_json_is_read(tmp_path):
    path = tmp_path / "c.json"
    path.write_text('{\n  "text": "Pretty printed."\n}\n', encoding="utf-8")
    with pytest.raises(objreg.DataError, match="line 1: .*read as JSON Lines"):
        load(path)


# -- directories ----------------------------------------------------------------------------------


def test_directory_reads_text_and_jsonl_recursively_in_order(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "z.jsonl").write_text('{"text": "Third from the jsonl."}\n', encoding="utf-8")
    (tmp_path / "a.txt").write_text("First from a.\n\nSecond from a.\n", encoding="utf-8")
    (tmp_path / "c.txt").write_text("Fourth from c.\n", encoding="utf-8")
    (tmp_path / "empty.txt").write_text("\n", encoding="utf-8")  # harmless among others
    (tmp_path / "skip.md").write_text("Not a corpus file.\n", encoding="utf-8")
    corpus = load(tmp_path)
    assert corpus.documents == (
        ("First from a.",),
        ("Second from a.",),
        ("Third from the jsonl.",),
        ("Fourth from c.",),
    )
    assert corpus.description.startswith("directory ")


def test_directory_without_corpus_files_is_an_error(tmp_path):
    (tmp_path / "readme.md").write_text("Not read.\n", encoding="utf-8")
    with pytest.raises(objreg.DataError, match=r"has no \.txt or \.jsonl files"):
        load(tmp_path)


def test_directory_of_empty_files_is_empty(tmp_path):
    (tmp_path / "a.txt").write_text("  \n", encoding="utf-8")
    with pytest.raises(objreg.DataError, match="is empty: its .txt and .jsonl files hold no text"):
        load(tmp_path)


# -- what is and is not a path --------------------------------------------------------------------


@pytest.mark.parametrize("name", ["missing/corpus", "corpus.txt", "corpus.jsonl", "corpus.json", "notes.md"])
def test_missing_path_is_an_error(tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    assert claims(name)  # a path-like name is the files plugin's, so a missing file is its clear error
    with pytest.raises(objreg.DataError, match=f"corpus file '{re.escape(name)}' does not exist"):
        files.load_corpus(name, tmp_path)


def test_other_names_are_left_to_other_plugins(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert not claims("wikipedia")


def test_existing_path_without_separator_is_read(tmp_path, monkeypatch):
    (tmp_path / "corpus").write_text("A file without a suffix.\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert claims("corpus")
    assert files.load_corpus("corpus", tmp_path).num_sentences == 1


# -- unusable files -------------------------------------------------------------------------------


@pytest.mark.parametrize("content", [b"", b"  \n\n\t\n"])
def test_empty_file_is_an_error(tmp_path, content):
    path = tmp_path / "empty.txt"
    path.write_bytes(content)
    with pytest.raises(objreg.DataError, match=f"corpus '{re.escape(str(path))}' is empty: the file holds no text"):
        load(path)


def test_empty_jsonl_texts_are_an_error(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text('{"text": ""}\n{"text": "   "}\n', encoding="utf-8")
    with pytest.raises(objreg.DataError, match="is empty"):
        load(path)


def test_non_utf8_file_names_the_byte_offset(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes("Caf\u00e9 au lait.".encode("latin-1"))
    with pytest.raises(objreg.DataError) as info:
        load(path)
    message = str(info.value)
    assert str(path) in message
    assert "byte offset 3" in message and "0xe9" in message


def test_unreadable_file_is_an_error(tmp_path):
    path = tmp_path / "secret.txt"
    path.write_text("You cannot read this.\n", encoding="utf-8")
    path.chmod(0)
    try:
        if os.access(path, os.R_OK):
            pytest.skip("running as root: chmod does not stop reading")
        with pytest.raises(objreg.DataError, match=f"cannot read corpus file '{re.escape(str(path))}'"):
            load(path)
    finally:
        path.chmod(0o600)


def test_read_error_names_the_file_and_reason(tmp_path, monkeypatch):
    # The same path as above, reached even as root: the OS refuses the read.
    path = tmp_path / "secret.txt"
    path.write_text("You cannot read this.\n", encoding="utf-8")

    def refuse(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(type(path), "open", refuse)
    with pytest.raises(objreg.DataError, match=f"cannot read corpus file '{re.escape(str(path))}': Permission denied"):
        load(path)


# -- real data and the registry -------------------------------------------------------------------


def test_wikitext_valid_loads_without_headings(tmp_path, shared_file):
    path = shared_file("wikitext-2/valid.txt")
    corpus = load(path, tmp_path)
    # Blank lines separate WikiText's sections (its paragraphs are single lines inside them).
    assert len(corpus.documents) > 500
    assert corpus.num_sentences > 5_000
    sentences = [s for doc in corpus.documents for s in doc]
    assert not [s for s in sentences if HEADING.match(s) or s.startswith("= ")]


def test_providers():
    provided = []
    files.objreg_register_corpora(provided.append)
    (info,) = provided
    assert (info.kind, info.name, info.fallback) == ("corpus", "PATH", False) and info.accepts is not None


def test_registry_loads_a_path_and_rejects_unknown_names(tmp_path):
    path = tmp_path / "c.txt"
    path.write_text("A corpus through the registry.\n", encoding="utf-8")
    registry = objreg.Registry.load(load_entrypoints=False)
    assert registry.load_corpus(str(path), tmp_path).documents == (("A corpus through the registry.",),)
    with pytest.raises(objreg.UnknownNameError, match="unknown corpus 'nosuch'"):
        registry.load_corpus("nosuch", tmp_path)
    with pytest.raises(objreg.DataError, match="does not exist"):
        registry.load_corpus(str(tmp_path / "nosuch.txt"), tmp_path)


def test_large_corpus_keeps_evenly_spaced_documents(tmp_path, monkeypatch):
    path = tmp_path / "many.txt"
    path.write_text("".join(f"Document number {i} is here.\n" for i in range(50)), encoding="utf-8")
    monkeypatch.setattr(files, "MAX_DOCUMENTS", 7)
    with pytest.warns(UserWarning, match="has 50 documents; using 7 evenly spaced ones"):
        corpus = load(path)
    assert [doc[0] for doc in corpus.documents] == [f"Document number {i * 50 // 7} is here." for i in range(7)]


def test_file_is_streamed_not_read_whole(tmp_path, monkeypatch):
    path = tmp_path / "corpus.txt"
    path.write_text("First document here.\n\nSecond document here.\n", encoding="utf-8")

    def whole(self, *args, **kwargs):
        raise AssertionError("the corpus reader must not read the whole file at once")

    monkeypatch.setattr(type(path), "read_bytes", whole)
    monkeypatch.setattr(type(path), "read_text", whole)
    assert load(path).documents == (("First document here.",), ("Second document here.",))
