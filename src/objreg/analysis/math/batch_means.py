"""The mean of an autocorrelated series with a batch-means interval.

A screen's per-step scores are a trajectory: neighbouring steps share the model and the optimizer's
state, so they are correlated and a t interval over the steps is too narrow. Batch means splits the
series into ``b`` consecutive batches of equal length; when a batch is long beside the series'
correlation time its mean is nearly independent of the next one's, and the t interval over the
``b`` batch means (``b − 1`` degrees of freedom) covers the series' mean. ``b = √n`` rounded (at least 2) lets both
the batches and their number grow with ``n`` (Flegal and Jones 2010, Ann. Statist. 38(2)).
The first ``n mod b`` values are left out of the interval's spread (not of the mean): a batch of
unequal length would have a different variance.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypedDict

import numpy as np
from scipy import stats


class BatchMeansInterval(TypedDict):
    """``mean`` of every value; ``low``/``high`` the 95% interval; ``batches`` its batch count
    (0: too few values for an interval, which is then the mean itself); ``batch_size``."""

    mean: float
    low: float
    high: float
    batches: int
    batch_size: int


def batch_count(n: int) -> int:
    """``√n`` rounded, at least 2; 0 below 2 values."""
    return 0 if n < 2 else max(2, round(math.sqrt(n)))


def batch_means_ci95(values: Sequence[float] | np.ndarray) -> BatchMeansInterval:
    """The series' mean and its 95% batch-means interval (module docstring)."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        nan = float("nan")
        return {"mean": nan, "low": nan, "high": nan, "batches": 0, "batch_size": 0}
    mean = float(x.mean())
    b = batch_count(x.size)
    if b == 0 or not np.isfinite(x).all():
        value = mean if np.isfinite(x).all() else float("nan")
        return {"mean": value, "low": value, "high": value, "batches": 0, "batch_size": int(x.size)}
    size = x.size // b
    means = x[x.size - b * size:].reshape(b, size).mean(axis=1)
    half = float(stats.t.ppf(0.975, b - 1)) * float(means.std(ddof=1)) / math.sqrt(b)
    return {"mean": mean, "low": mean - half, "high": mean + half, "batches": b, "batch_size": size}
