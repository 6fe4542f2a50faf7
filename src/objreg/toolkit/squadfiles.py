"""Reading SQuAD v1.1/v2.0 JSON files (:func:`read_squad`), flattened into the paragraphs' contexts
and the usable questions, each with its answer's character span (or none: unanswerable).

The file's shape is checked key by key, and a wrong one raises :class:`objreg.DataError` naming
the JSON path and the shape expected. A question's first answer is its target; a question whose
answer text is not the context at ``answer_start``, or that has no answer and is not
``is_impossible``, is skipped and listed (:class:`SquadFile`), never dropped silently.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from objreg.core.errors import DataError
from objreg.toolkit.taskfiles import json_type, not_a_file

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
        state = not_a_file(path)
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

