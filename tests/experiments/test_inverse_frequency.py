"""inverse-frequency: the rare/frequent split, the per-row gain, a tiny run of the trained twins."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from objreg.experiments import inverse_frequency as inv
from objreg.experiments.base import Setting
from objreg.testing import TINY_MODEL


def test_rare_types_are_the_tail_beyond_the_frequent_mass():
    counts = torch.tensor([50, 0, 30, 10, 5, 5])  # total 100; by count: id 0 (50), id 2 (80), id 3 (90) ...
    assert inv.rare_types(counts, 0.8).tolist() == [False, True, False, True, True, True]
    assert inv.rare_types(counts, 0.85).tolist() == [False, True, False, False, True, True]
    assert inv.rare_types(counts, 0.5).tolist() == [False, True, True, True, True, True]


def test_per_row_gain_averages_to_the_pooled_difference():
    g = np.random.default_rng(0)
    nll = {"uniform": g.normal(size=40), "inverse_frequency": g.normal(size=40)}
    is_rare, row_of = g.random(40) < 0.4, g.integers(0, 7, size=40)
    per_row = inv._per_row_gain(nll, is_rare, row_of)
    pooled = (nll["uniform"][is_rare] - nll["inverse_frequency"][is_rare]).mean()
    assert per_row.mean() == pytest.approx(pooled) and len(per_row) == len(np.unique(row_of[is_rare]))


def test_tiny_run_is_reproducible(tiny_text, tmp_path):
    config = inv.Config(steps=3, batch_size=4, seq_len=32, rows=8)
    result = inv._run(config, Setting(quick=True, seed=1, out_dir=tmp_path, device="cpu"), tiny_text, dict(TINY_MODEL))
    figures = result.figures
    assert figures["effect"] == pytest.approx(figures["rare_nll"]["uniform"] - figures["rare_nll"]["inverse_frequency"])
    assert 0 < figures["masked_rare_tokens"] <= figures["masked_tokens"]
    assert all(0 <= s <= 1 for s in figures["rare_share_of_own_masked_loss"].values())
    json.dumps(result.to_dict(), allow_nan=False)
    assert (tmp_path / "inverse-frequency.png").stat().st_size > 1000
    assert inv._run(config, Setting(quick=True, seed=1, device="cpu"), tiny_text, dict(TINY_MODEL)).figures == figures
