"""The best objective weights under a quadratic model of the downstream change
(:mod:`objreg.analysis.math.weight_model`), within a trust region around the weights used.

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

import numpy as np

from objreg.analysis.math.weight_model import Quadratic
from objreg.core.errors import InvalidParameterError

#: Objectives the exact trust-region solver takes (it visits 3^K faces).
MAX_OBJECTIVES = 8


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
