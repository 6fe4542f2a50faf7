"""Statistics of per-sample alignment: mean with a t confidence interval, conflict fraction."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import stats


def mean_ci95(values: Sequence[float] | np.ndarray) -> tuple[float, float, float]:
    """Mean and the 95% Student-t confidence interval of the mean.

    With one value the interval is degenerate (the value itself): there is no spread to estimate.
    """
    x = np.asarray(values, dtype=np.float64)
    mean = float(x.mean())
    if x.size < 2:
        return mean, mean, mean
    sem = float(stats.sem(x))
    if sem == 0.0 or not math.isfinite(sem):
        return mean, mean, mean
    low, high = stats.t.interval(0.95, df=x.size - 1, loc=mean, scale=sem)
    return mean, float(low), float(high)


def alignment_stats(dots: np.ndarray, grad_norm: float, downstream_norm: float) -> dict[str, object]:
    """Summary of per-sample dots ``⟨∇ℓ_i, ∇D⟩`` for one objective at one probe.

    ``dot`` is their mean, which equals ``⟨∇L, ∇D⟩`` for ``L = mean_i ℓ_i``; ``cosine`` divides
    it by both gradient norms; ``conflict_fraction`` is the share of examples whose gradient points
    away from the downstream gradient.
    """
    mean, low, high = mean_ci95(dots)
    denominator = grad_norm * downstream_norm
    return {
        "dot": mean,
        "cosine": mean / denominator if denominator > 0 else 0.0,
        "ci95": [low, high],
        "conflict_fraction": float(np.mean(np.asarray(dots) < 0)),
        "grad_norm": grad_norm,
    }
