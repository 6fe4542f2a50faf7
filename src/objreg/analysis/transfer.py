"""The Taylor terms of one step: the second-order interaction matrix and the predicted change.

For an update ``Δθ = Σ_c d_c`` split into parts (one per objective, plus the optimizer's own parts),
the downstream change is predicted to second order as

    D(θ + Δθ) − D(θ) ≈ ∇D·Δθ + ½ Δθᵀ H_D Δθ = Σ_c ∇D·d_c + ½ Σ_{a,b} d_aᵀ H_D d_b

so the first-order term splits by part and the second-order term by pair of parts. The pair
``a,b`` gets ``½ d_aᵀ H d_a`` on the diagonal and ``d_aᵀ H d_b`` (both cross terms) off it, so the
pairs add up to the whole second-order term. With SGD, ``d_k = −η α_k g_k`` and the pairs are
``η² α_a α_b S_ab`` (halved on the diagonal) with ``S_ab = g_aᵀ H_D g_b``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from objreg.analysis.functional import Params, flat_dot


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


def weighted_sum(parts: Mapping[str, Params], like: Params) -> Params:
    """``Σ_c parts[c]`` (zeros shaped like ``like`` when there are no parts)."""
    total = {n: t.new_zeros(t.shape) for n, t in like.items()}
    for part in parts.values():
        for n in total:
            total[n] = total[n] + part[n]
    return total
