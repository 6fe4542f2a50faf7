"""User corpora from files: plain text, JSONL, or a directory of them (``--corpus PATH``).

Plain text: documents are blocks separated by blank lines; a file without blank lines has one
document per line. WikiText heading lines (`` = Title = ``, `` = = Section = = ``) are dropped.
JSONL: one JSON object per line with a string ``"text"`` field; each object is a document.
A directory: every ``*.txt`` and ``*.jsonl`` file below it, in sorted path order.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import objreg

JSONL_SUFFIXES = (".jsonl", ".json")
#: Names ending like this are meant as paths even when the file does not exist.
PATH_SUFFIXES = (".txt", ".jsonl", ".json", ".md")
DIRECTORY_PATTERNS = ("*.txt", "*.jsonl")

_HEADING = re.compile(r"^\s*(= )+.*( =)+\s*$")
_JSONL_SHAPE = 'one JSON object per line with a string "text" field, like {"text": "First sentence. Second."}'


@objreg.hookimpl
def objreg_load_corpus(name: str, cache_dir: Path) -> objreg.Corpus | None:
    """A corpus read from the file or directory ``name``; ``None`` when ``name`` is not a path."""
    path = Path(name).expanduser()
    if not _exists(path):
        if not _looks_like_path(name):
            return None  # the registry then lists the corpus names it knows
        raise objreg.DataError(
            f"corpus file {name!r} does not exist; give a plain-text (.txt) or JSONL (.jsonl) file, "
            f"or a directory of them"
        )
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


@objreg.hookimpl
def objreg_providers() -> list[objreg.ProviderInfo]:
    return [
        objreg.ProviderInfo(
            "corpus",
            "PATH",
            "plain text (blank-line-separated documents), JSONL with a text field, or a directory of them",
        )
    ]


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


def read_file(path: Path) -> list[Document]:
    """The documents of one text or JSONL file (possibly none)."""
    text = _read_text(path)
    if path.suffix.lower() in JSONL_SUFFIXES:
        return _parse_jsonl(path, text)
    return _parse_text(text)


def _read_directory(path: Path) -> list[Document]:
    files = sorted({p for pattern in DIRECTORY_PATTERNS for p in path.rglob(pattern) if p.is_file()})
    if not files:
        raise objreg.DataError(
            f"corpus directory '{path}' has no .txt or .jsonl files (searched recursively); "
            f"put plain-text or JSONL files in it"
        )
    # An empty file among others is harmless; the whole directory being empty is reported above.
    return [doc for file in files for doc in read_file(file)]


def _read_text(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise objreg.DataError(f"cannot read corpus file '{path}': {e.strerror or e}") from e
    try:
        # utf-8-sig: a byte-order mark some editors write is not text.
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise objreg.DataError(
            f"corpus file '{path}' is not UTF-8 text: invalid byte 0x{data[e.start]:02x} at byte offset "
            f"{e.start}; save it as UTF-8"
        ) from e


def _lines(text: str) -> list[str]:
    # Split on newlines only: str.splitlines() also breaks at form feeds and U+2028, which would
    # shift the line numbers that error messages give.
    return [line.rstrip("\r") for line in text.split("\n")]


def _parse_text(text: str) -> list[Document]:
    """Blank-line-separated blocks are documents; without blank lines, each line is one."""
    lines = _lines(text.strip())
    if all(line.strip() for line in lines):
        blocks = [[line] for line in lines if not _HEADING.match(line)]
    else:
        blocks, current = [], []
        for line in lines:
            # A heading ends a block too: the text under a new heading is a new document.
            if line.strip() and not _HEADING.match(line):
                current.append(line)
            elif current:
                blocks.append(current)
                current = []
        blocks.append(current)
    documents = [tuple(objreg.split_sentences(" ".join(block))) for block in blocks]
    return [doc for doc in documents if doc]


def _parse_jsonl(path: Path, text: str) -> list[Document]:
    documents = []
    for number, line in enumerate(_lines(text), start=1):
        if not line.strip():
            continue  # blank lines (a trailing newline, spacing) carry no record
        try:
            record = json.loads(line)
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
            documents.append(sentences)
    return documents


_JSON_TYPES = {dict: "object", list: "array", str: "string", int: "number", float: "number", bool: "boolean"}


def _describe(record: object) -> str:
    """What a JSONL line held instead of an object with a string "text" field, in JSON terms."""
    if not isinstance(record, dict):
        return f"a JSON {_json_type(record)}"
    if "text" not in record:
        keys = ", ".join(json.dumps(k) for k in list(record)[:5]) or "none"
        return f'an object without a "text" field (its keys: {keys})'
    return f'a "text" field that is a JSON {_json_type(record["text"])}, not a string'


def _json_type(value: object) -> str:
    return "null" if value is None else _JSON_TYPES.get(type(value), type(value).__name__)
