"""The power of the between-seed test (objreg.experiments.power) against independent computations:
published sample sizes, the normal limit, and a Monte-Carlo of the t-interval's rejection rate."""

from __future__ import annotations

import math

import pytest
import torch

from objreg.experiments import power

# t_{0.975} by degrees of freedom, from a printed t table (not from scipy).
T_975 = {2: 4.302652729911275, 4: 2.7764451051977987, 5: 2.570581835636314, 9: 2.2621571627982053}


def rejection_rate(seeds: int, effect: float, sd: float, trials: int, generator: torch.Generator) -> float:
    """How often the two-sided 95% t-interval of ``seeds`` normal draws (mean ``effect``, standard
    deviation ``sd``) excludes 0: the experiments' decision, simulated."""
    draws = effect + sd * torch.randn(trials, seeds, generator=generator, dtype=torch.float64)
    mean, s = draws.mean(dim=1), draws.std(dim=1)
    half = T_975[seeds - 1] * s / math.sqrt(seeds)
    return float(((mean - half > 0) | (mean + half < 0)).double().mean())


@pytest.mark.parametrize(("d", "n80"), [(0.2, 199), (0.5, 34), (0.8, 15), (1.0, 10)])
def test_n80_matches_the_published_one_sample_t_test_sizes(d, n80):
    # Two-sided one-sample t-test, alpha 0.05, power 0.8: the sizes of Cohen's tables (and G*Power).
    assert power.seeds_for_power(d) == n80
    assert power.seeds_for_power(-d) == n80


def test_n80_is_the_first_size_reaching_80_percent():
    for d in (0.3, 0.9, 1.7, 3.0):
        n = power.seeds_for_power(d)
        assert power.decision_power(n, d * math.sqrt(n)) >= 0.8
        if n > 2:
            assert power.decision_power(n - 1, d * math.sqrt(n - 1)) < 0.8


def test_power_tends_to_the_normal_test_for_many_seeds():
    from scipy.stats import norm

    for delta in (1.0, 2.8, 4.0):
        normal = norm.cdf(delta - 1.959963984540054) + norm.cdf(-delta - 1.959963984540054)
        assert power.decision_power(100_000, delta) == pytest.approx(normal, abs=1e-4)


@pytest.mark.parametrize(("seeds", "d"), [(3, 2.0), (5, 1.0), (10, 0.6)])
def test_power_matches_a_monte_carlo_of_the_t_interval(seeds, d):
    generator = torch.Generator().manual_seed(seeds)
    trials = 40_000
    simulated = rejection_rate(seeds, d, 1.0, trials, generator)
    exact = power.decision_power(seeds, d * math.sqrt(seeds))
    assert abs(simulated - exact) < 4 * math.sqrt(exact * (1 - exact) / trials)


@pytest.mark.parametrize("seeds", [3, 5, 10])
def test_an_effect_of_the_mde_is_detected_80_percent_of_the_time(seeds):
    sd = 0.37
    mde = power.minimum_detectable_effect(seeds, sd)
    simulated = rejection_rate(seeds, mde, sd, 40_000, torch.Generator().manual_seed(100 + seeds))
    assert abs(simulated - 0.8) < 4 * math.sqrt(0.8 * 0.2 / 40_000)
    assert power.minimum_detectable_effect(seeds, 2 * sd) == pytest.approx(2 * mde)


def test_power_of_reads_the_spread_between_seeds():
    values = [0.0646, 0.048, 0.167]
    mean = sum(values) / 3
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / 2)
    figures = power.power_of(values, 0.0)
    assert figures["sd"] == pytest.approx(sd) and figures["standardised_effect"] == pytest.approx(mean / sd)
    assert figures["n80"] == power.seeds_for_power(mean / sd) == 6
    assert figures["mde"] == pytest.approx(power.detectable_noncentrality(3) * sd / math.sqrt(3))
    assert power.power_of([1.0], 0.0)["n80"] is None  # one seed: no spread
    assert power.power_of([1.0, 1.0, 1.0], 0.0)["mde"] is None
    assert power.power_of([-1.0, 1.0, 0.0], 0.0)["n80"] is None  # an effect of exactly 0


def _part(d: float, verdict: str | None, against: bool) -> dict:
    return {"standardised_effect": d, "verdict": verdict, "against_claim": against}


def test_the_decisive_part():
    assert power.decisive_part({"a": _part(3.0, "confirmed", False), "b": _part(1.5, "confirmed", False)},
                               "confirmed") == "b"
    assert power.decisive_part({"a": _part(-3.0, "refuted", True), "b": _part(-6.0, "refuted", True),
                                "c": _part(2.0, "confirmed", False)}, "refuted") == "b"
    # Undecided, one part against the claim: it alone can refute, so it decides.
    assert power.decisive_part({"a": _part(0.9, "inconclusive", False), "b": _part(-0.2, "inconclusive", True),
                                "c": _part(5.0, "confirmed", False)}, "inconclusive") == "b"
    # Undecided, every part on the claim's side: all must be confirmed, so the weakest decides.
    assert power.decisive_part({"a": _part(0.9, "inconclusive", False), "b": _part(0.08, "inconclusive", False),
                                "c": _part(5.0, "confirmed", False)}, "inconclusive") == "b"


def test_summary_reads_an_equivalence_margin_at_its_nearer_bound():
    tests = {"effect": {"per_seed": [1.88, 0.90, 0.98], "margin": [0.75, 1.25], "direction": "inside",
                        "verdict": "inconclusive"}}
    summary = power.summary(tests, "inconclusive")
    assert summary["part"] == "effect" and summary["threshold"] == 1.25 and summary["against_claim"]
    assert summary["n80"] == power.seeds_for_power((sum([1.88, 0.90, 0.98]) / 3 - 1.25) / summary["sd"])
    assert "parts" not in summary
    two = {"x": {"per_seed": [1.0, 1.2, 0.9], "threshold": 0.0, "direction": "above", "verdict": "confirmed"},
           "y": {"per_seed": [0.1, -0.3, 0.4], "threshold": 0.0, "direction": "above", "verdict": "inconclusive"}}
    summary = power.summary(two, "inconclusive")
    assert summary["part"] == "y" and set(summary["parts"]) == {"x", "y"}
