"""label-smoothing-bias: the smoothed loss, the fitted optimum, the slope, the verdict."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from objreg.experiments import label_smoothing_bias as lsb
from objreg.experiments.base import Setting


def test_smoothed_loss_is_torch_cross_entropy_averaged_over_labels():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(7, generator=g, dtype=torch.float64)
    labels = torch.randint(7, (500,), generator=g)
    marginal = torch.bincount(labels, minlength=7).double() / 500
    expected = F.cross_entropy(logits.expand(500, 7), labels, label_smoothing=0.2)
    torch.testing.assert_close(lsb.smoothed_loss(logits, marginal, 0.2), expected)


@pytest.mark.parametrize("epsilon", [0.0, 0.1, 0.3])
def test_fitted_marginal_is_the_closed_form_optimum(epsilon):
    pi = lsb.zipf_marginal(12, 1.0)
    q = lsb.fit_marginal(pi, epsilon)
    torch.testing.assert_close(q, (1 - epsilon) * pi + epsilon / 12, atol=1e-8, rtol=0)


def test_slope_and_its_standard_error_match_numpy():
    g = np.random.default_rng(0)
    x = g.normal(size=30)
    y = 0.3 * x + 0.05 * g.normal(size=30)
    b, se = lsb.slope(torch.tensor(y), torch.tensor(x))
    fitted, residual, *_ = np.linalg.lstsq(x[:, None], y, rcond=None)
    assert b == pytest.approx(fitted[0])
    assert se == pytest.approx(np.sqrt(residual[0] / (30 - 1) / (x @ x)))


def _figures(cis: list[list[float]]) -> dict:
    rows = [{"epsilon": e, "slope": e, "ci95": [e * (1 + lo), e * (1 + hi)], "relative_ci95": [lo, hi]}
            for e, (lo, hi) in zip((0.1, 0.2), cis)]
    return {"per_epsilon": rows}


@pytest.mark.parametrize(("cis", "verdict"), [
    ([[-0.05, 0.05], [-0.02, 0.01]], "confirmed"),
    ([[-0.05, 0.05], [0.2, 0.4]], "refuted"),
    ([[-0.05, 0.05], [0.05, 0.2]], "inconclusive"),
])
def test_verdict_needs_every_epsilon_inside_the_margin(cis, verdict):
    assert lsb.decide(_figures(cis))[0] == verdict


def test_small_run_recovers_epsilon_and_is_reproducible(tmp_path):
    config = lsb.Config(classes=10, samples=50_000, seeds=4, epsilons=(0.1, 0.3))
    result = lsb._run(config, Setting(quick=True, seed=2, out_dir=tmp_path))
    for row in result.figures["per_epsilon"]:
        assert row["ci95"][0] < row["epsilon"] < row["ci95"][1] or abs(row["relative_deviation"]) < 0.05
        assert row["max_gap_to_exact_optimum"] < 1e-7
    assert result.verdict == "confirmed"
    json.dumps(result.to_dict(), allow_nan=False)
    assert (tmp_path / "label-smoothing-bias.png").stat().st_size > 1000
    assert lsb._run(config, Setting(quick=True, seed=2)).figures == result.figures
    assert lsb._run(config, Setting(quick=True, seed=3)).figures != result.figures
