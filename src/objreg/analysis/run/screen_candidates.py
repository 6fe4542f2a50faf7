"""The screen's candidates and budget: ``mlm``, ``mlm:mask_prob=0.4`` or ``mlm+sop`` parsed and
checked against each plugin's own parameter schema before any work (:func:`parse_candidates`),
and a budget of steps or seconds per candidate (:func:`parse_budget`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from objreg.core.errors import InvalidParameterError
from objreg.core.registry import Registry

#: Steps per candidate when no budget is given (docs/performance.md gives what it costs).
DEFAULT_BUDGET = 8
#: The most steps a budget may give, and a time budget may run (it stops at its time first unless
#: steps are very cheap).
MAX_STEPS = 10_000
#: The longest time budget per candidate: a day.
MAX_SECONDS = 86_400


@dataclass(frozen=True)
class Candidate:
    """One candidate: its ``label`` as given, its objectives with their parameters (as strings,
    validated by the plugins), and their weights (equal, summing to 1)."""

    label: str
    objectives: tuple[str, ...]
    params: Mapping[str, Mapping[str, str]]

    @property
    def weights(self) -> dict[str, float]:
        return dict.fromkeys(self.objectives, 1.0 / len(self.objectives))


@dataclass(frozen=True)
class Budget:
    """Steps per candidate, or seconds per candidate (then steps run until the time is spent)."""

    steps: int | None = None
    seconds: float | None = None

    def __str__(self) -> str:
        return f"{self.steps} steps" if self.steps is not None else f"{self.seconds:g}s"


def parse_budget(budget: int | str | Budget) -> Budget:
    """``12`` or ``"12"``: steps; ``"90s"``: seconds per candidate.

    Raises:
        InvalidParameterError: anything else, or a budget that is not positive.
    """
    if isinstance(budget, Budget):
        return budget
    if isinstance(budget, bool):
        raise InvalidParameterError(f"budget must be a number of steps or seconds like 90s, got {budget!r}")
    if isinstance(budget, int):
        if budget < 2:
            raise InvalidParameterError(f"budget must be at least 2 steps (an interval needs two probes), got {budget}")
        if budget > MAX_STEPS:
            raise InvalidParameterError(f"budget must be at most {MAX_STEPS} steps per candidate (a screen is a short "
                                        f"run; analyze trains longer), got {budget}")
        return Budget(steps=budget)
    text = str(budget).strip()
    try:
        if text.endswith("s"):
            seconds = float(text[:-1])
            if not math.isfinite(seconds) or seconds <= 0:
                raise ValueError
            if seconds > MAX_SECONDS:
                raise InvalidParameterError(f"budget must be at most {MAX_SECONDS}s per candidate (a screen is a short "
                                            f"run; analyze trains longer), got {budget!r}")
            return Budget(seconds=seconds)
        return parse_budget(int(text))
    except InvalidParameterError:  # a ValueError too, but already the message to give
        raise
    except ValueError:
        raise InvalidParameterError(
            f"budget must be a number of steps (at least 2, e.g. 12) or of seconds per candidate (e.g. 90s), "
            f"got {budget!r}") from None


def parse_candidates(candidates: str | Sequence[str], registry: Registry) -> list[Candidate]:
    """Candidates from ``"mlm,mlm:mask_prob=0.4,mlm+sop"`` (or a list of such entries), each
    objective and parameter checked against its plugin.

    Grammar: candidates separated by ``,``; a mixture's objectives by ``+``; an objective's
    parameters follow it after ``:``, each ``NAME=VALUE``, several separated by ``:``.

    Raises:
        InvalidParameterError: no candidate, a malformed entry, an unknown objective or parameter,
            a bad parameter value, an objective repeated within a mixture, or a candidate repeated.
    """
    if isinstance(candidates, str):
        entries = candidates.split(",")
    elif isinstance(candidates, Sequence):
        entries = list(candidates)
        wrong = [e for e in entries if not isinstance(e, str)]
        if wrong:
            wrong = wrong[0]
            raise InvalidParameterError(f"every candidate must be a string like 'mlm', 'mlm:mask_prob=0.4' or "
                                        f"'mlm+sop'; got {wrong!r} ({type(wrong).__name__})")
    else:
        raise InvalidParameterError(f"candidates must be a comma-separated string or a list of strings, got "
                                    f"{type(candidates).__name__}")
    entries = [e.strip() for e in entries if e.strip()]
    if not entries:
        raise InvalidParameterError("no candidate given: name at least one, e.g. --candidates mlm,clm,sop")
    parsed: list[Candidate] = []
    seen: dict[frozenset, str] = {}  # what each candidate trains on, after its plugins' parsing → its label
    for entry in entries:
        objectives: list[str] = []
        params: dict[str, dict[str, str]] = {}
        resolved: dict[str, str] = {}
        for part in entry.split("+"):
            name, *assignments = [p.strip() for p in part.split(":")]
            if not name:
                raise InvalidParameterError(f"malformed candidate {entry!r}: expected OBJECTIVE[:PARAM=VALUE...]"
                                            f"[+OBJECTIVE...], e.g. mlm:mask_prob=0.4 or mlm+sop")
            if name in objectives:
                raise InvalidParameterError(f"candidate {entry!r} names {name!r} twice")
            given: dict[str, str] = {}
            for assignment in assignments:
                key, sep, value = assignment.partition("=")
                if not sep or not key.strip() or not value.strip():
                    raise InvalidParameterError(f"malformed parameter {assignment!r} in candidate {entry!r}: "
                                                f"expected NAME=VALUE, e.g. mlm:mask_prob=0.4")
                if key.strip() in given:
                    raise InvalidParameterError(f"candidate {entry!r} gives {name}'s parameter {key.strip()!r} twice")
                given[key.strip()] = value.strip()
            # Unknown names, unknown parameters and bad values, in the plugin's words; its parsed
            # parameters (defaults filled in) tell two spellings of one candidate apart.
            resolved[name] = repr(sorted(registry.get(name, **given).params.items()))
            objectives.append(name)
            if given:
                params[name] = given
        label = "+".join(o + "".join(f":{k}={v}" for k, v in params.get(o, {}).items()) for o in objectives)
        if any(c.label == label for c in parsed):
            raise InvalidParameterError(f"candidate {label!r} is given twice")
        same = frozenset(resolved.items())  # a mixture's order and a parameter's spelling aside
        if same in seen:
            raise InvalidParameterError(f"candidates {seen[same]!r} and {label!r} are the same objective(s) with the "
                                        f"same parameters (defaults included): screen each once")
        seen[same] = label
        parsed.append(Candidate(label, tuple(objectives), params))
    return parsed
