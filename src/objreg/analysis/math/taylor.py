"""The Taylor terms of one step: the second-order interaction matrix and the predicted change.

For an update ``Δθ = Σ_c d_c`` split into parts (one per objective, plus the optimizer's own parts),
the downstream change is predicted to second order as

    D(θ + Δθ) − D(θ) ≈ ∇D·Δθ + ½ Δθᵀ H_D Δθ = Σ_c ∇D·d_c + ½ Σ_{a,b} d_aᵀ H_D d_b

so the first-order term splits by part and the second-order term by pair of parts. The pair
``a,b`` gets ``½ d_aᵀ H d_a`` on the diagonal and ``d_aᵀ H d_b`` (both cross terms) off it, so the
pairs add up to the whole second-order term. With SGD, ``d_k = −η α_k g_k`` and the pairs are
``η² α_a α_b S_ab`` (halved on the diagonal) with ``S_ab = g_aᵀ H_D g_b``.

How good the prediction is (:func:`taylor_errors`): the absolute errors of the first-order and
of the first+second-order prediction, the same relative to the first-order term's magnitude
(the scale of the change, which does not vanish when the actual change happens to be small),
and whether the step is inside the *Taylor regime*, where the remainder shrinks with each order:
the first+second-order error is at most :data:`REMAINDER_RATIO` of the first-order error (the
second-order term accounts for most of what first order misses), or both errors are negligible
(at most :data:`NEGLIGIBLE` of the first-order term, or within the rounding floor). With
``Δθ ∝ η`` the first-order error is ``O(η²)`` and the first+second-order one ``O(η³)``: halving
``η`` cuts the absolute errors about 4× and 8×, and, relative to the first-order term (``O(η)``),
about 2× and 4×. The ratio ``|second| / |first|`` is reported but not part of the rule: the
first-order term vanishes wherever ``∇D`` happens to be nearly orthogonal to the step, however
small the step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from objreg.analysis.math.functional import Params, flat_dot


def pair_key(a: str, b: str) -> str:
    """How a pair is named in the report: ``"mlm,sop"``."""
    return f"{a},{b}"


def gram(left: Sequence[Params], right: Sequence[Params]) -> np.ndarray:
    """``M[i, j] = ⟨left_i, right_j⟩`` in float64 (e.g. ``left`` gradients, ``right`` their HVPs)."""
    return np.array([[float(flat_dot(a, b)) for b in right] for a in left], dtype=np.float64).reshape(
        len(left), len(right)
    )


def upper_pairs(names: Sequence[str], matrix: np.ndarray) -> dict[str, float]:
    """The symmetrised matrix as ``{"a,b": (M_ab + M_ba)/2}`` for ``a`` at or before ``b``."""
    return {
        pair_key(a, b): float((matrix[i, j] + matrix[j, i]) / 2)
        for i, a in enumerate(names) for j, b in enumerate(names) if i <= j
    }


def asymmetry(matrix: np.ndarray) -> float:
    """``max |M − Mᵀ| / max |M|``: zero for an exact Hessian; its size shows the rounding error."""
    scale = float(np.abs(matrix).max()) if matrix.size else 0.0
    return float(np.abs(matrix - matrix.T).max()) / scale if scale > 0 else 0.0


def quadratic_by_pair(names: Sequence[str], matrix: np.ndarray) -> dict[str, float]:
    """``½ Σ_{a,b} M_ab`` split over unordered pairs (``½ M_aa``, and ``(M_ab + M_ba)/2`` off the
    diagonal); the values add up to the quadratic form."""
    return {
        key: value / 2 if i == j else value
        for (i, j), (key, value) in zip(
            [(i, j) for i in range(len(names)) for j in range(len(names)) if i <= j],
            upper_pairs(names, matrix).items(),
        )
    }


def relative_error(predicted: float, actual: float) -> float | None:
    """``|predicted − actual| / |actual|`` (None when nothing changed)."""
    return abs(predicted - actual) / abs(actual) if actual != 0 else None


#: An error at most this share of the first-order term counts as negligible.
NEGLIGIBLE = 0.01
#: Inside the regime the first+second-order error is at most this share of the first-order error.
REMAINDER_RATIO = 0.5

REGIME_RULE = (
    f"a step is inside the Taylor regime when the first+second-order error is at most {REMAINDER_RATIO:g} of the "
    f"first-order error, or both are negligible (the first+second-order error at most {NEGLIGIBLE:g} of the "
    "first-order term, or the first-order error within the rounding floor); a run is inside when every probed step "
    "is and the same holds for its summed prediction"
)


def inside_regime(error1: float, error2: float, scale: float, floor: float) -> bool:
    """The rule of :data:`REGIME_RULE` for one prediction (``scale``: ``|first-order term|``)."""
    return error2 <= REMAINDER_RATIO * error1 or error2 <= NEGLIGIBLE * scale or error1 <= floor


def rounding_floor(downstream_before: float, downstream_after: float, evaluation_roundoff: float,
                   grad_norm: float, step_norm: float, model_roundoff: float, resolution: float = 0.0) -> float:
    """How far rounding alone can move the comparison of one step: the resolution of each of the
    two evaluations of ``D``, ``max(u_D |D|, ρ_D)`` (``u_D`` the unit roundoff of the dtype ``D`` is
    evaluated in; ``ρ_D`` the resolution measured for this model, which exceeds ``u_D |D|`` where
    the model computes parts of ``D`` in a lower precision whatever its dtype:
    :mod:`objreg.analysis.math.resolution`), plus the rounding of the first-order term formed in
    the model's dtype, ``u · ‖∇D‖ ‖Δθ‖``. An estimate, not a bound: errors near it are rounding."""
    return (max(evaluation_roundoff * abs(downstream_before), resolution)
            + max(evaluation_roundoff * abs(downstream_after), resolution) + model_roundoff * grad_norm * step_norm)


def taylor_errors(first: float, second: float, actual: float, floor: float,
                  resolution: float | None = None) -> dict[str, Any]:
    """The errors of one step's prediction and its Taylor-regime diagnostic (module docstring);
    ``resolution``: ``D``'s measured resolution, recorded beside the floor it enters."""
    error1, error2 = abs(first - actual), abs(first + second - actual)
    scale = abs(first)
    return {
        "error": {"first_order": error1, "first_plus_second_order": error2},
        "scaled_error": {"first_order": error1 / scale if scale > 0 else None,
                         "first_plus_second_order": error2 / scale if scale > 0 else None},
        "rounding_floor": floor,
        **({"downstream_resolution": resolution} if resolution is not None else {}),
        "second_to_first": abs(second) / scale if scale > 0 else None,
        "second_order_helps": error2 < error1,
        "remainder_ratio": error2 / error1 if error1 > 0 else None,
        "inside_regime": inside_regime(error1, error2, scale, floor),
    }


def weighted_sum(parts: Mapping[str, Params], like: Params) -> Params:
    """``Σ_c parts[c]`` (zeros shaped like ``like`` when there are no parts)."""
    total = {n: t.new_zeros(t.shape) for n, t in like.items()}
    for part in parts.values():
        for n in total:
            total[n] = total[n] + part[n]
    return total
