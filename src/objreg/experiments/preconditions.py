"""Preconditions: what must hold for an experiment's data to say anything about its claim (a positive
control, a manipulation check, a model that learned its own task), each checked with a verdict of
its own.

An experiment module lists them in ``PRECONDITIONS`` (a tuple of :class:`Precondition`, declared
with the rule, before the results). Each one reads a number from one seed's figures and settings
and compares it with its threshold: a seed holds it when its value lies on the stated side of the
threshold, and the run holds it when every seed does (a control that failed on one seed leaves
that seed's figures without meaning, and the overall verdict pools every seed). The mean over
seeds and its between-seed interval are reported beside it.

When a precondition does not hold, the verdict is ``inconclusive (precondition failed: …)``,
whatever the claim's own figures say: a refutation or a confirmation read off a design whose
control failed would be about the design, not the claim. The claim's figures are kept and the
reason says what they would have said.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from objreg.analysis.math.stats import mean_ci95
from objreg.experiments.base import INCONCLUSIVE, ExperimentResult


@dataclass(frozen=True)
class Precondition:
    """One precondition of an experiment.

    Args:
        name: A short identifier (``nsp_learned``).
        what: What is measured and why it must hold, in one sentence.
        threshold: The value it must pass.
        direction: ``above`` or ``below``: the side of ``threshold`` on which it holds.
        measure: One seed's ``(figures, setting)`` → the measured value.
    """

    name: str
    what: str
    threshold: float
    direction: str
    measure: Callable[[dict[str, Any], dict[str, Any]], float]

    def __post_init__(self) -> None:
        if self.direction not in ("above", "below"):
            raise ValueError(f"direction must be 'above' or 'below', not {self.direction!r}")

    def value(self, result: ExperimentResult) -> float:
        """The value measured on one seed's result."""
        value = float(self.measure(result.figures, result.setting))
        if not math.isfinite(value):
            raise ValueError(f"precondition {self.name!r} measured a non-finite value {value}")
        return value


def holds(precondition: Precondition, value: float) -> bool:
    """Whether ``value`` lies on the precondition's side of its threshold."""
    return value > precondition.threshold if precondition.direction == "above" else value < precondition.threshold


def check_seed(precondition: Precondition, result: ExperimentResult) -> dict[str, Any]:
    """One seed's check: its measured value against the threshold."""
    value = precondition.value(result)
    passed = holds(precondition, value)
    return {"name": precondition.name, "what": precondition.what, "value": value,
            "threshold": precondition.threshold, "direction": precondition.direction, "passed": bool(passed)}


def check_seeds(precondition: Precondition, values: Sequence[float]) -> dict[str, Any]:
    """The check over seeds: held when every seed's value holds it; the mean of the values with its
    between-seed 95% t-interval is reported."""
    mean, low, high = mean_ci95(values)
    held = [holds(precondition, v) for v in values]
    return {"name": precondition.name, "what": precondition.what, "value": mean,
            "ci95_between_seeds": [low, high], "per_seed": [float(v) for v in values],
            "threshold": precondition.threshold, "direction": precondition.direction,
            "seeds_holding": sum(held), "passed": all(held)}


def describe(check: dict[str, Any]) -> str:
    """``name (what) measured V (per seed: a, b, c), must lie above T``."""
    per_seed = check.get("per_seed", [])
    shown = f"{check['value']:.4g}" + (f" (per seed {', '.join(f'{v:.4g}' for v in per_seed)})"
                                       if len(per_seed) > 1 else "")
    return (f"{check['name']} ({check['what']}) measured {shown}, must lie {check['direction']} "
            f"{check['threshold']:g}" + (" on every seed" if len(per_seed) > 1 else ""))


def apply(result: ExperimentResult, checks: list[dict[str, Any]]) -> None:
    """Record ``checks`` on ``result``; where one failed, make the verdict inconclusive and say why
    (the claim's own verdict and reason are kept after it)."""
    result.preconditions = checks
    failed = [check for check in checks if not check["passed"]]
    if not failed:
        return
    result.reason = (f"precondition failed: {'; '.join(describe(c) for c in failed)}. Without it the claim's figures "
                     f"would read {result.verdict}: {result.reason}")
    result.verdict = INCONCLUSIVE
