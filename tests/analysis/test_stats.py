from __future__ import annotations

import math

import numpy as np
import pytest

from objreg.analysis.stats import alignment_stats, mean_ci95


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
    assert alignment_stats(dots, 0.0, 4.0)["cosine"] == 0.0
