"""Hugging Face datasets corpora: a dataset saved to disk, a streamed ``hf:`` name (a local
loading script is not needed: the ``text`` builder reads local files), and the errors."""

from __future__ import annotations

import pytest

import objreg
from objreg.plugins.corpora import hf_datasets

datasets = pytest.importorskip("datasets")


def test_saved_dataset_directory_is_a_corpus(tmp_path, registry):
    texts = ["First document. It has two sentences.", "", " = Heading = ", "Second document here."]
    datasets.Dataset.from_dict({"text": texts, "id": [1, 2, 3, 4]}).save_to_disk(str(tmp_path / "saved"))
    corpus = registry.load_corpus(str(tmp_path / "saved"), tmp_path)
    assert corpus.documents == (("First document.", "It has two sentences."), ("Second document here.",))


def test_dataset_dict_uses_train_and_a_single_string_column(tmp_path, registry):
    train = datasets.Dataset.from_dict({"body": ["Training text here."], "n": [1]})
    test = datasets.Dataset.from_dict({"body": ["Test text here."], "n": [2]})
    datasets.DatasetDict({"train": train, "test": test}).save_to_disk(str(tmp_path / "dd"))
    assert registry.load_corpus(str(tmp_path / "dd"), tmp_path).documents == (("Training text here.",),)


def test_dataset_without_text_column_is_a_clear_error(tmp_path, registry):
    datasets.Dataset.from_dict({"a": ["x"], "b": ["y"]}).save_to_disk(str(tmp_path / "two"))
    with pytest.raises(objreg.DataError, match=r"no 'text' column .*columns: a, b"):
        registry.load_corpus(str(tmp_path / "two"), tmp_path)


def test_streamed_name_keeps_the_first_documents(tmp_path, registry, monkeypatch):
    (tmp_path / "data.txt").write_text("".join(f"Line number {i} is a document.\n" for i in range(20)))
    monkeypatch.setattr(hf_datasets, "MAX_DOCUMENTS", 5)
    real = datasets.load_dataset

    def local_text(name, config, split, streaming):
        assert streaming  # hf: names are never downloaded whole
        return real("text", data_files=str(tmp_path / "data.txt"), split=split, streaming=True)

    monkeypatch.setattr(datasets, "load_dataset", local_text)
    corpus = registry.load_corpus("hf:anything:cfg:train", tmp_path)
    assert [d[0] for d in corpus.documents] == [f"Line number {i} is a document." for i in range(5)]


@pytest.mark.parametrize("name", ["hf:", "hf:a:b:c:d"])
def test_malformed_name(registry, tmp_path, name):
    with pytest.raises(objreg.InvalidParameterError, match="expected hf:NAME"):
        registry.load_corpus(name, tmp_path)


def test_unreachable_name_is_a_data_error(registry, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(objreg.DataError, match="datasets could not load it"):
        registry.load_corpus("hf:objreg-no-such-dataset-xyz", tmp_path)
