"""Reading downstream task files: GLUE-style TSV and JSONL classification records, CoNLL and JSONL
tagged sentences, SQuAD v1.1/v2.0 JSON, and the documents of a text corpus (whose line reader,
JSON type names and heading rule the corpus plugins share).

Every reader validates the file and raises :class:`objreg.DataError` naming the file, the line
(or the JSON path) and what is allowed; records it skips (no gold label, an empty text, an answer
that does not match its context) are warned about or counted, never dropped silently. The task
plugins build batches from what these return and read no file themselves.

It also holds how a task picks its examples: evenly spaced over a file (:func:`evenly_spaced`) or
one document after another (:func:`round_robin`).

One module by design, about 550 lines: issue 15 asks for task file I/O in one place, and the
formats share the line reader, the JSON records, the JSON type names and the label order.
"""

from __future__ import annotations

import decimal
import json
import os
import re
import stat
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from objreg.core.errors import DataError

T = TypeVar("T")
_END = object()
_HEADING = re.compile(r"^\s*(= )+.*( =)+\s*$")
_JSON_TYPES = {dict: "object", list: "array", str: "string", int: "integer", float: "number", bool: "boolean"}


def json_type(value: Any) -> str:
    """The JSON name of ``value``'s type (``object``, ``array``, ``integer``, ...), for messages."""
    return "null" if value is None else _JSON_TYPES.get(type(value), type(value).__name__)


