"""label-smoothing-bias: the shift slope against closed forms, and a tiny run of trained twins."""

from __future__ import annotations

import json

import numpy as np
import pytest

from objreg.experiments import label_smoothing_bias as lsb
from objreg.experiments.base import Setting
from objreg.testing import TINY_MODEL


@pytest.mark.parametrize("epsilon", [0.05, 0.2])
def test_shift_slope_is_epsilon_at_the_smoothed_optimum(epsilon):
    # A smoothed model exactly at (1−ε)p + ε/V of its plain twin: the slope is ε; no shift: 0.
    V, count = 50, 7.0
    p = np.random.default_rng(0).dirichlet(np.ones(V))
    smoothed = (1 - epsilon) * p + epsilon / V
    assert lsb.shift_slope(smoothed * count, p * count, count, V) == pytest.approx(epsilon, rel=1e-12)
    assert lsb.shift_slope(p * count, p * count, count, V) == 0.0


def test_label_slope_against_a_least_squares_fit():
    g = np.random.default_rng(1)
    label, prediction = g.dirichlet(np.ones(30)), g.dirichlet(np.ones(30))
    x = 1 / 30 - label
    fitted, *_ = np.linalg.lstsq(x[:, None], prediction - label, rcond=None)
    assert lsb.label_slope(prediction, label, 30) == pytest.approx(fitted[0])


def test_tiny_run_is_reproducible_and_labels_its_interval_within_seed(tiny_text, tmp_path):
    config = lsb.Config(steps=3, batch_size=4, seq_len=32, rows=6, resamples=50)
    result = lsb._run(config, Setting(quick=True, seed=1, out_dir=tmp_path, device="cpu"), tiny_text, dict(TINY_MODEL))
    figures = result.figures
    assert figures["effect"] == pytest.approx(figures["slope"] / 0.2)
    assert "effect_ci95_within_seed" in figures and figures["masked_tokens"] > 0
    json.dumps(result.to_dict(), allow_nan=False)
    assert (tmp_path / "label-smoothing-bias.png").stat().st_size > 1000
    again = lsb._run(config, Setting(quick=True, seed=1, device="cpu"), tiny_text, dict(TINY_MODEL))
    assert again.figures == figures
