"""Adaptive objective weights: after every probe, a rule reads the probe record and sets the
weights of the steps that follow.

A rule is a plain object: ``rule.weights`` are the weights to use now, ``rule.update(record)``
takes a finished probe record (the analyzer's, or any with the same fields) and returns the new
weights. Both rules keep the total weight ``Σ_k α_k`` at the start's (they choose the mixture, not
the learning rate) and every weight inside ``[min_weight, max_weight]``; both smooth what they
read over probes with an exponential moving average (``smoothing`` the share kept of the past,
0: the latest probe alone).

* :class:`QuadraticRule`: the weights that maximise the predicted improvement of the next step
  under the smoothed quadratic model (:mod:`objreg.analysis.math.mixture`), each weight moving at most
  ``radius × total`` per probe (the model is local).
* :class:`TartanRule`: a META-TARTAN-style multiplicative update (Dery et al., ICLR 2022, where
  the weights follow the meta-gradient of the downstream loss, to first order each objective's
  transfer ``η c_k``): ``α_k ← α_k exp(rate · a_k / max_j |a_j|)`` with ``a_k`` the smoothed
  first-order improvement per unit weight, then rescaled to the total and clipped to the bounds.
  Normalising by the largest ``|a_j|`` does what META-TARTAN's Adam meta-optimizer does to the
  meta-gradient's scale: ``rate`` is the largest change of a log-weight per probe.

Their state (:meth:`state_dict`) goes into the run's checkpoint, so an adaptive run resumes
exactly. :func:`adaptive_summary` says after the run whether the weights the rule chose beat the
best constant weights of the run's counterfactual (both local estimates, docs/analysis.md) and
whether the weights oscillated.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from objreg.analysis.math.stats import standard_error_of
from objreg.analysis.math.trust_region import maximise, trust_box
from objreg.analysis.math.weight_model import Quadratic, step_model
from objreg.analysis.records import StepRecord
from objreg.core.errors import InvalidParameterError


def check_options(names: Sequence[str], weights: Mapping[str, float], *, radius: float, rate: float,
                  smoothing: float, min_weight: float, max_weight: float | None) -> None:
    """Each option in range, and the bounds able to hold the total weight.

    Raises:
        InvalidParameterError: the first bad option, named, with what is allowed.
    """
    def number(value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)

    if not number(radius) or radius <= 0:
        raise InvalidParameterError(f"trust_radius must be a finite number > 0 (a share of the total weight), "
                                    f"got {radius!r}")
    if not number(rate) or rate <= 0:
        raise InvalidParameterError(f"adaptive_rate must be a finite number > 0, got {rate!r}")
    if not number(smoothing) or not 0 <= smoothing < 1:
        raise InvalidParameterError(f"adaptive_smoothing must be in [0, 1), got {smoothing!r}")
    if not number(min_weight) or min_weight < 0:
        raise InvalidParameterError(f"min_weight must be a finite number ≥ 0, got {min_weight!r}")
    if max_weight is not None and (not number(max_weight) or max_weight <= min_weight):
        raise InvalidParameterError(f"max_weight must be a finite number above min_weight ({min_weight:g}), "
                                    f"or None for no upper bound; got {max_weight!r}")
    total, k = sum(weights[n] for n in names), len(names)
    if min_weight * k > total or (max_weight is not None and max_weight * k < total):
        raise InvalidParameterError(
            f"weight bounds [{min_weight:g}, {max_weight if max_weight is not None else 'none'}] cannot hold the "
            f"total weight {total:g} over {k} objectives (need min_weight × {k} ≤ {total:g} ≤ max_weight × {k})")


class Rule:
    """What both rules share: the weights, the bounds and total, and the smoothed model.

    Args:
        weights: The starting weights; their total is kept.
        optimizer: ``sgd``, ``adam`` or ``adamw`` (how a record's step depends on the weights).
        lr: The learning rate (SGD's model needs ``η``).
    """

    name = ""

    def __init__(self, weights: Mapping[str, float], *, optimizer: str, lr: float, smoothing: float = 0.5,
                 min_weight: float = 0.0, max_weight: float | None = None, radius: float = 0.25, rate: float = 0.5):
        self.names = list(weights)
        check_options(self.names, weights, radius=radius, rate=rate, smoothing=smoothing, min_weight=min_weight,
                      max_weight=max_weight)
        self.weights = {n: float(weights[n]) for n in self.names}
        self.total = sum(self.weights.values())
        self.optimizer, self.lr, self.smoothing = optimizer, lr, smoothing
        self.low, self.high = float(min_weight), (float(max_weight) if max_weight is not None else self.total)
        self.radius, self.rate = radius, rate
        self.model: Quadratic | None = None  # the smoothed per-step model
        # The variance of the smoothed model's first-order coefficients from the batches' noise.
        self.noise = np.zeros(len(self.names))
        self.probes = 0

    def update(self, record: StepRecord) -> dict[str, float]:
        """Take a finished probe record; the weights for the steps until the next probe."""
        latest = step_model(record, self.optimizer, self.lr, self.names)
        variance = first_order_noise(record, latest, self.optimizer, self.lr, self.names) ** 2
        if self.model is None:
            self.model, self.noise = latest, variance
        else:
            s = self.smoothing
            self.model = self.model.scaled(s) + latest.scaled(1 - s)
            # The variance of an average of independent measurements: weights squared.
            self.noise = s * s * self.noise + (1 - s) * (1 - s) * variance
        self.probes += 1
        alpha = self._next(np.array([self.weights[n] for n in self.names]))
        self.weights = dict(zip(self.names, map(float, alpha)))
        return dict(self.weights)

    def _next(self, alpha: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def resolved(self) -> np.ndarray:
        """The smoothed first-order coefficients with what their noise cannot resolve shrunk away."""
        return resolved_first(self.model.first, np.sqrt(self.noise))

    def state_dict(self) -> dict[str, Any]:
        return {"weights": dict(self.weights), "probes": self.probes,
                "model": self.model.to_dict() if self.model is not None else None,
                "noise": [float(v) for v in self.noise]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.weights = {n: float(state["weights"][n]) for n in self.names}
        self.probes = int(state["probes"])
        self.model = Quadratic.from_dict(self.names, state["model"]) if state["model"] is not None else None
        self.noise = np.array(state.get("noise", [0.0] * len(self.names)), dtype=np.float64)


class QuadraticRule(Rule):
    """The trust-region optimum of the smoothed quadratic model (module docstring)."""

    name = "quadratic"

    def _next(self, alpha: np.ndarray) -> np.ndarray:
        lower, upper = trust_box(alpha, self.radius, self.low, self.high)
        model = self.model.with_first(self.resolved())
        best = maximise(model, lower, upper, self.total)
        gain = model.improvement(best)["first_plus_second_order"] - model.improvement(alpha)["first_plus_second_order"]
        scale = max(abs(model.improvement(alpha)["first_plus_second_order"]), 1e-300)
        return best if gain > 1e-12 * scale else alpha  # nothing to gain (a flat model): stay


class TartanRule(Rule):
    """The META-TARTAN-style multiplicative update (module docstring)."""

    name = "tartan"

    def _next(self, alpha: np.ndarray) -> np.ndarray:
        gain = -self.resolved()  # the first-order improvement per unit weight, its noise shrunk away
        scale = float(np.abs(self.model.first).max())
        if not np.any(gain - gain.mean()) or scale == 0:
            return alpha  # nothing resolved: keep the weights
        target = alpha * np.exp(self.rate * gain / scale)
        return rescale(target, self.total, self.low, self.high)


def first_order_noise(record: StepRecord, model: Quadratic, optimizer: str, lr: float,
                      names: Sequence[str]) -> np.ndarray:
    """The standard error of each objective's first-order coefficient per unit weight in the
    step model of ``record``, from the noise of its dot over the batch (the record's
    ``alignment.<k>.ci95``; 0 where a record has none). Under SGD the coefficient is ``−η c_k``,
    so its error is ``η`` times the dot's. Under Adam the coefficient is not a multiple of the
    dot; it is given the dot's relative error (an objective whose dot is within its noise of 0
    is unresolved), an approximation."""
    out = np.zeros(len(names))
    for i, name in enumerate(names):
        alignment = record["alignment"][name]
        interval = alignment.get("ci95")
        if not interval:
            continue
        se = standard_error_of(interval)
        if optimizer == "sgd":
            out[i] = lr * se
        else:
            dot = abs(float(alignment["dot"]))
            out[i] = abs(float(model.first[i])) * (se / dot if dot > se * 1e-12 else 1.0)
    return out


def resolved_first(first: np.ndarray, noise: np.ndarray) -> np.ndarray:
    """``first`` with each coefficient's difference from their mean soft-thresholded by its
    standard error ``noise``: ``m + sign(d_k) max(0, |d_k| − σ_k)``. Only differences between
    objectives move weight at a fixed total, so the mean is kept."""
    mean = float(first.mean()) if first.size else 0.0
    d = first - mean
    return mean + np.sign(d) * np.maximum(np.abs(d) - noise, 0.0)


def rescale(target: np.ndarray, total: float, low: float, high: float) -> np.ndarray:
    """``clip(s · target, low, high)`` with the factor ``s`` that makes it add up to ``total``
    (bisection; the sum grows with ``s``)."""
    if target.sum() <= 0:
        target = np.ones_like(target)
    lo, hi = 0.0, 1.0
    while np.clip(hi * target, low, high).sum() < total and hi < 1e300:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if np.clip(mid * target, low, high).sum() < total else (lo, mid)
    alpha = np.clip(hi * target, low, high)
    return alpha * (total / alpha.sum()) if alpha.sum() > 0 else alpha


#: An objective's weights oscillate when they reverse direction at least this many times, and in
#: at least half of their moves.
OSCILLATION_REVERSALS = 2


def reversals(values: Sequence[float]) -> tuple[int, int]:
    """``(moves, reversals)`` of a weight over the steps: how often it changed, and how often a
    change went the other way from the change before it."""
    scale = max((abs(v) for v in values), default=0.0)
    changes = [b - a for a, b in zip(values, values[1:]) if abs(b - a) > 1e-12 * max(scale, 1.0)]
    return len(changes), sum(1 for a, b in zip(changes, changes[1:]) if a * b < 0)


def adaptive_summary(rule: str, names: Sequence[str], weights_by_step: Sequence[Mapping[str, float]],
                     counterfactual: Mapping[str, Any]) -> dict[str, Any]:
    """The report's ``summary.adaptive``: whether the weights the rule chose beat the best
    constant weights of the run's counterfactual (the improvement each is predicted, by the same
    local model: ``counterfactual.used`` against ``counterfactual.best``), and whether the weights
    oscillated (an objective's weight reversed direction at least
    :data:`OSCILLATION_REVERSALS` times and in at least half of its moves), with a warning."""
    moves = {n: reversals([float(w[n]) for w in weights_by_step]) for n in names}
    oscillating = [n for n, (count, back) in moves.items() if back >= OSCILLATION_REVERSALS and 2 * back >= count]
    used = counterfactual["used"]["first_plus_second_order"]
    best = counterfactual.get("best")
    constant = best["first_plus_second_order"] if best else counterfactual["constant_mean_weights"][
        "first_plus_second_order"]
    warning = None
    if oscillating:
        which = ", ".join(f"{n} reversed {moves[n][1]} of {moves[n][0]} moves" for n in oscillating)
        warning = (f"the weights oscillated ({which}): the rule followed noise; raise --adaptive-smoothing or "
                   f"--probe-every, or lower --trust-radius")
    return {
        "rule": rule,
        "predicted_improvement": used,
        "best_constant_predicted_improvement": constant,
        "beat_best_constant": used > constant,
        "moves": {n: count for n, (count, _) in moves.items()},
        "reversals": {n: back for n, (_, back) in moves.items()},
        "oscillating": oscillating,
        "warning": warning,
    }


def make_rule(rule: str, weights: Mapping[str, float], **options: Any) -> Rule:
    """The rule called ``rule`` (``quadratic`` or ``tartan``).

    Raises:
        InvalidParameterError: an unknown rule or a bad option.
    """
    classes = {"quadratic": QuadraticRule, "tartan": TartanRule}
    if rule not in classes:
        raise InvalidParameterError(f"unknown adaptive rule {rule!r}: expected {' or '.join(classes)}")
    return classes[rule](weights, **options)


def adaptive_rule_of(config: Any) -> Rule | None:
    """The rule an :class:`~objreg.analysis.run.config.AnalysisConfig` asks for (None without
    ``--schedule adaptive``), starting from its base weights."""
    from objreg.analysis.run.schedules import adaptive_rule

    rule = adaptive_rule(config.schedule)
    if rule is None:
        return None
    return make_rule(rule, config.weights, optimizer=config.optimizer, lr=config.lr,
                     smoothing=config.adaptive_smoothing, min_weight=config.min_weight,
                     max_weight=config.max_weight, radius=config.trust_radius, rate=config.adaptive_rate)
