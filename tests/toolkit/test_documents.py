"""Tests of the corpus document reader (objreg.toolkit.documents): documents read as the corpus
providers read them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import objreg
from objreg.toolkit.documents import read_documents


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_documents_are_read_as_the_corpus_providers_read_them(tmp_path, texts):
    path = write(tmp_path, "docs.txt", "\n\n".join(texts) + "\n")
    assert read_documents(str(path), "ordering data") == [tuple(objreg.split_sentences(t)) for t in texts]
    jsonl = write(tmp_path, "docs.jsonl", "".join(json.dumps({"text": t}) + "\n" for t in texts[:2]))
    assert read_documents(str(jsonl), "ordering data") == [tuple(objreg.split_sentences(t)) for t in texts[:2]]
    with pytest.raises(objreg.DataError, match=r"ordering data .*nothere\.txt does not exist; give a plain-text file"):
        read_documents(str(tmp_path / "nothere.txt"), "ordering data")
