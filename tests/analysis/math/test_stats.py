from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import signal as scipy_signal
from scipy import stats as scipy_stats

from objreg.analysis.math.stats import (
    BOOTSTRAP_RESAMPLES,
    NOISE_RATIO_CAP,
    alignment_stats,
    autocorrelated_mean_ci95,
    bootstrap_ci95,
    correlation,
    cosine_ci95,
    cosine_noise_bound,
    expanded_tail,
    gradient_noise,
    mean_ci95,
    percentile_interval,
    seed_for,
)


def test_ci95_matches_the_closed_form_t_interval():
    # n = 5, mean 3, sample sd sqrt(2.5); t_{0.975, 4} = 2.7764451 (standard tables).
    mean, low, high = mean_ci95([1, 2, 3, 4, 5])
    half = 2.7764451 * math.sqrt(2.5) / math.sqrt(5)
    assert mean == 3 and low == pytest.approx(3 - half, rel=1e-6) and high == pytest.approx(3 + half, rel=1e-6)


def test_ci95_covers_the_true_mean_about_95_percent_of_the_time():
    rng = np.random.default_rng(0)
    hits = sum(low <= 1.0 <= high for _, low, high in (mean_ci95(rng.normal(1.0, 2.0, 12)) for _ in range(2000)))
    assert 0.935 <= hits / 2000 <= 0.965  # binomial 4σ band around 0.95 for 2000 trials


def test_degenerate_intervals():
    assert mean_ci95([2.5]) == (2.5, 2.5, 2.5)
    assert mean_ci95([1.0, 1.0, 1.0]) == (1.0, 1.0, 1.0)


def test_alignment_stats():
    dots = np.array([3.0, -1.0, 2.0, -2.0])
    # ⟨∇ℓ_i, ḡ⟩ with ‖ḡ‖ = 2: their mean is ‖ḡ‖² = 4.
    self_dots = np.array([5.0, 3.0, 4.0, 4.0])
    stats = alignment_stats(dots, self_dots, grad_norm=2.0, downstream_norm=4.0)
    assert stats["dot"] == 0.5
    assert stats["cosine"] == pytest.approx(0.5 / 8.0)
    assert stats["conflict_fraction"] == 0.5
    assert stats["ci95"][0] < 0.5 < stats["ci95"][1]
    assert stats["ci95_bootstrap"][0] < 0.5 < stats["ci95_bootstrap"][1]
    assert stats["cosine_ci95"][0] < stats["cosine"] < stats["cosine_ci95"][1]
    assert alignment_stats(dots, self_dots, 0.0, 4.0)["cosine"] == 0.0


def test_the_cosine_interval_is_the_delta_method_of_the_ratio():
    # Against the influence function written out: c = x̄/(a N), a = ‖ḡ‖, with
    # IF_i = (x_i − x̄)/(a N) − x̄ (y_i − a²)/(a³ N).
    x = np.array([0.3, -0.1, 0.8, 0.2, 0.5])
    y = np.array([1.2, 0.7, 1.5, 0.9, 0.7])  # mean 1.0 = a²
    cosine, low, high = cosine_ci95(x, y, downstream_norm=2.0)
    a, norm = 1.0, 2.0
    influence = (x - x.mean()) / (a * norm) - x.mean() * (y - a * a) / (a**3 * norm)
    half = scipy_stats.t.ppf(0.975, 4) * influence.std(ddof=1) / np.sqrt(5)
    assert cosine == pytest.approx(x.mean() / 2.0)
    assert (low, high) == pytest.approx((cosine - half, cosine + half))
    assert cosine_ci95(x, np.zeros(5), 2.0) == (0.0, 0.0, 0.0)


def simulated_cosine_coverage(sigma, cosine, trials=2000, n=16, dim=40, seed=3):
    """Per-example gradients ``μ + σ z`` in ``dim`` dimensions with ``cos(μ, u) = cosine``: how
    often the delta-method interval and the old one (the dot's t interval divided by ``‖ḡ‖`` as
    if it were fixed) cover the cosine."""
    rng = np.random.default_rng(seed)
    u = np.zeros(dim)
    u[0] = 1.0
    mu = np.zeros(dim)
    mu[0], mu[1] = cosine, np.sqrt(1 - cosine**2)
    new = old = 0
    for _ in range(trials):
        z = mu + sigma * rng.normal(size=(n, dim))
        g = z.mean(0)
        x, y, a = z @ u, z @ g, float(np.linalg.norm(g))
        _, low, high = cosine_ci95(x, y, 1.0, a)
        new += low <= cosine <= high
        _, t_low, t_high = mean_ci95(x)
        old += t_low / a <= cosine <= t_high / a
    return new / trials, old / trials


