"""How well one ranking of candidates predicts another: the figures of experiment ``screen-validity``.

For a signal ``s`` and an outcome ``y`` over the same candidates (higher is better for both):

- :func:`pairwise_accuracy`: the share of candidate pairs whose outcomes differ that the signal
  orders as the outcome does, a tie of the signal counting one half (DataDecide's decision
  accuracy, Magnusson et al. 2025).
- :func:`spearman`: Pearson's correlation of the average ranks; 0 where either side is constant.
- :func:`regret_at_k`: the best outcome less the best outcome among the signal's top ``k``
  (Poth et al. 2021); 0 when the top ``k`` hold the best candidate. The signal's ties are broken
  by candidate order (the first listed counts as ranked higher).
- :func:`partial_spearman`: the Spearman correlation of ``s`` and ``y`` given ``z`` (the gradient
  norm): ``(r_sy − r_sz r_yz) / √((1 − r_sz²)(1 − r_yz²))`` on the ranks, 0 where undefined; a
  signal that only tracks ``z`` reads near 0.
- :func:`cronbach_alpha`: the reliability of the candidates' outcome over seeds (seeds as raters,
  candidates as subjects): ``1 − MS_residual / MS_candidates`` of the two-way table.
- :func:`bootstrap`: a figure's mean over seeds with a percentile interval from resampling
  candidates and seeds together (each replicate draws seeds and candidates with replacement, the
  same candidates in every seed drawn), from an explicit generator.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch
from scipy import stats


def pairwise_accuracy(signal: Sequence[float], outcome: Sequence[float]) -> float:
    """Module docstring; NaN where every outcome is equal (no pair to decide)."""
    s, y = np.asarray(signal, dtype=np.float64), np.asarray(outcome, dtype=np.float64)
    if s.shape != y.shape or s.ndim != 1:
        raise ValueError(f"signal and outcome must be 1-D and of one length, got {s.shape} and {y.shape}")
    ds = np.sign(s[:, None] - s[None, :])
    dy = np.sign(y[:, None] - y[None, :])
    decided = np.triu(dy != 0, k=1)
    if not decided.any():
        return math.nan
    credit = np.where(ds == dy, 1.0, np.where(ds == 0, 0.5, 0.0))
    return float(credit[decided].mean())


def ranks(values: Sequence[float]) -> np.ndarray:
    """Average ranks, 1 for the smallest (ties share the mean of their positions)."""
    return stats.rankdata(np.asarray(values, dtype=np.float64), method="average")


def _pearson(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a - a.mean(), b - b.mean()
    scale = math.sqrt(float((a * a).sum() * (b * b).sum()))
    return float((a * b).sum()) / scale if scale > 0 else 0.0


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Module docstring."""
    return _pearson(ranks(a), ranks(b))


def regret_at_k(signal: Sequence[float], outcome: Sequence[float], k: int) -> float:
    """Module docstring."""
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    y = np.asarray(outcome, dtype=np.float64)
    top = np.argsort(-np.asarray(signal, dtype=np.float64), kind="stable")[:k]
    return float(y.max() - y[top].max())


def partial_spearman(signal: Sequence[float], outcome: Sequence[float], given: Sequence[float]) -> float:
    """Module docstring."""
    r_sy, r_sz, r_yz = spearman(signal, outcome), spearman(signal, given), spearman(outcome, given)
    scale = (1 - r_sz ** 2) * (1 - r_yz ** 2)
    return (r_sy - r_sz * r_yz) / math.sqrt(scale) if scale > 1e-12 else 0.0


def cronbach_alpha(table: np.ndarray) -> float | None:
    """Reliability of a subjects × raters table (module docstring); None under two raters or
    subjects, or where the subjects' means are all equal."""
    x = np.asarray(table, dtype=np.float64)
    n, k = x.shape
    if n < 2 or k < 2:
        return None
    grand = x.mean()
    ms_subjects = k * ((x.mean(axis=1) - grand) ** 2).sum() / (n - 1)
    residual = x - x.mean(axis=1, keepdims=True) - x.mean(axis=0, keepdims=True) + grand
    ms_residual = (residual ** 2).sum() / ((n - 1) * (k - 1))
    return None if ms_subjects == 0 else float(1 - ms_residual / ms_subjects)


#: A figure of one seed: ``(signal, outcome, gradient norm) → value`` over the same candidates.
Figure = Callable[[np.ndarray, np.ndarray, np.ndarray], float]

FIGURES: dict[str, Figure] = {
    "pairwise_accuracy": lambda s, y, z: pairwise_accuracy(s, y),
    "spearman": lambda s, y, z: spearman(s, y),
    "regret_at_1": lambda s, y, z: regret_at_k(s, y, 1),
    "regret_at_3": lambda s, y, z: regret_at_k(s, y, 3),
    "partial_given_grad_norm": lambda s, y, z: partial_spearman(s, y, z),
}


def seed_mean(figure: Figure, signal: np.ndarray, outcome: np.ndarray, given: np.ndarray) -> float:
    """``figure`` of each seed's row (seeds × candidates arrays), averaged over the seeds (NaN rows left out)."""
    values = [figure(s, y, z) for s, y, z in zip(signal, outcome, given)]
    values = [v for v in values if not math.isnan(v)]
    return float(np.mean(values)) if values else math.nan


def bootstrap(figure: Figure, signal: np.ndarray, outcome: np.ndarray, given: np.ndarray,
              generator: torch.Generator, replicates: int = 2000) -> dict[str, float]:
    """``figure``'s seed mean with a 95% percentile interval over ``replicates`` resamplings of
    candidates and seeds (module docstring)."""
    signal, outcome, given = (np.asarray(a, dtype=np.float64) for a in (signal, outcome, given))
    seeds, candidates = signal.shape
    found = []
    for _ in range(replicates):
        rows = torch.randint(seeds, (seeds,), generator=generator).numpy()
        columns = torch.randint(candidates, (candidates,), generator=generator).numpy()
        pick = np.ix_(rows, columns)
        found.append(seed_mean(figure, signal[pick], outcome[pick], given[pick]))
    found = np.asarray([v for v in found if not math.isnan(v)])
    low, high = (np.percentile(found, [2.5, 97.5]) if found.size else (math.nan, math.nan))
    return {"mean": seed_mean(figure, signal, outcome, given), "low": float(low), "high": float(high)}
