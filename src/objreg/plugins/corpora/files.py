"""User corpora from files: plain text, JSONL, or a directory of them (``--corpus PATH``).

Plain text: documents are blocks separated by blank lines; a file without blank lines has one
document per line. WikiText heading lines (`` = Title = ``, `` = = Section = = ``) are dropped.
JSONL: one JSON object per line with a string ``"text"`` field; each object is a document.
A directory: every ``*.txt`` and ``*.jsonl`` file below it, in sorted path order.

Files are streamed line by line, never read whole, so a corpus larger than memory works: it is
read twice (count, then keep) and thinned to ``MAX_DOCUMENTS`` evenly spaced documents.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import objreg
from objreg.toolkit.taskfiles import check_regular, evenly_spaced, is_heading, json_type, read_lines

JSONL_SUFFIXES = (".jsonl", ".json")
#: Names ending like this are meant as paths even when the file does not exist.
PATH_SUFFIXES = (".txt", ".jsonl", ".json", ".md")
DIRECTORY_PATTERNS = ("*.txt", "*.jsonl")

_JSONL_SHAPE = 'one JSON object per line with a string "text" field, like {"text": "First sentence. Second."}'


@objreg.hookimpl
def objreg_register_corpora(register: Callable[[objreg.Provider], None]) -> None:
    register(objreg.Provider(
        "corpus", "PATH", "plain text (blank-line-separated documents), JSONL with a text field, or a directory of them",
        load_corpus, accepts=lambda name: _exists(Path(name).expanduser()) or _looks_like_path(name),
    ))


def load_corpus(name: str, cache_dir: Path) -> objreg.Corpus:
    """A corpus read from the file or directory ``name``."""
    path = Path(name).expanduser()
    if not _exists(path):
        raise objreg.DataError(
            f"corpus file {name!r} does not exist; give a plain-text (.txt) or JSONL (.jsonl) file, "
            f"or a directory of them"
        )
    check_regular(path, f"corpus {name!r}")  # a FIFO would block, a pipe be read once
    if path.is_dir():
        documents, what, holder = _read_directory(path), f"directory {name}", "its .txt and .jsonl files hold"
    else:
        documents, what, holder = read_file(path), f"file {name}", "the file holds"
    if not documents:
        raise objreg.DataError(
            f"corpus {name!r} is empty: {holder} no text; a corpus needs prose sentences "
            f"(plain text, or JSONL records with a \"text\" field)"
        )
    n_sentences = sum(len(d) for d in documents)
    return objreg.Corpus(
        name=name,
        documents=tuple(documents),
        description=f"{what}: {len(documents)} documents, {n_sentences} sentences",
    )


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except (OSError, ValueError) as e:  # a directory on the way we may not enter; a NUL in the name
        raise objreg.DataError(f"cannot access corpus path '{path}': {e}") from e


def _looks_like_path(name: str) -> bool:
    separators = [os.sep] + ([os.altsep] if os.altsep else [])
    return any(sep in name for sep in separators) or name.lower().endswith(PATH_SUFFIXES)


# -- readers --------------------------------------------------------------------------------------

Document = tuple[str, ...]

#: Corpora with more documents than this keep an evenly spaced subset of this many: a run draws
#: far fewer examples than that, and the tokenised corpus must fit in memory.
MAX_DOCUMENTS = 100_000


def read_file(path: Path, max_documents: int | None = None) -> list[Document]:
    """The documents of one text or JSONL file (possibly none), read line by line, never whole:
    a first pass counts the documents, a second keeps at most ``max_documents`` (default
    ``MAX_DOCUMENTS``) evenly spaced ones (all of them for a smaller file)."""
    max_documents = max_documents or MAX_DOCUMENTS
    count = sum(1 for _ in _documents(path))
    keep = set(evenly_spaced(count, max_documents))
    if count > max_documents:
        warnings.warn(
            f"corpus file '{path}' has {count:,} documents; using {max_documents:,} evenly spaced ones",
            stacklevel=2,
        )
    return [doc for i, doc in enumerate(_documents(path)) if i in keep]


def _documents(path: Path) -> Iterator[Document]:
    if path.suffix.lower() in JSONL_SUFFIXES:
        return _parse_jsonl(path)
    return _parse_text(path)


def _read_directory(path: Path) -> list[Document]:
    files = sorted({p for pattern in DIRECTORY_PATTERNS for p in path.rglob(pattern) if p.is_file()})
    if not files:
        raise objreg.DataError(
            f"corpus directory '{path}' has no .txt or .jsonl files (searched recursively); "
            f"put plain-text or JSONL files in it"
        )
    # An empty file among others is harmless; the whole directory being empty is reported above.
    counts = [sum(1 for _ in _documents(file)) for file in files]
    keep = set(evenly_spaced(sum(counts), MAX_DOCUMENTS))
    if sum(counts) > MAX_DOCUMENTS:
        warnings.warn(
            f"corpus directory '{path}' has {sum(counts):,} documents; using {MAX_DOCUMENTS:,} evenly spaced ones",
            stacklevel=2,
        )
    documents, offset = [], 0
    for file, count in zip(files, counts):
        documents += [doc for i, doc in enumerate(_documents(file)) if offset + i in keep]
        offset += count
    return documents


def _lines(path: Path) -> Iterator[str]:
    """The file's lines, streamed, without line endings (:func:`objreg.toolkit.taskfiles.read_lines`:
    split on newlines only, a leading BOM dropped, errors that name the line and byte offset)."""
    return (line for _, line in read_lines(path, "corpus file"))


def _parse_text(path: Path) -> Iterator[Document]:
    """Blank-line-separated blocks are documents; without blank lines, each line is one."""
    # Blank lines before the first and after the last text line do not count.
    seen_text = blank_inside = pending_blank = False
    for line in _lines(path):
        if line.strip():
            blank_inside |= pending_blank and seen_text
            seen_text, pending_blank = True, False
        else:
            pending_blank = True
    current: list[str] = []
    for line in _lines(path):
        # A heading ends a block too: the text under a new heading is a new document.
        if line.strip() and not is_heading(line):
            current.append(line)
            if blank_inside:
                continue
        if current:
            document = tuple(objreg.split_sentences(" ".join(current)))
            current = []
            if document:
                yield document
    if current:
        document = tuple(objreg.split_sentences(" ".join(current)))
        if document:
            yield document


def _parse_jsonl(path: Path) -> Iterator[Document]:
    for number, line in read_lines(path, "corpus file"):
        if not line.strip():
            continue  # blank lines (a trailing newline, spacing) carry no record
        try:
            record = json.loads(line)
        except RecursionError:
            raise objreg.DataError(f"corpus file '{path}' line {number}: JSON nested too deeply to read") from None
        except json.JSONDecodeError as e:
            # A pretty-printed .json file fails here; say how such a file is read.
            hint = " (a .json corpus is read as JSON Lines)" if path.suffix.lower() == ".json" else ""
            raise objreg.DataError(
                f"corpus file '{path}' line {number}: not valid JSON ({e.msg}, column {e.colno}){hint}; "
                f"expected {_JSONL_SHAPE}"
            ) from e
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            got = _describe(record)
            raise objreg.DataError(f"corpus file '{path}' line {number}: expected {_JSONL_SHAPE}; got {got}")
        sentences = tuple(objreg.split_sentences(record["text"]))
        if sentences:
            yield sentences


def _describe(record: object) -> str:
    """What a JSONL line held instead of an object with a string "text" field, in JSON terms."""
    if not isinstance(record, dict):
        return f"a JSON {json_type(record)}"
    if "text" not in record:
        keys = ", ".join(json.dumps(k) for k in list(record)[:5]) or "none"
        return f'an object without a "text" field (its keys: {keys})'
    return f'a "text" field that is a JSON {json_type(record["text"])}, not a string'
