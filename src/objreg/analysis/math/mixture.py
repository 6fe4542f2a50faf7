"""The run's counterfactual in the objective weights (:func:`counterfactual`): the summed
quadratic model of its probed steps (:mod:`objreg.analysis.math.weight_model`), its optimum in
a trust region (:mod:`objreg.analysis.math.trust_region`), and the scope of the figure.

A run's counterfactual for a constant ``α`` sums its probed steps' models, each at the recorded
parameters ``θ_t``: other weights would also have moved the trajectory, which the sum ignores.
That error grows with the number of steps (measured against re-runs by
``python -m benchmarks.counterfactual``, docs/analysis.md), so the run's figure is a local
estimate: the report says so, with the measured error, and its trust region shrinks with the
number of probed steps (:func:`~objreg.analysis.math.trust_region.horizon_radius`).

The measured error is package data (``objreg/data/counterfactual-gain-error.json``, written from
the benchmark's output), never a figure in this code.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any

import numpy as np

from objreg.analysis.math.trust_region import HORIZON_RULE, TRUST_RULE, horizon_radius, maximise, trust_box
from objreg.analysis.math.weight_model import run_model, step_model, used_improvement
from objreg.analysis.records import StepRecord
from objreg.core.errors import InvalidParameterError

#: The package data file of the benchmark's measured gain error.
GAIN_ERROR = "counterfactual-gain-error.json"


@functools.cache
def measured_gain_error() -> dict[str, dict[str, Any]]:
    """By optimizer kind (``sgd``, ``adam``): the median and largest error of predicted gains of
    other constant weights against re-running the steps with them, relative to the realised gain,
    by horizon (probed steps; ``by_horizon``: ``{steps: (median, largest)}``), and the setting it
    was measured in (``setting``: the report names it, the figure is the benchmark's, not the run's)."""
    data = json.loads((resources.files("objreg") / "data" / GAIN_ERROR).read_text(encoding="utf-8"))
    return {kind: {"setting": entry["setting"],
                   "by_horizon": {int(h): (v["median"], v["largest"]) for h, v in entry["by_horizon"].items()}}
            for kind, entry in data["by_optimizer"].items()}


def local_estimate(optimizer: str, probes: int) -> dict[str, Any]:
    """What the run-level figure is, and the error the benchmark measured for such figures at
    the nearest horizon, with its setting (not this run's error)."""
    kind = "sgd" if optimizer == "sgd" else "adam"
    measured = measured_gain_error()[kind]
    table, setting = measured["by_horizon"], measured["setting"]
    horizon = min((h for h in table if h >= probes), default=max(table))
    median, largest = table[horizon]
    beyond = probes > max(table)
    return {
        "kind": "local estimate: the sum of each probed step's one-step prediction at its recorded parameters",
        "probed_steps": probes,
        "measured_horizon": horizon,
        "measured_gain_error": {"median": median, "largest": largest},
        "measured_in": setting,
        "note": (f"not measured on this run; in the benchmark ({setting}) such estimates over "
                 f"{horizon} probed steps were off by {median:.0%} (median) and {largest:.0%} (largest) of the gain "
                 f"re-running the steps with the other weights realised"
                 + (f"; this run's {probes} probed steps are beyond the longest horizon measured, where the "
                    f"error is larger" if beyond else "")),
    }


def counterfactual(records: Sequence[StepRecord], names: Sequence[str], optimizer: str, lr: float, *,
                   radius: float, low: float = 0.0, high: float | None = None, horizon: bool = True) -> dict[str, Any]:
    """The report's ``summary.counterfactual``: the run's quadratic model in the weights, the
    improvement it predicts with the weights used, and the best constant weights in the trust
    region around their mean, with what the model predicts for them. ``horizon``: shrink the
    trust radius with the number of probed steps (:func:`horizon_radius`)."""
    model = run_model(records, optimizer, lr, names)
    center = np.mean([[r["weights"][n] for n in names] for r in records], axis=0)
    given = radius
    if horizon:
        radius = horizon_radius(radius, len(records))
    lower, upper = trust_box(center, radius, low, high)
    exact_adam = optimizer != "sgd" and all("counterfactual" in r for r in records)
    result: dict[str, Any] = {
        "optimizer_model": ("sgd: exact second-order model of each step, Δθ(α) = −η Σ_k α_k g_k"
                            if optimizer == "sgd" else
                            f"{optimizer}: each step's exact one-step counterfactual (G(α) through the optimizer's "
                            f"previous moments), to second order at the stencil's weights and to first order on the "
                            f"grid, a quadratic fitted through them in between" if exact_adam else
                            f"{optimizer}: approximate, each objective's part of the step scaled by its weight "
                            f"ratio with the preconditioner held fixed"),
        "trajectory": "each probed step at its recorded parameters (other weights would also move the trajectory)",
        "scope": local_estimate(optimizer, len(records)),
        "mean_weights": dict(zip(names, map(float, center))),
        "total_weight": float(center.sum()),
        "used": used_improvement(records, optimizer, lr, names),
        "constant_mean_weights": model.improvement(center),
        "trust_region": {"radius": radius, "given_radius": given, "low": low, "high": high,
                         "rule": TRUST_RULE + (HORIZON_RULE if horizon else "")},
        "model": model.to_dict(),
    }
    tolerance = 1e-12 * max(1.0, float(center.sum()))
    inside = [(w, value) for w, value in exact_candidates(records, optimizer, lr, names) or []
              if np.all(w >= lower - tolerance) and np.all(w <= upper + tolerance)]
    if inside:
        best, predicted = max(inside, key=lambda item: item[1]["first_plus_second_order"])
        chosen = "among the weights every probed step evaluated exactly to first order (the grid)"
    else:
        try:
            best = maximise(model, lower, upper, float(center.sum()))
        except InvalidParameterError as e:
            result["best"] = None
            result["best_skipped"] = str(e)
            return result
        predicted = model.improvement(best)
        chosen = "the quadratic model's optimum in the trust region"
    result["best"] = {
        "weights": dict(zip(names, map(float, best))),
        **predicted,
        "gain_over_used": predicted["first_plus_second_order"] - result["used"]["first_plus_second_order"],
        "second_to_first": (abs(predicted["first_plus_second_order"] - predicted["first_order"])
                            / abs(predicted["first_order"]) if predicted["first_order"] else None),
        "chosen": chosen,
    }
    if horizon and len(records) > 1:
        # The last probed step alone: the horizon where the measured error is the Taylor remainder's.
        last = counterfactual(records[-1:], names, optimizer, lr, radius=given, low=low, high=high, horizon=False)
        result["recent"] = {key: last[key] for key in ("scope", "mean_weights", "used", "best")}
    return result


def exact_candidates(records: Sequence[StepRecord], optimizer: str, lr: float,
                     names: Sequence[str]) -> list[tuple[np.ndarray, dict[str, float]]] | None:
    """Under Adam, the constant weight vectors at which every probed step's first-order term
    was evaluated exactly (the weights used, where every step used the same, and the points of
    the grid every record shares), each with its predicted improvement over the run: the exact
    first-order terms summed, plus the second-order term of each step's model (exact at the
    stencil's points, interpolated between them). None where the records share no grid (SGD,
    whose model is exact everywhere; weights that changed between probes)."""
    if optimizer == "sgd" or not records or any("grid" not in r.get("counterfactual", {}) for r in records):
        return None

    def key(weights: Mapping[str, float]) -> tuple[float, ...]:
        return tuple(round(float(weights[n]), 12) for n in names)

    sums: dict[tuple[float, ...], float] | None = None  # each shared weight vector's Σ_t ∇D·Δθ_t(α)
    for record in records:
        here = {key(p["weights"]): p["first_order"] for p in record["counterfactual"]["grid"]}
        here[key(record["weights"])] = record["predicted_delta"]["first_order"]
        sums = dict(here) if sums is None else {k: v + here[k] for k, v in sums.items() if k in here}
    if not sums:
        return None
    models = [step_model(r, optimizer, lr, names) for r in records]
    out = []
    for k, first in sums.items():
        w = np.array(k)
        second = sum(m.improvement(w)["first_plus_second_order"] - m.improvement(w)["first_order"] for m in models)
        out.append((w, {"first_order": -first, "first_plus_second_order": -first + second}))
    return out
