"""Statistics: the mean with a Student-t and a seeded bootstrap confidence interval, the cosine's
interval, an interval for the mean of an autocorrelated series, the conflict fraction of
per-sample alignment, and the correlation of predicted with actual changes.

* :func:`bootstrap_ci95` is Hesterberg's *expanded* percentile bootstrap: the plain percentile
  interval is too narrow for small samples (it covers about 91.5% at nominal 95% for 16 normal
  values; the tests simulate it), because the bootstrap distribution of the mean has the plug-in
  variance ``(n−1)/n · s²/n`` and normal rather than t tails. Taking the quantiles at
  ``Φ(−√(n/(n−1)) · t_{0.975, n−1})`` instead of 2.5% corrects both (Hesterberg 2015, "What
  teachers should know about the bootstrap", The American Statistician 69(4)).
* :func:`cosine_ci95` treats the cosine ``x̄ / (‖ḡ‖ ‖∇D‖)`` as the ratio of two random
  quantities that share the examples: a delta-method interval whose per-example influence
  includes the denominator's, ``(y_i − ‖ḡ‖²)/‖ḡ‖`` with ``y_i = ⟨∇ℓ_i, ḡ⟩``.
* :func:`autocorrelated_mean_ci95` widens the t interval of a series' mean by its lag-1
  autocorrelation (an AR(1) effective sample size), for summaries over probe steps, which are a
  trajectory and not independent draws.
* :func:`gradient_noise` is the noise of a batch's mean gradient from every example's squared
  gradient norm: the unbiased ``‖E g‖²`` (a U-statistic) and the noise ratio
  ``r = tr Σ / (B ‖E g‖²)``. The cosine ``x̄ / (‖ḡ‖ ‖∇D‖)`` is biased toward 0 by the factor
  ``1/√(1 + r)`` (``E‖ḡ‖² = ‖E g‖² (1 + r)``), which no interval around it covers once the bias is
  a sizeable share of the interval: :func:`alignment_stats` withholds ``cosine_ci95`` (None)
  above :func:`cosine_noise_bound` (``python -m benchmarks.intervals`` simulates the coverage).
"""

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


def standard_error_of(interval: Sequence[float]) -> float:
    """The standard error a 95% interval stands for: half its width over 1.96 (the normal
    quantile; for a t interval over few values this overstates the error slightly, 9% at 16)."""
    low, high = (float(v) for v in interval)
    return (high - low) / 2 / 1.959963984540054


BOOTSTRAP_RESAMPLES = 4000


def seed_for(*parts: int | str) -> list[int]:
    """A numpy seed sequence from ints and names (names through CRC-32, stable across runs)."""
    return [zlib.crc32(p.encode()) if isinstance(p, str) else int(p) & 0xFFFFFFFF for p in parts]


def bootstrap_ci95(values: Sequence[float] | np.ndarray, seed: Sequence[int] | int = 0,
                   resamples: int = BOOTSTRAP_RESAMPLES) -> tuple[float, float]:
    """The 95% expanded-percentile bootstrap interval of the mean (module docstring): resample the
    values with replacement ``resamples`` times (seeded: same seed, same interval) and take the
    resampled means' quantiles at ``Φ(−√(n/(n−1)) t_{0.975,n−1})`` and one minus that.
    Degenerate (the value itself) for fewer than two values."""
    x = np.asarray(values, dtype=np.float64)
    if x.size < 2:
        mean = float(x.mean()) if x.size else 0.0
        return mean, mean
    rng = np.random.default_rng(seed)
    replicates = x[rng.integers(0, x.size, size=(resamples, x.size))].mean(axis=1)
    tail = expanded_tail(x.size)
    low, high = np.quantile(replicates, [tail, 1 - tail])
    return float(low), float(high)


def expanded_tail(n: int, level: float = 0.95) -> float:
    """The lower quantile of the expanded percentile interval for ``n`` values: the normal tail
    beyond ``√(n/(n−1))`` times the t quantile (0.0139 for n = 16; 0.025 as n grows)."""
    t = float(stats.t.ppf(0.5 + level / 2, n - 1))
    return float(stats.norm.cdf(-math.sqrt(n / (n - 1)) * t))


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


