"""Reading classification files: GLUE-style TSV (a header line; fields CSV-quoted or bare) and JSONL
records, each a text (or a text pair) and a label (:func:`read_classification`).

The text, pair and label fields are found among the usual names (GLUE's, NLI data sets', the
JSONL names) or named by the caller; a number label is one class however it is spelt
(:func:`objreg.toolkit.taskfiles.canonical_label`). Records with an empty text or no gold label
(``-``) are skipped with a warning; anything malformed raises :class:`objreg.DataError` naming the
file, the line and what is allowed.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from objreg.core.errors import DataError
from objreg.toolkit.taskfiles import (
    canonical_label,
    is_jsonl,
    json_type,
    jsonl_records,
    label_error,
    label_set,
    read_lines,
)

#: (text, pair) field names tried in this order when ``text_field`` is empty: GLUE's pair tasks
#: (RTE/MNLI/WNLI, QQP, QNLI, MRPC), NLI data sets and the JSONL names.
PAIR_FIELDS = (
    ("sentence1", "sentence2"), ("question1", "question2"), ("question", "sentence"), ("#1 String", "#2 String"),
    ("premise", "hypothesis"), ("text", "text_pair"),
)
#: Single-text field names tried after the pairs (SST-2, CoLA with a header, JSONL).
TEXT_FIELDS = ("sentence", "text")
#: Label field names tried in order when ``label_field`` is empty (GLUE, MNLI, QQP, MRPC).
LABEL_FIELDS = ("label", "gold_label", "is_duplicate", "Quality")
#: A label meaning "annotators did not agree" (SNLI/MNLI ``gold_label``): the record is skipped.
NO_GOLD_LABEL = "-"
CLASSIFICATION_FORMATS = (
    "allowed: a TSV file with a header line (GLUE: sentence, label; or sentence1, sentence2, label) or "
    'JSONL lines like {"text": str, "label": str or int} or {"text": str, "text_pair": str, "label": str or int}'
)
_QUOTED = re.compile(r'"((?:[^"]|"")*)"')  # a CSV-quoted field: outer quotes, inner quotes doubled


@dataclass(frozen=True)
class Record:
    """One usable record of a classification file: its line, its texts and its label as a string."""

    line: int
    text: str
    pair: str | None
    label: str


@dataclass
class _Reading:
    path: Path
    fields: tuple[str, str | None, str] | None = None  # text, pair, label
    records: list[Record] = field(default_factory=list)
    empty_text: list[int] = field(default_factory=list)
    no_gold_label: list[int] = field(default_factory=list)

    def add(self, number: int, text: str, pair: str | None, label: str) -> None:
        if label == NO_GOLD_LABEL:
            self.no_gold_label.append(number)
        elif not text.strip() or (pair is not None and not pair.strip()):
            self.empty_text.append(number)
        else:
            self.records.append(Record(number, text, pair, canonical_label(label)))


def _unquote(text: str) -> str:
    """A CSV-quoted field's text (outer quotes off, doubled quotes single); a bare field as it is."""
    match = _QUOTED.fullmatch(text)
    return match.group(1).replace('""', '"') if match else text


def _choose_fields(names: Sequence[str], given: tuple[str, str, str], path: Path, where: str) -> tuple[str, str | None, str]:
    """The text, pair and label fields among ``names`` (a TSV header or the first JSONL record's
    keys), from the ``given`` (text_field, text_pair_field, label_field) or the usual names."""
    present, listed = set(names), ", ".join(map(repr, names)) or "none"
    text_field, pair_field, label_field = given
    if text_field:
        text, pair = text_field, pair_field or None
        missing = [f for f in (text, pair) if f is not None and f not in present]
        if missing:
            raise DataError(f"{path}: {where} has no field {missing[0]!r} (text_field/text_pair_field); its fields: {listed}")
    else:
        found = [p for p in PAIR_FIELDS if set(p) <= present] + [(t, None) for t in TEXT_FIELDS if t in present]
        if not found:
            usual = ", ".join([f"{a}+{b}" for a, b in PAIR_FIELDS] + list(TEXT_FIELDS))
            raise DataError(
                f"{path}: {where} has no text field (its fields: {listed}); expected one of "
                f"{usual}, or name it with the text_field parameter. {CLASSIFICATION_FORMATS}"
            )
        text, pair = found[0]
    if label_field and label_field not in present:
        raise DataError(f"{path}: {where} has no label field {label_field!r} (label_field); its fields: {listed}")
    labels = [label_field] if label_field else [f for f in LABEL_FIELDS if f in present]
    if not labels:
        raise DataError(
            f"{path}: {where} has no label field (its fields: {listed}); expected one of "
            f"{', '.join(LABEL_FIELDS)}, or name it with the label_field parameter"
        )
    return text, pair, labels[0]


