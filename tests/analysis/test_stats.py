from __future__ import annotations

import math

import numpy as np
import pytest

from objreg.analysis.stats import alignment_stats, bootstrap_ci95, correlation, mean_ci95, seed_for


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
    stats = alignment_stats(dots, grad_norm=2.0, downstream_norm=4.0)
    assert stats["dot"] == 0.5
    assert stats["cosine"] == pytest.approx(0.5 / 8.0)
    assert stats["conflict_fraction"] == 0.5
    assert stats["ci95"][0] < 0.5 < stats["ci95"][1]
    assert stats["ci95_bootstrap"][0] < 0.5 < stats["ci95_bootstrap"][1]
    assert stats["cosine_ci95"] == pytest.approx([stats["ci95"][0] / 8.0, stats["ci95"][1] / 8.0])
    assert alignment_stats(dots, 0.0, 4.0)["cosine"] == 0.0


def test_bootstrap_interval_is_seeded_and_covers_the_mean_about_95_percent():
    rng = np.random.default_rng(1)
    x = rng.normal(0.0, 1.0, 30)
    assert bootstrap_ci95(x, seed=[1, 2]) == bootstrap_ci95(x, seed=[1, 2])
    assert bootstrap_ci95(x, seed=[1, 2]) != bootstrap_ci95(x, seed=[1, 3])
    low, high = bootstrap_ci95(x, seed=0)
    assert low < x.mean() < high
    # Close to the t interval for a normal sample of 30 (percentile bootstrap is a bit narrower).
    _, t_low, t_high = mean_ci95(x)
    assert 0.8 <= (high - low) / (t_high - t_low) <= 1.05
    hits = sum(lo <= 1.0 <= hi for lo, hi in (bootstrap_ci95(rng.normal(1.0, 2.0, 40), seed=i, resamples=500)
                                               for i in range(400)))
    assert 0.90 <= hits / 400 <= 0.985  # percentile bootstrap undercovers slightly at n = 40
    assert bootstrap_ci95([2.0]) == (2.0, 2.0)


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