def cosine_ci95(dots: Sequence[float] | np.ndarray, self_dots: Sequence[float] | np.ndarray,
                downstream_norm: float, grad_norm: float | None = None) -> tuple[float, float, float]:
    """The cosine ``x̄ / (‖ḡ‖ ‖∇D‖)`` of the mean gradient with ``∇D`` and its 95% delta-method
    interval, with ``x_i = ⟨∇ℓ_i, ∇D⟩`` (``dots``) and ``y_i = ⟨∇ℓ_i, ḡ⟩`` (``self_dots``,
    whose mean is ``‖ḡ‖²``). Numerator and denominator are both means over the same examples:
    the influence of example ``i`` on the cosine ``c`` is

        ((x_i − x̄) − x̄ (y_i − ‖ḡ‖²)/‖ḡ‖²) / (‖ḡ‖ ‖∇D‖)

    and the interval is ``c ± t_{0.975, n−1} · sd(influence)/√n``, clipped to [−1, 1]. It covers
    the cosine of the *expected* gradient when the per-example noise is small next to ``‖ḡ‖²``
    (``tr Σ / n ≪ ‖ḡ‖²``); otherwise ``‖ḡ‖`` overstates ``‖E g‖`` and the cosine is biased
    toward zero (docs/analysis.md). ``grad_norm``: ``‖ḡ‖`` computed from ``ḡ`` itself (default:
    ``√ȳ``, the same to rounding). ``(c, c, c)`` when it is undefined (``‖ḡ‖ ‖∇D‖ = 0``) or for
    fewer than two examples.
    """
    x, y = np.asarray(dots, dtype=np.float64), np.asarray(self_dots, dtype=np.float64)
    if grad_norm is None:
        squared = float(y.mean()) if y.size else 0.0
        norm = math.sqrt(squared) if squared > 0 else 0.0
    else:
        norm, squared = float(grad_norm), float(grad_norm) ** 2
    if norm == 0.0 or downstream_norm <= 0 or x.size == 0:
        return 0.0, 0.0, 0.0
    mean = float(x.mean())
    cosine = mean / (norm * downstream_norm)
    if x.size < 2:
        return cosine, cosine, cosine
    influence = ((x - mean) - mean * (y - squared) / squared) / (norm * downstream_norm)
    half = float(stats.t.ppf(0.975, x.size - 1)) * float(influence.std(ddof=1)) / math.sqrt(x.size)
    if not math.isfinite(half):
        return cosine, cosine, cosine
    return cosine, max(cosine - half, -1.0), min(cosine + half, 1.0)


def autocorrelated_mean_ci95(values: Sequence[float] | np.ndarray) -> dict[str, float]:
    """Mean of a series (probe steps of one run) with a 95% t interval widened for its lag-1
    autocorrelation: ``r`` is the lag-1 autocorrelation, corrected for its small-sample bias
    (``r + (1 + 4r)/n``, Marriott and Pope 1954) and clipped to ``[0, 0.95]`` (never narrower
    than the independent interval), ``n_eff = n (1−r)/(1+r)`` (at least 2), and the interval is
    ``mean ± t_{0.975, n_eff−1} · s/√n_eff``. Approximate: it assumes a stationary AR(1) series,
    and a trajectory that trends is not one (docs/analysis.md). Returns ``mean``, ``low``,
    ``high``, ``effective_n`` and the raw ``lag1_autocorrelation`` (0 below three values)."""
    x = np.asarray(values, dtype=np.float64)
    mean = float(x.mean())
    d = x - mean
    denominator = float((d * d).sum())
    r = float((d[:-1] * d[1:]).sum()) / denominator if x.size >= 3 and denominator > 0 else 0.0
    out = {"mean": mean, "low": mean, "high": mean, "effective_n": float(x.size), "lag1_autocorrelation": r}
    if x.size < 2 or denominator == 0:
        return out
    corrected = min(max(r + (1 + 4 * r) / x.size, 0.0), 0.95) if x.size >= 3 else 0.0
    n_eff = max(x.size * (1 - corrected) / (1 + corrected), 2.0)
    half = float(stats.t.ppf(0.975, n_eff - 1)) * float(x.std(ddof=1)) / math.sqrt(n_eff)
    out.update(low=mean - half, high=mean + half, effective_n=n_eff)
    return out


