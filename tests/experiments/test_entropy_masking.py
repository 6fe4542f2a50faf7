"""entropy-masking: a tiny run of the two trained twins, and the two-part verdict over seeds."""

from __future__ import annotations

import json

import numpy as np
import pytest

from objreg.experiments import entropy_masking as em
from objreg.experiments.base import ExperimentResult, Setting
from objreg.testing import TINY_MODEL


def test_tiny_run_is_reproducible(tiny_text, tmp_path):
    config = em.Config(steps=4, batch_size=4, seq_len=32, rows=6)
    result = em._run(config, Setting(quick=True, seed=2, out_dir=tmp_path, device="cpu"), tiny_text, dict(TINY_MODEL))
    figures = result.figures
    losses = figures["heldout_loss"]
    assert figures["effect"] == pytest.approx(losses["uniform"] - losses["entropy"])
    assert figures["parts"]["heldout_gain"] == figures["effect"]
    assert figures["training_loss"]["entropy"]["steps"] == 4
    json.dumps(result.to_dict(), allow_nan=False)
    assert (tmp_path / "entropy-masking.png").stat().st_size > 1000
    again = em._run(config, Setting(quick=True, seed=2, device="cpu"), tiny_text, dict(TINY_MODEL))
    assert again.figures == figures


def _seed(signal: float, gain: float) -> ExperimentResult:
    return ExperimentResult(em.NAME, em.CLAIM, "inconclusive", "r",
                            {"effect": gain, "parts": {"signal_ratio": signal, "heldout_gain": gain}})


@pytest.mark.parametrize(("signals", "gains", "verdict"), [
    ([1.10, 1.12, 1.11], [0.05, 0.07, 0.06], "confirmed"),
    ([1.10, 1.12, 1.11], [-0.05, -0.07, -0.06], "refuted"),
    ([0.90, 0.92, 0.91], [0.05, 0.07, 0.06], "refuted"),
    ([1.10, 1.12, 1.11], [-0.05, 0.07, 0.01], "inconclusive"),
])
def test_both_parts_decide_over_seeds(signals, gains, verdict):
    result = em.combine([_seed(s, g) for s, g in zip(signals, gains)], Setting(seed=0))
    assert result.verdict == verdict
    parts = result.figures["parts"]
    assert parts["heldout_gain"]["mean"] == pytest.approx(np.mean(gains))
    assert parts["signal_ratio"]["per_seed"] == signals
