"""Hugging Face ``datasets`` corpora: ``--corpus hf:NAME[:CONFIG[:SPLIT]]`` or a directory written
by ``Dataset.save_to_disk``. Needs the ``hf`` extra.

Each record's ``text`` field (else its only string column) is one document, split into sentences;
empty records and WikiText-style heading lines are skipped. ``hf:`` names are read in streaming
mode, so a corpus larger than memory or disk works: the first ``MAX_DOCUMENTS`` documents are
kept. Names are resolved by ``datasets`` itself (its cache, or the Hub where there is a network;
set ``HF_DATASETS_OFFLINE=1`` to stay offline).

Written like a third-party plugin: it imports only the public ``objreg`` facade.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import objreg
from objreg.toolkit.taskfiles import is_heading

PREFIX = "hf:"
MAX_DOCUMENTS = 100_000
#: Files ``save_to_disk`` writes; a directory holding one is a saved dataset, not a folder of text.
SAVED_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")


def _datasets() -> Any:
    try:
        import datasets
    except ImportError as e:
        raise objreg.DataError("a Hugging Face datasets corpus needs the datasets package: pip install 'objreg[hf]'") from e
    return datasets


def is_saved_dataset(path: Path) -> bool:
    try:
        return path.is_dir() and any((path / marker).is_file() for marker in SAVED_MARKERS)
    except (OSError, ValueError):
        return False


def _text_column(columns: Iterable[str], features: Any, where: str) -> str:
    columns = list(columns)
    if "text" in columns:
        return "text"
    strings = [c for c in columns if getattr(features.get(c) if features else None, "dtype", None) == "string"]
    if len(strings) == 1:
        return strings[0]
    raise objreg.DataError(
        f"{where}: no 'text' column to read documents from (columns: {', '.join(columns) or 'none'}); "
        f"rename the text column to 'text'"
    )


def documents_from_records(records: Iterable[dict[str, Any]], column: str, limit: int) -> list[tuple[str, ...]]:
    """Up to ``limit`` non-empty documents, one per record."""
    documents = []
    for record in records:
        text = record.get(column)
        if not isinstance(text, str) or not text.strip() or is_heading(text):
            continue
        sentences = tuple(objreg.split_sentences(text))
        if sentences:
            documents.append(sentences)
            if len(documents) == limit:
                break
    return documents


def _load_named(name: str) -> tuple[Iterator[dict[str, Any]], str, str]:
    parts = name[len(PREFIX) :].split(":")
    if not parts[0] or len(parts) > 3:
        raise objreg.InvalidParameterError(
            f"corpus {name!r}: expected hf:NAME, hf:NAME:CONFIG or hf:NAME:CONFIG:SPLIT, e.g. "
            f"hf:wikitext:wikitext-2-raw-v1:validation"
        )
    dataset_name, config, split = parts[0], (parts[1] if len(parts) > 1 else None) or None, (
        parts[2] if len(parts) > 2 else "train"
    )
    datasets = _datasets()
    try:
        stream = datasets.load_dataset(dataset_name, config, split=split, streaming=True)
        first = list(itertools.islice(iter(stream), 1))
    except Exception as e:  # datasets raises many types (ConnectionError, FileNotFoundError, ValueError, ...)
        raise objreg.DataError(f"corpus {name!r}: datasets could not load it: {type(e).__name__}: {e}") from None
    column = _text_column(first[0].keys() if first else [], getattr(stream, "features", None), name)
    return iter(stream), column, f"Hugging Face dataset {dataset_name} ({config or 'default'}, {split})"


def _load_saved(path: Path) -> tuple[Iterator[dict[str, Any]], str, str]:
    datasets = _datasets()
    try:
        dataset = datasets.load_from_disk(str(path))
    except Exception as e:
        raise objreg.DataError(f"corpus {str(path)!r}: cannot load the saved dataset: {e}") from None
    if isinstance(dataset, datasets.DatasetDict):
        split = "train" if "train" in dataset else sorted(dataset)[0]
        dataset = dataset[split]
    column = _text_column(dataset.column_names, dataset.features, str(path))
    return iter(dataset), column, f"saved dataset {path}"


@objreg.hookimpl
def objreg_register_corpora(register: Callable[[objreg.Provider], None]) -> None:
    register(objreg.Provider("corpus", "hf:NAME[:CONFIG[:SPLIT]]",
                             "a Hugging Face datasets corpus, streamed (needs objreg[hf])",
                             load_corpus, accepts=lambda name: name.startswith(PREFIX)))
    register(objreg.Provider("corpus", "DIR (save_to_disk)", "a dataset saved with Dataset.save_to_disk",
                             load_corpus, accepts=lambda name: is_saved_dataset(Path(name).expanduser())))


def load_corpus(name: str, cache_dir: Path) -> objreg.Corpus:
    if name.startswith(PREFIX):
        records, column, what = _load_named(name)
    else:
        records, column, what = _load_saved(Path(name).expanduser())
    documents = documents_from_records(records, column, MAX_DOCUMENTS)
    if not documents:
        raise objreg.DataError(f"corpus {name!r} is empty: its {column!r} column holds no text")
    n_sentences = sum(len(d) for d in documents)
    return objreg.Corpus(name=name, documents=tuple(documents),
                         description=f"{what}: {len(documents)} documents, {n_sentences} sentences")
