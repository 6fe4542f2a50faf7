"""Statistics: the mean with a Student-t and a seeded bootstrap confidence interval, the conflict
fraction of per-sample alignment, and the correlation of predicted with actual changes."""

from __future__ import annotations

import math
import warnings
import zlib
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


BOOTSTRAP_RESAMPLES = 2000


def seed_for(*parts: int | str) -> list[int]:
    """A numpy seed sequence from ints and names (names through CRC-32, stable across runs)."""
    return [zlib.crc32(p.encode()) if isinstance(p, str) else int(p) & 0xFFFFFFFF for p in parts]


def bootstrap_ci95(values: Sequence[float] | np.ndarray, seed: Sequence[int] | int = 0,
                   resamples: int = BOOTSTRAP_RESAMPLES) -> tuple[float, float]:
    """The 95% percentile-bootstrap interval of the mean: resample the values with replacement
    ``resamples`` times (seeded: same seed, same interval) and take the 2.5% and 97.5% quantiles
    of the resampled means. Degenerate (the value itself) for fewer than two values."""
    x = np.asarray(values, dtype=np.float64)
    if x.size < 2:
        mean = float(x.mean()) if x.size else 0.0
        return mean, mean
    rng = np.random.default_rng(seed)
    return percentile_interval(x[rng.integers(0, x.size, size=(resamples, x.size))].mean(axis=1))


def percentile_interval(replicates: Sequence[float] | np.ndarray) -> tuple[float, float]:
    """The central 95% of bootstrap replicates: their 2.5% and 97.5% quantiles."""
    low, high = np.quantile(np.asarray(replicates, dtype=np.float64), [0.025, 0.975])
    return float(low), float(high)


def correlation(predicted: Sequence[float], actual: Sequence[float]) -> dict[str, float | None]:
    """Pearson's r and Spearman's ρ of predicted against actual values (None where undefined:
    fewer than three pairs, or a constant series)."""
    x, y = np.asarray(predicted, dtype=np.float64), np.asarray(actual, dtype=np.float64)
    if x.size < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return {"pearson": None, "spearman": None}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pearson = float(stats.pearsonr(x, y)[0])
        spearman = float(stats.spearmanr(x, y)[0])
    return {"pearson": pearson if math.isfinite(pearson) else None,
            "spearman": spearman if math.isfinite(spearman) else None}


def alignment_stats(dots: np.ndarray, grad_norm: float, downstream_norm: float,
                    seed: Sequence[int] | int = 0) -> dict[str, object]:
    """Summary of per-sample dots ``⟨∇ℓ_i, ∇D⟩`` for one objective at one probe.

    ``dot`` is their mean, which equals ``⟨∇L, ∇D⟩`` for ``L = mean_i ℓ_i``, with a Student-t
    (``ci95``) and a bootstrap (``ci95_bootstrap``) interval over examples; ``cosine`` divides it
    by both gradient norms (``cosine_ci95`` divides the t interval the same way);
    ``conflict_fraction`` is the share of examples whose gradient points away from the downstream
    gradient.
    """
    mean, low, high = mean_ci95(dots)
    denominator = grad_norm * downstream_norm
    scale = 1.0 / denominator if denominator > 0 else 0.0
    return {
        "dot": mean,
        "cosine": mean * scale,
        "ci95": [low, high],
        "ci95_bootstrap": list(bootstrap_ci95(dots, seed)),
        "cosine_ci95": [low * scale, high * scale],
        "conflict_fraction": float(np.mean(np.asarray(dots) < 0)),
        "grad_norm": grad_norm,
    }