def evenly_spaced(n: int, k: int) -> list[int]:
    """``k`` indices spread evenly over ``range(n)`` (all of them when ``k >= n``)."""
    k = min(k, n)
    return [i * n // k for i in range(k)]


def round_robin(streams: Iterable[Iterable[T | None]], limit: int) -> list[T]:
    """Up to ``limit`` items, one from each stream in turn (a stream leaves the turn when it runs
    out), so a small ``limit`` still spans every stream (document). A ``None`` item takes its
    stream's turn and is dropped (a position without a usable example)."""
    out: list[T] = []
    active = [iter(stream) for stream in streams]
    while active and len(out) < limit:
        still = []
        for stream in active:
            item = next(stream, _END)
            if item is _END:
                continue
            still.append(stream)
            if item is not None:
                out.append(item)  # type: ignore[arg-type]
                if len(out) == limit:
                    break
        active = still
    return out


_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def canonical_label(label: str) -> str:
    """A label that is a number, written one way: ``00`` → ``0``, ``1.0`` and ``+1`` → ``1``,
    ``0.50`` → ``0.5``; so the same number is one class however a file spells it (a binary task
    labelled ``0``/``00``/``1``/``1.0`` would otherwise train as four classes). Other labels are
    kept as they are."""
    if not _NUMBER.fullmatch(label):
        return label
    value = decimal.Decimal(label)
    if abs(value.adjusted()) > 64:  # 1e999999999: too long to write out (and beyond decimal's arithmetic)
        sign, digits, exponent = value.as_tuple()
        while len(digits) > 1 and digits[-1] == 0:
            digits, exponent = digits[:-1], exponent + 1
        return f"{'-' if sign else ''}{''.join(map(str, digits))}E{exponent}"
    if value == value.to_integral_value():
        return str(int(value))
    return format(value.normalize(), "f")


def label_order(labels: Sequence[str]) -> list[str]:
    """The distinct labels in class order: numeric when every label is an integer, else alphabetical."""
    distinct = set(labels)
    if all(re.fullmatch(r"[+-]?\d+", label) for label in distinct):
        return sorted(distinct, key=int)
    return sorted(distinct)


def _not_a_file(path: Path) -> str:
    if path.is_dir():
        return "is a directory, not a file"
    return "is not a regular file (a pipe, FIFO or device)" if path.exists() else "does not exist"


def check_regular(path: Path, what: str) -> None:
    """``path``, if it exists, must be a regular file or a directory: checked with ``stat``,
    which never blocks (opening a FIFO waits for a writer; a pipe can be read only once).

    Raises:
        DataError: it is a FIFO, pipe, socket or device.
    """
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise DataError(f"{what} is not a regular file (a pipe, FIFO, socket or device): objreg reads its inputs "
                        f"more than once; save it to a file first")


def read_lines(path: Path, what: str, allowed: str = "") -> Iterator[tuple[int, str]]:
    """``(line number, line)`` of a UTF-8 file, streamed, without line endings (a leading BOM is
    not text). Split on newlines only, so line numbers match an editor's. ``what`` names the file
    in errors (``"classification data file"``), ``allowed`` says what the file may hold."""
    if not path.is_file():
        state = _not_a_file(path)
        raise DataError(f"{what} {path} {state}" + (f"; {allowed}" if allowed else ""))
    try:
        with path.open("rb") as handle:
            offset = 0
            for number, raw in enumerate(handle, start=1):
                try:
                    line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
                except UnicodeDecodeError as e:
                    raise DataError(
                        f"{path} line {number}: not UTF-8 text (byte {e.start}: 0x{raw[e.start]:02x}, byte offset "
                        f"{offset + e.start} of the file); save it as UTF-8"
                    ) from None
                offset += len(raw)
                yield number, line.rstrip("\n").rstrip("\r")
    except OSError as e:
        raise DataError(f"cannot read {what} '{path}': {e.strerror or e}") from e


def is_heading(line: str) -> bool:
    """A WikiText heading line (`` = Title = ``, `` = = Section = = ``), which is not prose."""
    return bool(_HEADING.match(line))


def is_jsonl(path: Path, what: str, allowed: str) -> bool:
    """JSONL by suffix, or by a first non-blank line that opens a JSON object."""
    if path.suffix.lower() in (".jsonl", ".json", ".ndjson"):
        return True
    first = next((line for _, line in read_lines(path, what, allowed) if line.strip()), "")
    return first.lstrip().startswith("{")


def _jsonl_records(path: Path, what: str, allowed: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` of each non-blank line of a JSONL file."""
    for number, line in read_lines(path, what, allowed):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except RecursionError:
            raise DataError(f"{path} line {number}: JSON nested too deeply to read; {allowed}") from None
        except json.JSONDecodeError as e:
            raise DataError(f"{path} line {number}: not valid JSON ({e.msg}, column {e.colno}); {allowed}") from None
        if not isinstance(value, dict):
            raise DataError(f"{path} line {number}: a JSON {json_type(value)}, not an object; {allowed}")
        yield number, value


def _label_set(path: Path, given: str, found: list[str], line_of: Mapping[str, int], kind: str) -> list[str]:
    """The class order: ``given`` (comma-separated, every label found must be in it) or the
    found labels in :func:`label_order`. ``line_of`` maps a label to the line it first appears on."""
    if not given:
        return label_order(found)
    classes = list(dict.fromkeys(canonical_label(label.strip()) for label in given.split(",") if label.strip()))
    allowed = set(classes)
    unknown = [label for label in line_of if label not in allowed]
    if unknown:
        first = min(unknown, key=line_of.__getitem__)
        raise DataError(
            f"{path} line {line_of[first]}: {kind} {first!r} is not in the labels parameter ({', '.join(classes)})"
        )
    return classes


def _label_error(value: Any) -> str | None:
    """What is wrong with a JSON label or tag (None: a non-empty string or an integer)."""
    if isinstance(value, bool) or not isinstance(value, (str, int)) or (isinstance(value, str) and not value.strip()):
        return "an empty string" if isinstance(value, str) else f"a JSON {json_type(value)} ({json.dumps(value)})"
    return None


# -- classification: GLUE-style TSV and JSONL -------------------------------------------------------

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
    for number, value in _jsonl_records(path, "classification data file", CLASSIFICATION_FORMATS):
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
        problem = _label_error(value[label_key])
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
    classes = _label_set(path, labels, [r.label for r in reading.records], first_line, "label")
    if len(classes) < 2:
        raise DataError(
            f"{path}: every record has the label {classes[0]!r}; classification needs 2 classes "
            f"or more (set the labels parameter to name the others)"
        )
    return reading.records, classes


# -- token classification: CoNLL and JSONL ----------------------------------------------------------

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
    for number, record in _jsonl_records(path, "token_classification data file", TAGGING_FORMATS):
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
        problem = next((p for p in map(_label_error, tags) if p), None)
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
    return sentences, _label_set(path, labels, [t for s in sentences for t in s.tags], first_line, "tag")


# -- SQuAD JSON ------------------------------------------------------------------------------------

SQUAD_SHAPE = (
    'SQuAD v1.1/v2.0 JSON is {"data": [{"paragraphs": [{"context": str, "qas": [{"question": str, '
    '"answers": [{"text": str, "answer_start": int}], "is_impossible": bool (v2, optional)}]}]}]}'
)


@dataclass(frozen=True)
class SquadQuestion:
    """One usable SQuAD question; ``paragraph`` indexes :attr:`SquadFile.contexts`."""

    paragraph: int
    question: str
    answer: tuple[int, int] | None  # character span [start, end) in the context; None: unanswerable


@dataclass
class SquadFile:
    """A validated SQuAD file, flattened: the paragraphs' contexts, the usable questions in file
    order, the JSON paths of the questions skipped, and the first answer text of every question
    that has one (usable or not)."""

    contexts: list[str] = field(default_factory=list)
    questions: list[SquadQuestion] = field(default_factory=list)
    mismatched: list[str] = field(default_factory=list)  # answer text != context at answer_start
    no_answer: list[str] = field(default_factory=list)  # no answer and not "is_impossible"
    first_answers: list[str] = field(default_factory=list)


def _squad_type(value: Any) -> str:
    name = json_type(value)
    return "list" if name == "array" else name


def _squad_field(path: Path, node: Any, where: str, key: str, kind: type) -> Any:
    """``node[key]`` checked to be a ``kind``; a DataError naming the place otherwise."""
    expected = _squad_type(kind())
    expected = f"{'an' if expected in ('object', 'integer') else 'a'} {expected}"
    if not isinstance(node, dict):
        raise DataError(f"{path}: {where} must be a JSON object, got {_squad_type(node)}. {SQUAD_SHAPE}")
    if key not in node:
        raise DataError(f"{path}: {where} has no {key!r} key (expected {expected}). {SQUAD_SHAPE}")
    value = node[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise DataError(f"{path}: {where}.{key} must be {expected}, got {_squad_type(value)}. {SQUAD_SHAPE}")
    return value


def _squad_question(path: Path, qa: Any, where: str, squad: SquadFile) -> None:
    context = squad.contexts[-1]
    text = _squad_field(path, qa, where, "question", str)
    answers = _squad_field(path, qa, where, "answers", list)
    impossible = qa.get("is_impossible", False)
    if not isinstance(impossible, bool):
        raise DataError(f"{path}: {where}.is_impossible must be a boolean, got {_squad_type(impossible)}")
    for k, answer in enumerate(answers):  # check every answer's shape, though only the first is used
        _squad_field(path, answer, f"{where}.answers[{k}]", "text", str)
        _squad_field(path, answer, f"{where}.answers[{k}]", "answer_start", int)
    if answers:
        squad.first_answers.append(answers[0]["text"])
    if impossible:
        squad.questions.append(SquadQuestion(len(squad.contexts) - 1, text, None))
        return
    if not answers:
        squad.no_answer.append(where)
        return
    start, answer_text = answers[0]["answer_start"], answers[0]["text"]
    end = start + len(answer_text)
    if start < 0 or not answer_text.strip() or context[start:end] != answer_text:
        squad.mismatched.append(f"{where}.answers[0]")
        return
    squad.questions.append(SquadQuestion(len(squad.contexts) - 1, text, (start, end)))


def read_squad(path: Path, what: str = "qa data file") -> SquadFile:
    """A SQuAD v1.1/v2.0 file, its shape checked key by key. A question's first answer is its
    target; ``is_impossible`` questions are unanswerable; a question whose answer text is not the
    context at ``answer_start`` is skipped (:attr:`SquadFile.mismatched`)."""
    path = Path(path)
    if not path.is_file():
        state = _not_a_file(path)
        raise DataError(f"{what} {path} {state}; pass a SQuAD v1.1/v2.0 JSON file")
    try:
        top = json.loads(path.read_text(encoding="utf-8"))
    except RecursionError:
        raise DataError(f"{path}: JSON nested too deeply to read. {SQUAD_SHAPE}") from None
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: not valid JSON at line {e.lineno}, column {e.colno}: {e.msg}. {SQUAD_SHAPE}") from None
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text (byte {e.start}); SQuAD files are UTF-8 JSON") from None
    squad = SquadFile()
    for a, article in enumerate(_squad_field(path, top, "the top level", "data", list)):
        for p, paragraph in enumerate(_squad_field(path, article, f"data[{a}]", "paragraphs", list)):
            where = f"data[{a}].paragraphs[{p}]"
            squad.contexts.append(_squad_field(path, paragraph, where, "context", str))
            for q, qa in enumerate(_squad_field(path, paragraph, where, "qas", list)):
                _squad_question(path, qa, f"{where}.qas[{q}]", squad)
    return squad


# -- documents --------------------------------------------------------------------------------------


def read_documents(source: str, what: str) -> list[tuple[str, ...]]:
    """The documents of a text or JSONL file or a directory of them (or any other corpus name),
    read by the registered corpus providers exactly as ``--corpus`` reads it."""
    from objreg.core.registry import Registry  # the registry loads the plugins, which import this module
    from objreg.toolkit.cache import cache_dir

    path = Path(source).expanduser()
    if not path.exists():
        raise DataError(
            f"{what} {source} does not exist; give a plain-text file (documents separated by blank "
            f'lines, or one per line), a JSONL file with a "text" field, or a directory of them'
        )
    return [tuple(doc) for doc in Registry.load().load_corpus(str(path), cache_dir()).documents]
