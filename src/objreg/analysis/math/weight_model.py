"""The downstream change as a quadratic function of the objective weights (:class:`Quadratic`),
for one probed step (:func:`step_model`) and summed over a run's (:func:`run_model`).

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
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from objreg.analysis.math.taylor import pair_key
from objreg.analysis.records import StepRecord


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
