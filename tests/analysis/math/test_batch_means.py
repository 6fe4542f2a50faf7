"""The batch-means interval of an autocorrelated mean, against an AR(1) series' closed form."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from objreg.analysis.math.batch_means import batch_count, batch_means_ci95


def ar1(n: int, phi: float, series: int, generator: torch.Generator) -> np.ndarray:
    """``series`` stationary AR(1) series of length ``n``, mean 0, innovations N(0, 1)."""
    noise = torch.randn(series, n, generator=generator, dtype=torch.float64).numpy()
    x = np.empty_like(noise)
    x[:, 0] = noise[:, 0] / math.sqrt(1 - phi * phi)  # the stationary start
    for t in range(1, n):
        x[:, t] = phi * x[:, t - 1] + noise[:, t]
    return x


def variance_of_mean(n: int, phi: float) -> float:
    """The closed form: Var(x̄) = γ₀/n · [1 + 2 Σ_{k<n} (1 − k/n) φ^k], γ₀ = 1/(1 − φ²)."""
    k = np.arange(1, n)
    return 1 / (1 - phi * phi) / n * (1 + 2 * float(((1 - k / n) * phi ** k).sum()))


def test_the_batch_count_grows_as_the_root_of_the_length():
    assert [batch_count(n) for n in (0, 1, 2, 3, 8, 9, 16, 400)] == [0, 0, 2, 2, 3, 3, 4, 20]


def test_the_interval_estimates_the_closed_form_variance_of_an_ar1_mean():
    n, phi = 2500, 0.6
    x = ar1(n, phi, 300, torch.Generator().manual_seed(20))
    estimates = []
    for row in x:
        found = batch_means_ci95(row)
        half = (found["high"] - found["low"]) / 2
        quantile = float(stats.t.ppf(0.975, found["batches"] - 1))
        estimates.append((half / quantile) ** 2)
    # 50 batches of 50: the estimate is biased low by about the correlation time over the batch
    # length (φ/(1−φ)/50 ≈ 3%); 300 series average its noise to about 2%.
    assert np.mean(estimates) == pytest.approx(variance_of_mean(n, phi), rel=0.1)


@pytest.mark.parametrize("phi", [0.0, 0.5])
def test_the_interval_covers_the_mean_of_an_ar1_series_95_percent_of_the_time(phi):
    x = ar1(400, phi, 2000, torch.Generator().manual_seed(21))
    covered = [found["low"] <= 0.0 <= found["high"] for found in map(batch_means_ci95, x)]
    # Binomial(2000, 0.95) has standard deviation 0.5%; the batch means of a correlated series
    # cover a little less than nominal (batches of 20 steps against a correlation time of 2).
    assert 0.92 <= np.mean(covered) <= 0.97


def test_the_naive_interval_would_not_cover_a_correlated_mean():
    # The reason for batch means: a t interval over the steps themselves undercovers.
    from objreg.analysis.math.stats import mean_ci95

    x = ar1(400, 0.7, 1000, torch.Generator().manual_seed(22))
    naive = np.mean([low <= 0.0 <= high for _, low, high in map(mean_ci95, x)])
    batched = np.mean([f["low"] <= 0.0 <= f["high"] for f in map(batch_means_ci95, x)])
    assert naive < 0.8 < 0.9 < batched


def test_degenerate_series():
    one = batch_means_ci95([2.0])
    assert (one["mean"], one["low"], one["high"], one["batches"]) == (2.0, 2.0, 2.0, 0)
    assert math.isnan(batch_means_ci95([])["mean"])
    assert math.isnan(batch_means_ci95([1.0, float("nan"), 2.0])["mean"])
