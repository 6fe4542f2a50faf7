"""Reading token classification files: CoNLL style (``token ... tag`` per line, the tag in the last
column, a blank line or ``-DOCSTART-`` between sentences) and JSONL records of word and tag lists
(:func:`read_tagged`).

The JSONL word and tag lists are found among the usual keys or named by the caller; records with
no tokens are skipped with a warning; anything malformed raises :class:`objreg.DataError` naming
the file, the line and what is allowed.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from objreg.core.errors import DataError
from objreg.toolkit.taskfiles import is_jsonl, json_type, jsonl_records, label_error, label_set, read_lines

TOKENS_FIELDS = ("tokens", "words")
TAGS_FIELDS = ("tags", "ner_tags", "pos_tags", "labels")
DOCSTART = "-DOCSTART-"
TAGGING_FORMATS = (
    "allowed: CoNLL style (one 'token<TAB>tag' per line, the tag in the last column, a blank line between "
    'sentences) or JSONL lines like {"tokens": ["EU", "rejects"], "tags": ["B-ORG", "O"]}'
)


@dataclass(frozen=True)
class TaggedSentence:
    """One tagged sentence: the line it starts on, its words and their tags."""

    line: int
    words: tuple[str, ...]
    tags: tuple[str, ...]


def _read_conll(path: Path) -> list[TaggedSentence]:
    sentences: list[TaggedSentence] = []
    words: list[str] = []
    tags: list[str] = []
    first = 0
    for number, line in [*read_lines(path, "token_classification data file", TAGGING_FORMATS), (0, "")]:
        columns = line.split()  # a final blank line (0, "") closes the last sentence
        if columns and columns[0] == DOCSTART:
            columns = []  # a document boundary ends the sentence, like a blank line
        if not columns:
            if words:
                sentences.append(TaggedSentence(first, tuple(words), tuple(tags)))
            words, tags = [], []
            continue
        if len(columns) < 2:
            raise DataError(
                f"{path} line {number}: {line.strip()!r} has no tag: expected a token and its tag separated by a "
                f"tab or spaces; {TAGGING_FORMATS}"
            )
        first = first if words else number
        words.append(columns[0])
        tags.append(columns[-1])
    return sentences


def _list_field(path: Path, record: Mapping[str, Any], number: int, given: str, usual: Sequence[str], what: str) -> str:
    listed = ", ".join(map(repr, record)) or "none"
    if given and given not in record:
        raise DataError(f"{path} line {number}: no {given!r} field ({what}_field); its fields: {listed}")
    found = [given] if given else [key for key in usual if key in record]
    if not found:
        raise DataError(
            f"{path} line {number}: no {what} list (its fields: {listed}); expected one of {', '.join(usual)}, "
            f"or name it with the {what}_field parameter. {TAGGING_FORMATS}"
        )
    return found[0]


def _read_tagged_jsonl(path: Path, tokens_field: str, tags_field: str, empty: list[int]) -> list[TaggedSentence]:
    sentences = []
    keys: tuple[str, str] | None = None
    for number, record in jsonl_records(path, "token_classification data file", TAGGING_FORMATS):
        keys = keys or (_list_field(path, record, number, tokens_field, TOKENS_FIELDS, "tokens"),
                        _list_field(path, record, number, tags_field, TAGS_FIELDS, "tags"))
        for key in keys:
            if key not in record:
                raise DataError(f"{path} line {number}: no {key!r} field, which the first record has")
            if not isinstance(record[key], list):
                raise DataError(f"{path} line {number}: {key!r} must be a list, got {json_type(record[key])}")
        words, tags = (record[key] for key in keys)
        for word in words:
            if not isinstance(word, str) or not word.strip():
                got = "an empty string" if isinstance(word, str) else f"a JSON {json_type(word)}"
                raise DataError(f"{path} line {number}: {keys[0]!r} holds {got}; every token is a non-empty string")
        problem = next((p for p in map(label_error, tags) if p), None)
        if problem:
            raise DataError(
                f"{path} line {number}: {keys[1]!r} holds {problem}; a tag must be a non-empty string or an integer"
            )
        if len(words) != len(tags):
            raise DataError(f"{path} line {number}: {len(words)} tokens but {len(tags)} tags; each token needs one tag")
        if not words:
            empty.append(number)
            continue
        sentences.append(TaggedSentence(number, tuple(words), tuple(str(t).strip() for t in tags)))
    if keys is None:
        raise DataError(f"{path}: the file is empty; {TAGGING_FORMATS}")
    return sentences


def read_tagged(
    path: Path, tokens_field: str = "", tags_field: str = "", labels: str = ""
) -> tuple[list[TaggedSentence], list[str]]:
    """The tagged sentences of a CoNLL file (``token ... tag`` per line, the tag in the last column;
    a blank line or ``-DOCSTART-`` between sentences) or a JSONL file (word and tag lists, found
    among the usual keys or named by the arguments), and the tag set in class order (``labels``,
    comma-separated, or read from the file: :func:`label_order`). Warns about empty records."""
    path = Path(path)
    empty: list[int] = []
    if is_jsonl(path, "token_classification data file", TAGGING_FORMATS):
        sentences = _read_tagged_jsonl(path, tokens_field, tags_field, empty)
    else:
        sentences = _read_conll(path)
    if empty:
        warnings.warn(f"{path}: skipped {len(empty)} records with no tokens (first: line {empty[0]})", stacklevel=2)
    if not sentences:
        raise DataError(f"{path}: no tagged sentence in the file; {TAGGING_FORMATS}")
    first_line: dict[str, int] = {}
    for sentence in sentences:
        for tag in sentence.tags:
            first_line.setdefault(tag, sentence.line)
    return sentences, label_set(path, labels, [t for s in sentences for t in s.tags], first_line, "tag")

