"""entropy-masking: a tiny run of the two trained twins, read under both twins' masking
distributions, and the verdict over seeds."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from objreg.experiments import entropy_masking as em
from objreg.experiments.base import ExperimentResult, Setting
from objreg.testing import TINY_MODEL


def test_tiny_run_is_reproducible(tiny_text, texts, tmp_path):
    config = em.Config(steps=4, batch_size=4, seq_len=32, rows=6, probe_seq_len=32)
    data = (texts * 5, torch.tensor([i % 2 for i in range(30)]))
    result = em._run(config, Setting(quick=True, seed=2, out_dir=tmp_path, device="cpu"), tiny_text,
                     dict(TINY_MODEL), data)
    figures = result.figures
    losses = figures["heldout_loss"]
    assert figures["effect"] == pytest.approx(losses["uniform"] - losses["entropy"])
    assert figures["parts"]["heldout_gain"] == figures["effect"]
    on_entropy_masks = figures["heldout_loss_entropy_masks"]
    assert figures["parts"]["heldout_gain_entropy_masks"] == pytest.approx(
        on_entropy_masks["uniform"] - on_entropy_masks["entropy"])
    probe = figures["downstream"]["sst2_probe_accuracy"]
    assert all(0.0 <= probe[p] <= 1.0 for p in em.POLICIES)
    assert figures["downstream"]["gain"] == pytest.approx(probe["entropy"] - probe["uniform"])
    assert figures["training_loss"]["entropy"]["steps"] == 4
    json.dumps(result.to_dict(), allow_nan=False)
    assert (tmp_path / "entropy-masking.png").stat().st_size > 1000
    again = em._run(config, Setting(quick=True, seed=2, device="cpu"), tiny_text, dict(TINY_MODEL), data)
    assert again.figures == figures


def _seed(signal: float, gain: float, gain_entropy: float) -> ExperimentResult:
    return ExperimentResult(em.NAME, em.CLAIM, "inconclusive", "r",
                            {"effect": gain, "parts": {"signal_ratio": signal, "heldout_gain": gain,
                                                       "heldout_gain_entropy_masks": gain_entropy}})


UP, DOWN, MIXED = [0.05, 0.07, 0.06], [-0.05, -0.07, -0.06], [-0.05, 0.07, 0.01]


@pytest.mark.parametrize(("signals", "gains", "gains_entropy", "verdict"), [
    ([1.10, 1.12, 1.11], UP, UP, "confirmed"),
    ([1.10, 1.12, 1.11], DOWN, DOWN, "refuted"),
    # The entropy twin loses under uniform masks but wins under its own: no refutation of the speed.
    ([1.10, 1.12, 1.11], DOWN, UP, "inconclusive"),
    ([1.10, 1.12, 1.11], UP, MIXED, "inconclusive"),
    ([0.90, 0.92, 0.91], UP, UP, "refuted"),
    ([1.10, 1.12, 1.11], MIXED, MIXED, "inconclusive"),
])
def test_the_parts_decide_over_seeds(signals, gains, gains_entropy, verdict):
    result = em.combine([_seed(*values) for values in zip(signals, gains, gains_entropy)], Setting(seed=0))
    assert result.verdict == verdict
    parts = result.figures["parts"]
    assert parts["heldout_gain"]["mean"] == pytest.approx(np.mean(gains))
    assert parts["heldout_gain_entropy_masks"]["mean"] == pytest.approx(np.mean(gains_entropy))
    assert parts["signal_ratio"]["per_seed"] == signals


@pytest.mark.e2e
def test_twins_of_a_hugging_face_encoder_share_one_fitted_mlm_head(tiny_bert, hf_text, texts):
    # The MiniLM setting's path on a 2-layer BERT with MiniLM's tokenizer: the MLM head is fitted
    # once, then both twins continue from that one start.
    data = (texts * 5, torch.tensor([i % 2 for i in range(30)]))
    config = em.Config(steps=3, batch_size=4, seq_len=32, rows=6, probe_seq_len=32, lr=1e-4, model="minilm",
                       lm_head_steps=2)
    result = em._run(config, Setting(quick=True, seed=0, device="cpu"), hf_text, None, data, str(tiny_bert))
    json.dumps(result.to_dict(), allow_nan=False)
    assert result.setting["model"].startswith("all-MiniLM-L6-v2") and result.setting["lm_head_steps"] == 2
    figures = result.figures
    assert figures["lm_head_fit_loss"]["steps"] == 2 and figures["training_loss"]["entropy"]["steps"] == 3
    assert em.seed_verdict(figures) == (result.verdict, result.reason)
