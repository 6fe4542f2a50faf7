"""Objective-weight schedules: ``α_k(t) = w_k · m_k(t)``, a base weight times a shape.

The base weights ``w_k`` come from ``--weights``; the shape ``m_k(t)`` from ``--schedule``:

* ``constant``: ``m(t) = 1``.
* ``linear[:START:END]``: straight from START at the first step to END at the last (default 1→0).
* ``cosine[:START:END]``: half a cosine from START to END (default 1→0), flat at both ends.
* ``step:AT[:BEFORE:AFTER]``: BEFORE until step AT (0-based), AFTER from step AT on (default 1, 0).
* ``adaptive[:RULE]``: set from the probes as the run goes (:mod:`objreg.analysis.run.adaptive`; RULE
  ``quadratic``, the default, or ``tartan``), for every objective at once.

A schedule string is comma-separated ``[NAME=]SHAPE``; an entry without a name applies to every
objective not named elsewhere, e.g. ``cosine`` or ``mlm=linear:1:0,sop=step:8:0:1``. In the
library, a value may also be a :class:`Schedule` or any callable ``(step, steps) -> float``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from objreg.core.errors import InvalidParameterError

SHAPES = "constant, linear[:START:END], cosine[:START:END], step:AT[:BEFORE:AFTER] or adaptive[:RULE]"
ADAPTIVE_RULES = ("quadratic", "tartan")


def _progress(step: int, steps: int) -> float:
    """0 at the first step, 1 at the last (0 throughout a one-step run)."""
    return step / (steps - 1) if steps > 1 else 0.0


@dataclass(frozen=True)
class Schedule:
    """A weight multiplier ``m(step, steps)``; subclasses are the built-in shapes."""

    def __call__(self, step: int, steps: int) -> float:
        raise NotImplementedError

    @property
    def spec(self) -> str:
        """The schedule in ``--schedule`` syntax (how the report records it)."""
        raise NotImplementedError


@dataclass(frozen=True)
class Constant(Schedule):
    def __call__(self, step: int, steps: int) -> float:
        return 1.0

    @property
    def spec(self) -> str:
        return "constant"


@dataclass(frozen=True)
class Linear(Schedule):
    start: float = 1.0
    end: float = 0.0

    def __call__(self, step: int, steps: int) -> float:
        return self.start + (self.end - self.start) * _progress(step, steps)

    @property
    def spec(self) -> str:
        return f"linear:{self.start:g}:{self.end:g}"


@dataclass(frozen=True)
class Cosine(Schedule):
    start: float = 1.0
    end: float = 0.0

    def __call__(self, step: int, steps: int) -> float:
        return self.end + (self.start - self.end) * (1.0 + math.cos(math.pi * _progress(step, steps))) / 2.0

    @property
    def spec(self) -> str:
        return f"cosine:{self.start:g}:{self.end:g}"


@dataclass(frozen=True)
class Step(Schedule):
    at: int
    before: float = 1.0
    after: float = 0.0

    def __call__(self, step: int, steps: int) -> float:
        return self.before if step < self.at else self.after

    @property
    def spec(self) -> str:
        return f"step:{self.at}:{self.before:g}:{self.after:g}"


@dataclass(frozen=True)
class Adaptive(Schedule):
    """Weights set from the probes by an adaptive rule (:mod:`objreg.analysis.run.adaptive`); the
    base weights are where it starts. Not a function of the step: the loop asks the rule."""

    rule: str = "quadratic"

    def __call__(self, step: int, steps: int) -> float:
        raise TypeError("adaptive weights come from the probes, not from the step")

    @property
    def spec(self) -> str:
        return f"adaptive:{self.rule}"


@dataclass(frozen=True)
class Custom(Schedule):
    """A user function ``(step, steps) -> multiplier``; its values are checked as they are used."""

    function: Callable[[int, int], float]

    def __call__(self, step: int, steps: int) -> float:
        return self.function(step, steps)

    @property
    def spec(self) -> str:
        return f"callable:{getattr(self.function, '__qualname__', type(self.function).__name__)}"


def _number(text: str, what: str, entry: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise InvalidParameterError(f"schedule {entry!r}: {what} must be a number, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise InvalidParameterError(f"schedule {entry!r}: {what} must be finite and ≥ 0, got {text!r}")
    return value


def parse_shape(text: str, entry: str | None = None) -> Schedule:
    """One shape, e.g. ``"linear:1:0"``.

    Raises:
        InvalidParameterError: an unknown shape, a wrong number of arguments, or a bad number.
    """
    entry = entry or text
    shape, *args = [part.strip() for part in text.strip().split(":")]
    if shape == "constant" and not args:
        return Constant()
    if shape in ("linear", "cosine") and len(args) in (0, 2):
        numbers = [_number(a, n, entry) for a, n in zip(args, ("START", "END"))]
        return (Linear if shape == "linear" else Cosine)(*numbers)
    if shape == "step" and len(args) in (1, 3):
        if not args[0].isdigit():
            raise InvalidParameterError(f"schedule {entry!r}: AT must be a step number ≥ 0, got {args[0]!r}")
        return Step(int(args[0]), *[_number(a, n, entry) for a, n in zip(args[1:], ("BEFORE", "AFTER"))])
    if shape == "adaptive" and len(args) <= 1:
        rule = args[0] if args else "quadratic"
        if rule not in ADAPTIVE_RULES:
            raise InvalidParameterError(f"schedule {entry!r}: unknown adaptive rule {rule!r}, expected "
                                        f"{' or '.join(ADAPTIVE_RULES)}")
        return Adaptive(rule)
    if shape in ("constant", "linear", "cosine", "step", "adaptive"):
        raise InvalidParameterError(f"schedule {entry!r} has the wrong number of arguments: expected {SHAPES}")
    raise InvalidParameterError(f"unknown schedule shape {shape!r} in {entry!r}: expected {SHAPES}")


def _as_schedule(value: Any, entry: str) -> Schedule:
    if isinstance(value, Schedule):
        return value
    if isinstance(value, str):
        return parse_shape(value, entry)
    if callable(value):
        return Custom(value)
    raise InvalidParameterError(f"schedule {entry!r} must be a shape string or a callable (step, steps) -> float")


def parse_schedules(schedule: Mapping[str, Any] | str | Callable[..., float] | None,
                    pretrain: Sequence[str]) -> dict[str, Schedule]:
    """A schedule for every objective (``constant`` where none is given).

    Accepts ``None``; a ``--schedule`` string; one callable or :class:`Schedule` for all objectives;
    or a mapping from objective name (or ``"*"`` for the rest) to a shape string, a
    :class:`Schedule` or a callable.

    Raises:
        InvalidParameterError: a malformed entry, an unselected or repeated objective.
    """
    entries: dict[str, Any] = {}
    if schedule is None:
        pass
    elif isinstance(schedule, str):
        for item in filter(None, (part.strip() for part in schedule.split(","))):
            name, sep, shape = item.rpartition("=")
            key = name.strip() if sep else "*"
            if sep and not key:
                raise InvalidParameterError(f"malformed schedule {item!r}: expected [NAME=]SHAPE, e.g. mlm=linear:1:0")
            if key in entries:
                what = f"objective {key!r}" if key != "*" else "all objectives (an entry without NAME=)"
                raise InvalidParameterError(f"schedule given twice for {what} in {schedule!r}")
            entries[key] = _as_schedule(shape, item)
    elif isinstance(schedule, Mapping):
        entries = {str(k): _as_schedule(v, f"{k}={v}" if isinstance(v, str) else str(k)) for k, v in schedule.items()}
    else:
        entries = {"*": _as_schedule(schedule, "schedule")}
    unknown = sorted(set(entries) - set(pretrain) - {"*"})
    if unknown:
        raise InvalidParameterError(
            f"schedule given for {', '.join(map(repr, unknown))}, which is not a selected objective "
            f"(selected: {', '.join(pretrain)})"
        )
    default = entries.get("*", Constant())
    result = {name: entries.get(name, default) for name in pretrain}
    if any(isinstance(s, Adaptive) for s in result.values()) and len(set(result.values())) > 1:
        raise InvalidParameterError(
            "an adaptive schedule sets every objective's weight: give it alone, e.g. --schedule adaptive or "
            "--schedule adaptive:tartan")
    return result


def adaptive_rule(schedules: Mapping[str, Schedule]) -> str | None:
    """The adaptive rule the schedules name (None: they are functions of the step)."""
    first = next(iter(schedules.values()), None)
    return first.rule if isinstance(first, Adaptive) else None


def weights_at(step: int, steps: int, weights: Mapping[str, float], schedules: Mapping[str, Schedule]) -> dict[str, float]:
    """``α_k(step) = w_k · m_k(step)`` for every objective.

    Raises:
        InvalidParameterError: a schedule gave a negative or non-finite multiplier.
    """
    result = {}
    for name, base in weights.items():
        value = schedules[name](step, steps)
        try:
            multiplier = float(value)
        except (TypeError, ValueError):
            multiplier = math.nan
        if isinstance(value, bool) or not math.isfinite(multiplier) or multiplier < 0:
            raise InvalidParameterError(
                f"schedule {schedules[name].spec} of {name!r} gave {value!r} at step {step}: "
                f"a weight multiplier must be finite and ≥ 0"
            )
        result[name] = base * multiplier
    return result
