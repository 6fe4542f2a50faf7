"""Reading downstream task files, the shared part: text files line by line, JSONL records, the JSON
type names for messages, WikiText headings, and labels (one spelling per number, the class order,
a given label set); also how a task picks its examples, evenly spaced over a file
(:func:`evenly_spaced`) or one document after another (:func:`round_robin`).

Every reader validates the file and raises :class:`objreg.DataError` naming the file, the line
(or the JSON path) and what is allowed; records it skips are warned about or counted, never
dropped silently. The readers of each file kind build on this module: classification files
(:mod:`objreg.toolkit.classfiles`), tagged sentences (:mod:`objreg.toolkit.tagfiles`), SQuAD
(:mod:`objreg.toolkit.squadfiles`) and corpus documents (:mod:`objreg.toolkit.documents`); the
corpus plugins share its line reader, JSON type names and heading rule. The task plugins build
batches from what the readers return and read no file themselves.
"""

from __future__ import annotations

import decimal
import json
import os
import re
import stat
from collections.abc import Iterable, Iterator, Mapping, Sequence
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


def not_a_file(path: Path) -> str:
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
        state = not_a_file(path)
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


def jsonl_records(path: Path, what: str, allowed: str) -> Iterator[tuple[int, dict[str, Any]]]:
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


def label_set(path: Path, given: str, found: list[str], line_of: Mapping[str, int], kind: str) -> list[str]:
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


def label_error(value: Any) -> str | None:
    """What is wrong with a JSON label or tag (None: a non-empty string or an integer)."""
    if isinstance(value, bool) or not isinstance(value, (str, int)) or (isinstance(value, str) and not value.strip()):
        return "an empty string" if isinstance(value, str) else f"a JSON {json_type(value)} ({json.dumps(value)})"
    return None

