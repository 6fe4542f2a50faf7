"""The downstream change as a quadratic function of the objective weights, its counterfactuals,
and its optimum in a trust region.

A probe record holds, for the step it measured, what the predicted change of ``D`` over that
step would have been with other weights ``α``. Written as a quadratic in ``α``:

    ΔD(α) ≈ f₀ + fᵀα + ½ αᵀ F α  +  s₀ + qᵀα + ½ αᵀ M α        (improvement = −ΔD)

(first-order terms, then second-order terms).

* **SGD** (exact to second order): ``Δθ(α) = −η Σ_k α_k g_k`` is linear in ``α``, so
  ``∇D·Δθ = −η αᵀc`` and ``½ Δθᵀ H_D Δθ = ½ η² αᵀ S α``: ``f = −η c``, ``M = η² S``, nothing else.
* **Adam / AdamW**: the probe evaluates the exact one-step counterfactual (the step Adam would
  have taken from its previous moments with ``G(α)``, :mod:`objreg.analysis.math.counterfactual`)
  at a stencil of weight vectors around the weights used and records its first- and second-order
  terms there (``counterfactual.points``). The model is the quadratic through them on the plane
  of the step's total weight: exact at the recorded points (to the Taylor remainder in ``Δθ``),
  interpolated between them, and constant when every weight changes by the same amount (it reads
  the mixture, not Adam's scale, which Adam normalises away). Records without points (written
  before the points were recorded) fall back to the old approximation: each objective's part
  of the step scaled by its weight ratio, the preconditioner held fixed.

A run's counterfactual for a constant ``α`` sums its probed steps' models, each at the recorded
parameters ``θ_t``: other weights would also have moved the trajectory, which the sum ignores.
That error grows with the number of steps (measured against re-runs by
``python -m benchmarks.counterfactual``, docs/analysis.md), so the run's figure is a local
estimate: the report says so, with the measured error, and its trust region shrinks with the
number of probed steps (:func:`horizon_radius`).

The best weights maximise the predicted improvement (first plus second order) over the trust
region: ``α ≥ 0`` within optional bounds, the total ``Σ_k α_k`` held at the reference's (the
mixture is chosen, not the learning rate), and each weight at most ``radius × total`` from the
reference. That is a small quadratic programme, solved exactly by enumerating which bounds are
active (``3^K`` faces; the best stationary point of any face is the global optimum, also where
the model is indefinite).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from objreg.analysis.math.taylor import pair_key
from objreg.analysis.records import StepRecord
from objreg.core.errors import InvalidParameterError

#: Objectives the exact trust-region solver takes (it visits 3^K faces).
MAX_OBJECTIVES = 8


@dataclass(frozen=True)
class Quadratic:
    """``ΔD(α) = first_constant + firstᵀα + ½ αᵀ first_matrix α + second_constant + crossᵀα +
    ½ αᵀ matrix α``, split into its first-order part (the first three terms) and its second-order
    part (the rest). ``first_matrix`` is 0 under SGD, where the first-order term is linear in ``α``."""

    names: tuple[str, ...]
    first_constant: float
    first: np.ndarray
    second_constant: float
    cross: np.ndarray
    matrix: np.ndarray
    first_matrix: np.ndarray = field(default=None)  # type: ignore[assignment]  # None: zeros

    def __post_init__(self) -> None:
        if self.first_matrix is None:
            object.__setattr__(self, "first_matrix", np.zeros_like(self.matrix))

    @classmethod
    def zero(cls, names: Sequence[str]) -> Quadratic:
        k = len(names)
        return cls(tuple(names), 0.0, np.zeros(k), 0.0, np.zeros(k), np.zeros((k, k)))

    def __add__(self, other: Quadratic) -> Quadratic:
        return Quadratic(self.names, self.first_constant + other.first_constant, self.first + other.first,
                         self.second_constant + other.second_constant, self.cross + other.cross,
                         self.matrix + other.matrix, self.first_matrix + other.first_matrix)

    def scaled(self, factor: float) -> Quadratic:
        return Quadratic(self.names, factor * self.first_constant, factor * self.first,
                         factor * self.second_constant, factor * self.cross, factor * self.matrix,
                         factor * self.first_matrix)

    def with_first(self, first: np.ndarray) -> Quadratic:
        """The same model with other linear first-order coefficients."""
        return Quadratic(self.names, self.first_constant, np.asarray(first, dtype=np.float64), self.second_constant,
                         self.cross, self.matrix, self.first_matrix)

    def vector(self, weights: Mapping[str, float]) -> np.ndarray:
        return np.array([float(weights[n]) for n in self.names], dtype=np.float64)

    def improvement(self, weights: Mapping[str, float] | np.ndarray) -> dict[str, float]:
        """The predicted improvement (``−ΔD``) with ``weights``, to first order and to second order."""
        a = weights if isinstance(weights, np.ndarray) else self.vector(weights)
        first = self.first_constant + float(self.first @ a) + 0.5 * float(a @ self.first_matrix @ a)
        second = self.second_constant + float(self.cross @ a) + 0.5 * float(a @ self.matrix @ a)
        return {"first_order": -first, "first_plus_second_order": -(first + second)}

    def to_dict(self) -> dict[str, Any]:
        """The coefficients by name (the report's ``counterfactual.model``)."""
        return {
            "first_constant": self.first_constant,
            "first": dict(zip(self.names, map(float, self.first))),
            "second_constant": self.second_constant,
            "cross": dict(zip(self.names, map(float, self.cross))),
            "matrix": _pairs(self.names, self.matrix),
            "first_matrix": _pairs(self.names, self.first_matrix),
        }

    @classmethod
    def from_dict(cls, names: Sequence[str], data: Mapping[str, Any]) -> Quadratic:
        def matrix(pairs: Mapping[str, float]) -> np.ndarray:
            return np.array([[pairs[pair_key(*sorted((a, b), key=names.index))] for b in names] for a in names],
                            dtype=np.float64).reshape(len(names), len(names))

        first_matrix = matrix(data["first_matrix"]) if "first_matrix" in data else None  # older checkpoints: none
        return cls(tuple(names), float(data["first_constant"]), np.array([data["first"][n] for n in names], float),
                   float(data["second_constant"]), np.array([data["cross"][n] for n in names], float),
                   matrix(data["matrix"]), first_matrix)


def _pairs(names: Sequence[str], matrix: np.ndarray) -> dict[str, float]:
    return {pair_key(a, b): float(matrix[i, j]) for i, a in enumerate(names) for j, b in enumerate(names) if i <= j}


def _pair(record: StepRecord, table: str, a: str, b: str, order: Sequence[str]) -> float:
    first, second = sorted((a, b), key=list(order).index)
    return float(record[table][pair_key(first, second)])


def step_model(record: StepRecord, optimizer: str, lr: float, names: Sequence[str]) -> Quadratic:
    """The quadratic model of one probed step's change of ``D`` in the weights (module docstring)."""
    k = len(names)
    if optimizer == "sgd":
        c = np.array([record["alignment"][n]["dot"] for n in names], dtype=np.float64)
        s = np.array([[_pair(record, "second_order", a, b, names) for b in names] for a in names])
        return Quadratic(tuple(names), 0.0, -lr * c, 0.0, np.zeros(k), lr * lr * s)
    if "counterfactual" in record:
        return stencil_model(record, names)
    update = record["update"]
    parts = list(update["first_order"])  # the objectives, then weight decay where there is one
    used = record["weights"]
    scaled = [n for n in names if used[n] > 0]
    fixed = [p for p in parts if p not in scaled]
    index = {n: i for i, n in enumerate(names)}

    def pair(a: str, b: str) -> float:  # d_aᵀ H d_b (the record keeps ½ d_aᵀ H d_a on the diagonal)
        value = _pair(update, "second_order", a, b, parts)
        return 2 * value if a == b else value

    first = np.zeros(k)
    cross = np.zeros(k)
    matrix = np.zeros((k, k))
    for a in scaled:
        first[index[a]] = update["first_order"][a] / used[a]
        cross[index[a]] = sum(pair(a, c) for c in fixed) / used[a]
        for b in scaled:
            matrix[index[a], index[b]] = pair(a, b) / (used[a] * used[b])
    first_constant = sum(update["first_order"][c] for c in fixed)
    second_constant = 0.5 * sum(pair(a, b) for a in fixed for b in fixed)
    return Quadratic(tuple(names), first_constant, first, second_constant, cross, matrix)


def stencil_model(record: StepRecord, names: Sequence[str]) -> Quadratic:
    """The quadratic in the weights through a record's exact counterfactual (Adam), on the plane
    of the step's total weight, exactly through the weights used (the record's own prediction)
    and constant along ``(1, …, 1)``: the second-order term through the stencil's points, the
    first-order term by least squares through the grid's and the stencil's (it is rough in the
    weights, so no quadratic passes through all of them; the run's optimum is chosen among the
    points themselves, :func:`counterfactual`)."""
    used = np.array([float(record["weights"][n]) for n in names])
    exact = record["counterfactual"]
    center = record["predicted_delta"]
    first = _fit_on_plane(names, used, center["first_order"],
                          [(p["weights"], p["first_order"]) for p in [*exact.get("grid", []), *exact["points"]]])
    second = _fit_on_plane(names, used, center["second_order"], [(p["weights"], p["second_order"])
                                                                  for p in exact["points"]])
    (f0, f, fm), (s0, q, m) = first, second
    return Quadratic(tuple(names), f0, f, s0, q, m, fm)


def _fit_on_plane(names: Sequence[str], used: np.ndarray, at_used: float,
                  values: Sequence[tuple[Mapping[str, float], float]]) -> tuple[float, np.ndarray, np.ndarray]:
    """``a + gᵀ(α − α_u) + ½ (α − α_u)ᵀ H (α − α_u)`` with ``a`` the value at the weights used and
    ``g``, ``H`` on the plane ``Σ δ = 0`` fitted by least squares to ``values``; returned expanded
    in ``α``: ``(constant, linear, matrix)``."""
    k = len(names)
    basis = _plane_basis(k)  # K × (K−1), orthonormal, orthogonal to (1, …, 1)
    z = np.array([basis.T @ (np.array([w[n] for n in names]) - used) for w, _ in values]).reshape(-1, k - 1)
    features = np.hstack([z, _quadratic_features(z)])
    if len(values):
        coefficients, *_ = np.linalg.lstsq(features, np.array([v for _, v in values]) - at_used, rcond=None)
    else:
        coefficients = np.zeros(features.shape[1])
    gradient = basis @ coefficients[: k - 1]
    hessian = basis @ _symmetric(coefficients[k - 1:], k - 1) @ basis.T
    return float(at_used - gradient @ used + 0.5 * used @ hessian @ used), gradient - hessian @ used, hessian


def _plane_basis(k: int) -> np.ndarray:
    """An orthonormal basis of ``{δ : Σ δ = 0}`` in ``R^k`` (``k × (k−1)``)."""
    if k == 1:
        return np.zeros((1, 0))
    q, _ = np.linalg.qr(np.hstack([np.ones((k, 1)), np.eye(k)[:, : k - 1]]))
    return q[:, 1:]


def _quadratic_features(z: np.ndarray) -> np.ndarray:
    """``½ z_i z_j`` for ``i ≤ j`` (the diagonal) and ``z_i z_j`` off it: the quadratic form's features."""
    n = z.shape[1]
    columns = [0.5 * z[:, i] * z[:, j] if i == j else z[:, i] * z[:, j] for i in range(n) for j in range(i, n)]
    return np.column_stack(columns) if columns else np.zeros((z.shape[0], 0))


def _symmetric(upper: np.ndarray, n: int) -> np.ndarray:
    """The symmetric matrix whose ``i ≤ j`` entries are ``upper`` (in :func:`_quadratic_features`' order)."""
    out = np.zeros((n, n))
    index = 0
    for i in range(n):
        for j in range(i, n):
            out[i, j] = out[j, i] = upper[index]
            index += 1
    return out


def run_model(records: Sequence[StepRecord], optimizer: str, lr: float, names: Sequence[str]) -> Quadratic:
    """The sum of the probed steps' models: the counterfactual of a constant weight vector."""
    total = Quadratic.zero(names)
    for record in records:
        total = total + step_model(record, optimizer, lr, names)
    return total


def used_improvement(records: Sequence[StepRecord], optimizer: str, lr: float,
                     names: Sequence[str]) -> dict[str, float]:
    """The model's predicted improvement with the weights each probed step actually used."""
    totals = {"first_order": 0.0, "first_plus_second_order": 0.0}
    for record in records:
        for key, value in step_model(record, optimizer, lr, names).improvement(record["weights"]).items():
            totals[key] += value
    return totals


def trust_box(center: np.ndarray, radius: float, low: float = 0.0,
              high: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Each weight's interval: within ``radius × Σ center`` of the center, inside ``[low, high]``."""
    step = radius * float(center.sum())
    upper = center + step if high is None else np.minimum(center + step, high)
    return np.maximum(center - step, low), upper


def maximise(model: Quadratic, lower: np.ndarray, upper: np.ndarray, total: float) -> np.ndarray:
    """The ``α`` in ``lower ≤ α ≤ upper``, ``Σ α = total`` with the largest predicted improvement
    (first plus second order): every face of the box (each weight at its lower bound, its upper
    bound, or free) is visited, the improvement's stationary point on the face's part of the
    plane ``Σ α = total`` found, and the best feasible one kept.

    Raises:
        InvalidParameterError: more than :data:`MAX_OBJECTIVES` objectives, or no feasible ``α``.
    """
    k = len(model.names)
    if k > MAX_OBJECTIVES:
        raise InvalidParameterError(f"the trust-region optimum takes at most {MAX_OBJECTIVES} objectives, got {k}")
    if lower.sum() > total + 1e-12 * max(1.0, abs(total)) or upper.sum() < total - 1e-12 * max(1.0, abs(total)):
        raise InvalidParameterError(
            f"no weights within the bounds add up to the total weight {total:g} (bounds allow "
            f"{lower.sum():g} to {upper.sum():g})")
    # Maximise bᵀα − ½ αᵀ M α (the improvement up to a constant).
    b = -(model.first + model.cross)
    m = 0.5 * (model.matrix + model.matrix.T + model.first_matrix + model.first_matrix.T)
    tolerance = 1e-9 * max(1.0, abs(total), float(np.abs(upper).max()))
    best, best_value = None, -math.inf
    for face in itertools.product((0, 1, 2), repeat=k):  # 0: at lower, 1: at upper, 2: free
        fixed_values = np.where(np.array(face) == 0, lower, upper)
        free = [i for i in range(k) if face[i] == 2]
        alpha = np.where(np.array(face) == 2, 0.0, fixed_values)
        rest = total - alpha.sum()
        if not free:
            if abs(rest) > tolerance:
                continue
        else:
            # Stationary on the face: M_ff α_f + λ 1 = b_f − M_fb α_b, Σ α_f = rest.
            n = len(free)
            system = np.zeros((n + 1, n + 1))
            system[:n, :n] = m[np.ix_(free, free)]
            system[:n, n] = 1.0
            system[n, :n] = 1.0
            rhs = np.concatenate([b[free] - m[free] @ alpha, [rest]])
            solution, *_ = np.linalg.lstsq(system, rhs, rcond=None)
            if not np.allclose(system @ solution, rhs, rtol=1e-9, atol=1e-12 * max(1.0, float(np.abs(rhs).max()))):
                continue  # no stationary point on this face (its best lies on a smaller face)
            alpha[free] = solution[:n]
        if np.any(alpha < lower - tolerance) or np.any(alpha > upper + tolerance):
            continue
        alpha = np.clip(alpha, lower, upper)
        value = float(b @ alpha - 0.5 * alpha @ m @ alpha)
        if value > best_value:
            best, best_value = alpha, value
    assert best is not None  # the feasible set is a non-empty polytope: one of its vertices is a face
    return best


#: How the counterfactual's optimum is constrained, in words (the report's ``counterfactual.trust_region``).
TRUST_RULE = ("weights ≥ the lower bound (0 by default) and ≤ the upper bound, their total held at the total of "
              "the mean weights used, and each within radius × that total of its mean weight used")


def horizon_radius(radius: float, probes: int) -> float:
    """The trust radius of a run-level counterfactual over ``probes`` probed steps: ``radius/√n``.
    The summed one-step models miss how other weights would have moved the trajectory, an error
    that grows with the steps; a smaller region keeps the recommended move, and with it that
    error's size, small over a long run (it does not make the error smaller relative to the gain)."""
    return radius / math.sqrt(max(probes, 1))


HORIZON_RULE = ", the radius divided by √(probed steps)"

#: The median and largest error of predicted gains of other constant weights against re-running
#: the steps with them, relative to the realised gain, by horizon (probed steps, every step probed):
#: ``python -m benchmarks.counterfactual`` (the default model in float64; SGD at lr 5e-3, Adam at
#: lr 1e-4; docs/analysis.md has the table).
MEASURED_GAIN_ERROR: dict[str, dict[int, tuple[float, float]]] = {
    "sgd": {1: (0.126, 0.158), 4: (0.559, 1.072), 16: (2.514, 4.288)},
    "adam": {1: (0.040, 0.195), 4: (1.272, 5.941), 16: (1.441, 12.32)},
}


#: The setting :data:`MEASURED_GAIN_ERROR` was measured in, by optimizer (the report names it: the
#: figure is the benchmark's, not the run's).
MEASURED_SETTING = {
    "sgd": "python -m benchmarks.counterfactual: the default model and job in float64, sgd at lr 0.005",
    "adam": "python -m benchmarks.counterfactual: the default model and job in float64, adam at lr 0.0001",
}


def local_estimate(optimizer: str, probes: int) -> dict[str, Any]:
    """What the run-level figure is, and the error the benchmark measured for such figures at
    the nearest horizon, with its setting (not this run's error)."""
    kind = "sgd" if optimizer == "sgd" else "adam"
    table = MEASURED_GAIN_ERROR[kind]
    horizon = min((h for h in table if h >= probes), default=max(table))
    median, largest = table[horizon]
    beyond = probes > max(table)
    return {
        "kind": "local estimate: the sum of each probed step's one-step prediction at its recorded parameters",
        "probed_steps": probes,
        "measured_horizon": horizon,
        "measured_gain_error": {"median": median, "largest": largest},
        "measured_in": MEASURED_SETTING[kind],
        "note": (f"not measured on this run; in the benchmark ({MEASURED_SETTING[kind]}) such estimates over "
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
