"""The screen-validity figures against independent computations: a loop over pairs, scipy's
Spearman, hand-made rankings with known regret, residuals of a least-squares fit, the paired t."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from scipy import stats

from objreg.analysis.math.ranking import (
    FIGURES,
    bootstrap,
    cronbach_alpha,
    pairwise_accuracy,
    partial_spearman,
    ranks,
    regret_at_k,
    spearman,
)


def brute_pairwise(signal, outcome):
    credit, pairs = 0.0, 0
    for i, j in itertools.combinations(range(len(signal)), 2):
        if outcome[i] == outcome[j]:
            continue
        pairs += 1
        if signal[i] == signal[j]:
            credit += 0.5
        elif (signal[i] > signal[j]) == (outcome[i] > outcome[j]):
            credit += 1
    return credit / pairs


@pytest.mark.parametrize("seed", range(5))
def test_pairwise_accuracy_is_the_loop_over_pairs(seed):
    rng = np.random.default_rng(seed)
    signal = rng.integers(0, 4, 12).astype(float)  # ties on both sides
    outcome = rng.integers(0, 5, 12).astype(float)
    assert pairwise_accuracy(signal, outcome) == pytest.approx(brute_pairwise(signal, outcome), abs=1e-12)


def test_pairwise_accuracy_of_known_orders():
    assert pairwise_accuracy([1, 2, 3], [10, 20, 30]) == 1.0
    assert pairwise_accuracy([3, 2, 1], [10, 20, 30]) == 0.0
    assert pairwise_accuracy([1, 1, 1], [10, 20, 30]) == 0.5
    assert math.isnan(pairwise_accuracy([1, 2], [5, 5]))
    with pytest.raises(ValueError, match="one length"):
        pairwise_accuracy([1, 2], [1, 2, 3])


def test_ranks_are_each_values_mean_position_among_its_ties():
    values = [3.0, 1.0, 3.0, 2.0, 3.0, 1.0]
    ordered = sorted(values)
    expected = [np.mean([i + 1 for i, v in enumerate(ordered) if v == value]) for value in values]
    assert ranks(values).tolist() == expected == [5.0, 1.5, 5.0, 3.0, 5.0, 1.5]


@pytest.mark.parametrize("seed", range(5))
def test_spearman_is_scipys(seed):
    rng = np.random.default_rng(seed)
    a, b = rng.integers(0, 6, 15).astype(float), rng.normal(size=15)
    assert spearman(a, b) == pytest.approx(stats.spearmanr(a, b).statistic, abs=1e-12)
    assert spearman([1, 1, 1], b[:3]) == 0.0


def test_regret_of_hand_made_rankings():
    outcome = [0.70, 0.90, 0.80, 0.60]
    assert regret_at_k([4, 3, 2, 1], outcome, 1) == pytest.approx(0.20)  # picks 0.70, best 0.90
    assert regret_at_k([4, 3, 2, 1], outcome, 2) == 0.0
    assert regret_at_k([1, 2, 3, 4], outcome, 1) == pytest.approx(0.30)  # picks 0.60
    assert regret_at_k([1, 2, 3, 4], outcome, 3) == 0.0  # its top 3: 0.60, 0.80, 0.90
    assert regret_at_k([1, 2, 3, 4], outcome, 2) == pytest.approx(0.10)  # 0.60, 0.80
    assert regret_at_k([5, 5, 0, 0], outcome, 1) == pytest.approx(0.20)  # a tie goes to the first listed
    with pytest.raises(ValueError, match="k must be"):
        regret_at_k([1], [1], 0)


@pytest.mark.parametrize("seed", range(3))
def test_partial_spearman_is_the_correlation_of_rank_residuals(seed):
    rng = np.random.default_rng(seed)
    z = rng.normal(size=20)
    s, y = z + rng.normal(size=20), z + rng.normal(size=20)
    rs, ry, rz = (stats.rankdata(v) for v in (s, y, z))
    design = np.column_stack([np.ones(20), rz])
    residual_s = rs - design @ np.linalg.lstsq(design, rs, rcond=None)[0]
    residual_y = ry - design @ np.linalg.lstsq(design, ry, rcond=None)[0]
    expected = stats.pearsonr(residual_s, residual_y).statistic
    assert partial_spearman(s, y, z) == pytest.approx(expected, abs=1e-10)
    # A signal that is the gradient norm itself has nothing left given it.
    assert partial_spearman(z, y, z) == 0.0


def test_cronbach_alpha_of_two_settings_is_one_less_the_inverse_squared_paired_t():
    a, b = np.array([0.80, 0.82, 0.79, 0.81]), np.array([0.83, 0.86, 0.80, 0.85])
    t = stats.ttest_rel(b, a).statistic
    assert cronbach_alpha(np.array([a, b])) == pytest.approx(1 - 1 / t ** 2, rel=1e-10)
    assert cronbach_alpha(np.array([[1.0, 2.0]])) is None and cronbach_alpha(np.ones((3, 2))) is None


def test_the_bootstrap_is_seeded_and_brackets_the_mean():
    rng = np.random.default_rng(0)
    outcome = rng.normal(size=(3, 10))
    signal = outcome + 0.5 * rng.normal(size=(3, 10))
    norm = rng.normal(size=(3, 10))
    figure = FIGURES["pairwise_accuracy"]
    first = bootstrap(figure, signal, outcome, norm, torch.Generator().manual_seed(1), replicates=200)
    again = bootstrap(figure, signal, outcome, norm, torch.Generator().manual_seed(1), replicates=200)
    assert first == again and first["low"] <= first["mean"] <= first["high"] and first["high"] - first["low"] > 0
    expected = np.mean([brute_pairwise(s, y) for s, y in zip(signal, outcome)])
    assert first["mean"] == pytest.approx(expected)
    perfect = bootstrap(figure, outcome, outcome, norm, torch.Generator().manual_seed(1), replicates=50)
    assert perfect == {"mean": 1.0, "low": 1.0, "high": 1.0}