#: The cosine's interval is withheld above this noise ratio whatever else holds: there the noise
#: ratio's own estimate is too rough to correct by (the coverage simulation of benchmarks.intervals).
NOISE_RATIO_CAP = 0.1
#: ... and where its bias ``|c| (√(1 + r) − 1)`` exceeds this share of the interval's half-width.
BIAS_SHARE = 0.25


def gradient_noise(squared_norms: Sequence[float] | np.ndarray, mean_norm_sq: float) -> tuple[float, float | None]:
    """``(U, r)`` for a batch of ``B`` examples: ``U = (B² ‖ḡ‖² − Σ_i ‖∇ℓ_i‖²) / (B (B−1))``, the
    unbiased estimate of ``‖E g‖²`` (the mean of ``⟨∇ℓ_i, ∇ℓ_j⟩`` over pairs ``i ≠ j``), and the noise
    ratio ``r = tr Σ̂ / (B U)`` with ``tr Σ̂ / B = ‖ḡ‖² − U`` (None where ``U ≤ 0``: the mean gradient is
    not resolved above its noise). ``mean_norm_sq``: ``‖ḡ‖²``. Fewer than two examples: ``(‖ḡ‖², None)``."""
    squared = np.asarray(squared_norms, dtype=np.float64)
    b = squared.size
    if b < 2:
        return float(mean_norm_sq), None
    unbiased = (b * b * float(mean_norm_sq) - float(squared.sum())) / (b * (b - 1))
    return unbiased, (float(mean_norm_sq) - unbiased) / unbiased if unbiased > 0 else None


def cosine_noise_bound(cosine: float, half_width: float) -> float:
    """The largest noise ratio at which the cosine's interval is reported: ``NOISE_RATIO_CAP``, or
    less where the cosine's bias ``|c| (√(1 + r) − 1)`` would pass ``BIAS_SHARE`` of the
    interval's half-width ``h``: ``r ≤ (1 + BIAS_SHARE·h/|c|)² − 1``."""
    if cosine == 0:
        return NOISE_RATIO_CAP
    return min(NOISE_RATIO_CAP, (1 + BIAS_SHARE * half_width / abs(cosine)) ** 2 - 1)


def alignment_stats(dots: np.ndarray, self_dots: np.ndarray, grad_norm: float, downstream_norm: float,
                    seed: Sequence[int] | int = 0, squared_norms: np.ndarray | None = None) -> dict[str, object]:
    """Summary of per-sample dots ``⟨∇ℓ_i, ∇D⟩`` for one objective at one probe.

    ``dot`` is their mean, which equals ``⟨∇L, ∇D⟩`` for ``L = mean_i ℓ_i``, with a Student-t
    (``ci95``) and an expanded-percentile bootstrap (``ci95_bootstrap``) interval over examples;
    ``cosine`` divides it by both gradient norms, and ``cosine_ci95`` is its delta-method interval
    (:func:`cosine_ci95`, from ``self_dots`` ``⟨∇ℓ_i, ∇L⟩``); ``conflict_fraction`` is the share
    of examples whose gradient points away from the downstream gradient. With ``squared_norms``
    (every example's ``‖∇ℓ_i‖²``): ``grad_norm_sq_unbiased`` and ``noise_ratio``
    (:func:`gradient_noise`), and ``cosine_ci95`` is None where the noise ratio is undefined or
    above :func:`cosine_noise_bound`.
    """
    mean, low, high = mean_ci95(dots)
    cosine, cosine_low, cosine_high = cosine_ci95(dots, self_dots, downstream_norm, grad_norm)
    out: dict[str, object] = {
        "dot": mean,
        "cosine": cosine,
        "ci95": [low, high],
        "ci95_bootstrap": list(bootstrap_ci95(dots, seed)),
        "cosine_ci95": [cosine_low, cosine_high],
        "conflict_fraction": float(np.mean(np.asarray(dots) < 0)),
        "grad_norm": grad_norm,
    }
    if squared_norms is not None:
        unbiased, ratio = gradient_noise(squared_norms, grad_norm * grad_norm)
        out["grad_norm_sq_unbiased"] = unbiased
        out["noise_ratio"] = ratio
        if ratio is None or ratio > cosine_noise_bound(cosine, (cosine_high - cosine_low) / 2):
            out["cosine_ci95"] = None
    return out