@pytest.mark.parametrize("sigma, cosine", [(0.05, 0.7), (0.03, 0.8)])
def test_the_cosine_interval_covers_about_95_percent(sigma, cosine):
    # Where the per-example noise is small next to ‖ḡ‖ (the interval's premise), it covers about
    # 95%; the old interval, ignoring that ‖ḡ‖ moves with the dot, is far too wide.
    new, old = simulated_cosine_coverage(sigma, cosine)
    assert 0.93 <= new <= 0.97, new
    assert old >= 0.98, old


def test_the_bootstrap_interval_covers_95_percent_at_16_normal_values():
    # 2,000 samples of 16 normal values, each with the analyzer's own number of resamples: the
    # expanded percentile interval covers the mean ≥ 93% (its standard error here is 0.5%); the
    # plain percentile interval of the same resamples covers about 92%.
    rng = np.random.default_rng(0)
    expanded = plain = 0
    for i in range(2000):
        x = rng.normal(1.0, 2.0, 16)
        low, high = bootstrap_ci95(x, seed=i)
        expanded += low <= 1.0 <= high
        replicates = x[np.random.default_rng(i).integers(0, 16, size=(BOOTSTRAP_RESAMPLES, 16))].mean(axis=1)
        low, high = percentile_interval(replicates)
        plain += low <= 1.0 <= high
    assert 0.93 <= expanded / 2000 <= 0.97, expanded / 2000
    assert plain / 2000 < 0.935, plain / 2000
    assert expanded_tail(16) == pytest.approx(0.01386, abs=1e-4) and expanded_tail(10**6) == pytest.approx(0.025,
                                                                                                           abs=1e-4)


def ar1(rho, n, count, rng, burn=200):
    """``count`` stationary AR(1) series ``x_t = ρ x_{t−1} + e_t`` of length ``n``."""
    return scipy_signal.lfilter([1.0], [1.0, -rho], rng.normal(size=(count, n + burn)), axis=1)[:, burn:]


def test_the_interval_over_probe_steps_is_widened_for_autocorrelation():
    # 16 probes of a stationary AR(1) series with mean 0: the i.i.d. t interval covers far less
    # than 95% once the steps are correlated; the widened one stays close.
    rng = np.random.default_rng(4)
    for rho, at_least in ((0.0, 0.93), (0.5, 0.88)):
        series = ar1(rho, 16, 2000, rng)
        widened = sum(out["low"] <= 0 <= out["high"] for out in map(autocorrelated_mean_ci95, series))
        half = scipy_stats.t.ppf(0.975, 15) * series.std(axis=1, ddof=1) / 4  # the i.i.d. t interval
        independent = int((np.abs(series.mean(axis=1)) <= half).sum())
        assert widened / 2000 >= at_least, (rho, widened / 2000)
        if rho:
            assert independent / 2000 < 0.8
    out = autocorrelated_mean_ci95([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])  # a trend: lag-1 r > 0, fewer effective probes
    assert out["lag1_autocorrelation"] > 0 and out["effective_n"] < 6
    assert autocorrelated_mean_ci95([2.0]) == {"mean": 2.0, "low": 2.0, "high": 2.0, "effective_n": 1.0,
                                               "lag1_autocorrelation": 0.0}


def test_correlation():
    x = [0.1, 0.4, 0.2, 0.9, 0.5]
    exact = correlation(x, [2 * v + 1 for v in x])
    assert exact["pearson"] == pytest.approx(1.0) and exact["spearman"] == pytest.approx(1.0)
    monotone = correlation(x, [v**3 for v in x])
    assert monotone["spearman"] == pytest.approx(1.0) and monotone["pearson"] < 1.0
    assert correlation(x, [-v for v in x])["pearson"] == pytest.approx(-1.0)
    assert correlation([1, 2], [1, 2]) == {"pearson": None, "spearman": None}
    assert correlation([1, 1, 1], [1, 2, 3]) == {"pearson": None, "spearman": None}


def test_seeds_are_stable_and_distinguish_names():
    assert seed_for(0, 3, "mlm") == seed_for(0, 3, "mlm")
    assert seed_for(0, 3, "mlm") != seed_for(0, 3, "sop")
    assert all(0 <= part < 2**32 for part in seed_for(-1, 2**40, "x"))


def test_the_unbiased_squared_norm_of_the_mean_gradient_and_the_noise_ratio():
    rng = np.random.default_rng(1)
    g = rng.normal(size=(6, 4)) + np.array([1.0, -2.0, 0.5, 0.0])
    mean = g.mean(0)
    unbiased, ratio = gradient_noise((g * g).sum(1), float(mean @ mean))
    pairs = [g[i] @ g[j] for i in range(6) for j in range(6) if i != j]
    assert unbiased == pytest.approx(np.mean(pairs), rel=1e-12)  # the U-statistic over pairs i ≠ j
    trace = np.trace(np.cov(g.T, ddof=1))
    assert ratio == pytest.approx(trace / (6 * unbiased), rel=1e-12)
    # Unbiased: over many batches its mean is ‖E g‖² (= 5.25), where ‖ḡ‖²'s is ‖E g‖² + tr Σ / B.
    draws = rng.normal(size=(4000, 8, 4)) * 2.0 + np.array([1.0, -2.0, 0.5, 0.0])
    means = draws.mean(1)
    estimates = [gradient_noise((d * d).sum(1), float(m @ m))[0] for d, m in zip(draws, means)]
    assert np.mean(estimates) == pytest.approx(5.25, abs=0.1)
    assert np.mean((means * means).sum(1)) == pytest.approx(5.25 + 16 / 8, abs=0.1)
    # Noise that swamps the mean: U ≤ 0, no ratio.
    assert gradient_noise([1.0, 1.0], 0.0) == (-1.0, None)