def _read_tsv(reading: _Reading, lines: Iterator[tuple[int, str]], given: tuple[str, str, str]) -> None:
    path = reading.path
    header_line = next(((n, line) for n, line in lines if line.strip()), None)
    if header_line is None:
        raise DataError(f"{path}: the file is empty; {CLASSIFICATION_FORMATS}")
    header = [_unquote(f) for f in header_line[1].split("\t")]
    text, pair, label = _choose_fields(header, given, path, f"the header (line {header_line[0]})")
    columns = {name: header.index(name) for name in (text, pair, label) if name is not None}
    for number, line in lines:
        if not line.strip():
            continue
        values = [_unquote(f) for f in line.split("\t")]
        if len(values) != len(header):
            raise DataError(
                f"{path} line {number}: {len(values)} tab-separated fields, but the header has {len(header)} "
                f"({', '.join(header)}); each record is one line with one field per column"
            )
        value = values[columns[label]].strip()
        if not value:
            raise DataError(f"{path} line {number}: empty {label!r} field; every record needs a label")
        reading.add(number, values[columns[text]], None if pair is None else values[columns[pair]], value)


def _read_classification_jsonl(reading: _Reading, given: tuple[str, str, str]) -> None:
    path = reading.path
    for number, value in jsonl_records(path, "classification data file", CLASSIFICATION_FORMATS):
        if reading.fields is None:
            reading.fields = _choose_fields(list(value), given, path, f"the first record (line {number})")
        text, pair, label_key = reading.fields
        texts: list[str | None] = []
        for key in (text, pair):
            if key is not None and key not in value:
                raise DataError(f"{path} line {number}: no {key!r} field, which the first record has")
            if key is not None and not isinstance(value[key], str):
                raise DataError(f"{path} line {number}: {key!r} must be a string, got {json_type(value[key])}")
            texts.append(None if key is None else value[key])
        if label_key not in value:
            raise DataError(f"{path} line {number}: no {label_key!r} field; every record needs a label")
        problem = label_error(value[label_key])
        if problem:
            raise DataError(
                f"{path} line {number}: {label_key!r} is {problem}; a label must be a non-empty string or an integer"
            )
        reading.add(number, texts[0], texts[1], str(value[label_key]).strip())
    if reading.fields is None:
        raise DataError(f"{path}: the file is empty; {CLASSIFICATION_FORMATS}")


def read_classification(
    path: Path, text_field: str = "", text_pair_field: str = "", label_field: str = "", labels: str = ""
) -> tuple[list[Record], list[str]]:
    """The usable records of a GLUE-style TSV file (a header line; fields CSV-quoted or bare) or a
    JSONL file, and the label set in class order (``labels``, comma-separated, or read from the
    file: :func:`label_order`). Fields are found among the usual names or named by the arguments.
    Warns about records skipped for an empty text or no gold label (``-``)."""
    path = Path(path)
    reading, given = _Reading(path), (text_field, text_pair_field, label_field)
    if is_jsonl(path, "classification data file", CLASSIFICATION_FORMATS):
        _read_classification_jsonl(reading, given)
    else:
        _read_tsv(reading, read_lines(path, "classification data file", CLASSIFICATION_FORMATS), given)
    if reading.empty_text:
        warnings.warn(f"{path}: skipped {len(reading.empty_text)} records with an empty text "
                      f"(first: line {reading.empty_text[0]})", stacklevel=2)
    if reading.no_gold_label:
        warnings.warn(f"{path}: skipped {len(reading.no_gold_label)} records labelled {NO_GOLD_LABEL!r} (no gold "
                      f"label; first: line {reading.no_gold_label[0]})", stacklevel=2)
    if not reading.records:
        dropped = len(reading.empty_text) + len(reading.no_gold_label)
        why = f" (all {dropped} skipped, see the warnings)" if dropped else " after the header"
        raise DataError(f"{path}: no classification record{why}; {CLASSIFICATION_FORMATS}")
    first_line: dict[str, int] = {}
    for record in reading.records:
        first_line.setdefault(record.label, record.line)
    classes = label_set(path, labels, [r.label for r in reading.records], first_line, "label")
    if len(classes) < 2:
        raise DataError(
            f"{path}: every record has the label {classes[0]!r}; classification needs 2 classes "
            f"or more (set the labels parameter to name the others)"
        )
    return reading.records, classes