def test_the_cosine_interval_is_withheld_where_the_noise_ratio_passes_its_bound():
    dots, self_dots = np.array([1.0, 1.2, 0.8, 1.1]), np.array([1.0, 1.1, 0.9, 1.0])
    quiet = alignment_stats(dots, self_dots, 1.0, 1.5, squared_norms=np.full(4, 1.01))
    assert quiet["noise_ratio"] == pytest.approx(0.01 / 3 / (1 - 0.01 / 3)) and quiet["cosine_ci95"] is not None
    assert quiet["grad_norm_sq_unbiased"] == pytest.approx((16 - 4.04) / 12)
    noisy = alignment_stats(dots, self_dots, 1.0, 1.5, squared_norms=np.full(4, 2.0))
    assert noisy["noise_ratio"] == pytest.approx(0.5) and noisy["cosine_ci95"] is None
    swamped = alignment_stats(dots, self_dots, 1.0, 1.5, squared_norms=np.full(4, 5.0))
    assert swamped["noise_ratio"] is None and swamped["cosine_ci95"] is None
    # The bound: the cap, or lower where the cosine's bias |c|(√(1+r) − 1) passes a quarter of the half-width.
    assert cosine_noise_bound(0.0, 0.1) == NOISE_RATIO_CAP
    assert cosine_noise_bound(0.8, 0.01) == pytest.approx((1 + 0.25 * 0.01 / 0.8) ** 2 - 1)
    assert "noise_ratio" not in alignment_stats(dots, self_dots, 1.0, 1.5)  # without norms: as before


def simulated_reported_coverage(dimension, cosine, ratio, trials, rng, batch=16):
    """Batches of ``batch`` gradients ``μ + σ z_i`` in ``dimension`` directions at noise ratio
    ``ratio``: how often the cosine's interval covers ``cosine`` over all batches, over those
    where the probe reports it, and the share reported (benchmarks.intervals runs a grid)."""
    mu, direction = np.zeros(dimension), np.zeros(dimension)
    mu[0], direction[0], direction[1] = 1.0, cosine, np.sqrt(1 - cosine**2)
    sigma = np.sqrt(ratio * batch / dimension)
    hits, reported = [], []
    for _ in range(trials):
        g = mu + sigma * rng.standard_normal((batch, dimension))
        mean = g.mean(0)
        stats = alignment_stats(g @ direction, g @ mean, float(np.linalg.norm(mean)), 1.0,
                                squared_norms=(g * g).sum(1))
        _, low, high = cosine_ci95(g @ direction, g @ mean, 1.0, float(np.linalg.norm(mean)))
        hits.append(low <= cosine <= high)
        reported.append(stats["cosine_ci95"] is not None)
    hits, reported = np.array(hits), np.array(reported)
    return {"all": hits.mean(), "reported": hits[reported].mean() if reported.any() else None,
            "share_reported": reported.mean()}


@pytest.mark.parametrize("dimension, cosine, ratio", [(20, 0.5, 0.1), (200, 0.8, 0.003), (200, 0.5, 0.01)])
def test_reported_cosine_intervals_cover_about_95_percent_and_the_withheld_would_not(dimension, cosine, ratio):
    # The intervals reported cover ≥ 90%; where the noise ratio is far above the bound every one
    # is withheld, and the interval would have covered less than half the time.
    coverage = simulated_reported_coverage(dimension, cosine, ratio, 600, np.random.default_rng(dimension))
    assert coverage["reported"] >= 0.9 and coverage["share_reported"] > 0.3, coverage
    collapsed = simulated_reported_coverage(200, 0.8, 0.1, 300, np.random.default_rng(5))
    assert collapsed["all"] < 0.5 and collapsed["share_reported"] == 0.0, collapsed


def test_the_interval_over_probe_steps_covers_85_percent_at_rho_0_9():
    # The stated limit of the AR(1) widening: strongly autocorrelated probes (ρ = 0.9) get 85%.
    series = ar1(0.9, 16, 3000, np.random.default_rng(9))
    coverage = np.mean([out["low"] <= 0 <= out["high"] for out in map(autocorrelated_mean_ci95, series)])
    assert 0.8 <= coverage <= 0.9, coverage
