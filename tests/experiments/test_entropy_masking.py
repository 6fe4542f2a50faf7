"""entropy-masking: the closed form, the exact expectation of mlm's rule, the verdict, determinism."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import objreg
from objreg.experiments import _support, entropy_masking
from objreg.experiments.base import Setting
from objreg.testing import TINY_MODEL

SPECIAL = 5
VOCAB = objreg.Vocabulary(size=SPECIAL + 50, pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4,
                          special_ids=tuple(range(SPECIAL)))


@pytest.fixture(scope="module")
def registry():
    return objreg.Registry.load(load_entrypoints=False)


def scored_batch(B: int, T: int, seed: int = 0, lengths: list[int] | None = None) -> objreg.TokenBatch:
    """Rows ``[CLS] x… [SEP]`` (right-padded to ``T`` where ``lengths`` says) with surprisal U(0.5, 6)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor(lengths or [T] * B)
    p = torch.arange(T)[None, :]
    padding = p >= lengths[:, None]
    ids = torch.randint(SPECIAL, VOCAB.size, (B, T), generator=g)
    ids = torch.where(p == 0, VOCAB.cls_id, torch.where(p == lengths[:, None] - 1, VOCAB.sep_id, ids))
    ids = torch.where(padding, VOCAB.pad_id, ids)
    special = padding | (p == 0) | (p == lengths[:, None] - 1)
    surprisal = torch.where(special, 0.0, 0.5 + 5.5 * torch.rand(B, T, generator=g))
    return objreg.TokenBatch(ids, padding, special, torch.where(special, -1, p.expand(B, T)),
                             torch.where(special, -1, 0), torch.where(padding, -1, torch.arange(B)[:, None]), surprisal)


def test_closed_form_matches_a_float64_loop():
    batch = scored_batch(4, 12, lengths=[12, 7, 3, 10])
    can = ~batch.is_special
    got = entropy_masking.closed_form(batch.surprisal, can)
    values = [float(batch.surprisal[b, t]) for b in range(4) for t in range(12) if can[b, t]]
    mu = sum(values) / len(values)
    var = sum((v - mu) ** 2 for v in values) / len(values)
    assert got["mu"] == pytest.approx(mu) and got["sigma2"] == pytest.approx(var)
    assert got["closed_form"] == pytest.approx((var + mu**2) / mu)
    assert got["closed_form_gain"] == pytest.approx(var / mu**2)
    rows = [[float(batch.surprisal[b, t]) for t in range(12) if can[b, t]] for b in range(4)]
    per_row = sum(len(r) * sum(x * x for x in r) / sum(r) for r in rows) / sum(len(r) for r in rows)
    assert got["per_row_closed_form"] == pytest.approx(per_row)


def test_exact_expectation_without_caps_is_the_per_row_closed_form():
    # Long rows with mild weights: nothing is capped and no row ends up empty, so the rule's
    # expectation is Σ_rows n (Σs²/Σs) / Σ n.
    batch = scored_batch(6, 200, seed=1)
    can = ~batch.is_special
    exact = entropy_masking.expected_masked_mean(batch.surprisal, can, batch.surprisal, 0.15)
    assert exact == pytest.approx(entropy_masking.closed_form(batch.surprisal, can)["per_row_closed_form"], rel=1e-9)


def test_exact_expectation_handles_caps_and_the_forced_token():
    # One row of 4 tokens with weights 100, 1, 1, 1 and rate 0.5 (budget 2): the heavy one is capped
    # at π = 1 and the other three share the remaining budget of 1.
    s = torch.tensor([[0.0, 100.0, 1.0, 1.0, 1.0, 0.0]])
    can = torch.tensor([[False, True, True, True, True, False]])
    got = entropy_masking.expected_masked_mean(s, can, s, 0.5)
    # π = 1/3 each for the light ones; a token with π = 1 means no row is ever empty: nothing is forced.
    expected = (1 * 100 + 3 * (1 / 3) * 1) / (1 + 3 * (1 / 3))
    assert got == pytest.approx(expected, rel=1e-6)
    # A short row: P(nothing selected) > 0 adds the forced token, drawn ∝ w.
    s = torch.tensor([[0.0, 2.0, 1.0, 0.0]])
    can = torch.tensor([[False, True, True, False]])
    pi = torch.tensor([2.0, 1.0]) * (0.15 * 2 / 3)
    p0 = float((1 - pi).prod())
    q = torch.tensor([2 / 3, 1 / 3])
    expected = float((pi * torch.tensor([2.0, 1.0])).sum() + p0 * (q * torch.tensor([2.0, 1.0])).sum()) / float(
        pi.sum() + p0)
    assert entropy_masking.expected_masked_mean(s, can, s, 0.15) == pytest.approx(expected, rel=1e-6)


def test_monte_carlo_of_the_objective_agrees_with_the_exact_expectation(registry):
    batch = scored_batch(16, 24, seed=2, lengths=[24, 5, 9, 24, 3, 12, 24, 24, 7, 18, 24, 4, 24, 10, 24, 24])
    can = ~batch.is_special
    objective = registry.get("mlm", vocab=VOCAB, masking_policy="entropy")
    draws = entropy_masking.masked_sums(objective, batch, 800, torch.Generator().manual_seed(0))
    per_draw = draws[:, 0] / draws[:, 1]
    measured = draws[:, 0].sum() / draws[:, 1].sum()
    exact = entropy_masking.expected_masked_mean(batch.surprisal, can, batch.surprisal, 0.15)
    assert abs(measured - exact) < 4 * per_draw.std() / np.sqrt(len(per_draw)) + 1e-3, (measured, exact)


def _figures_with(deviation_ci: list[float]) -> dict:
    return {"gain_deviation": {"measured": sum(deviation_ci) / 2, "ci95": deviation_ci, "tolerance": 0.1},
            "ratio": {"measured": 1.2, "ci95": [1.19, 1.21], "closed_form": 1.2, "exact": 1.2},
            "entropy": {"masked_mean": 6.0}, "uniform": {"masked_mean": 5.0}, "mu": 5.0, "sigma2": 5.0}


@pytest.mark.parametrize(("ci", "verdict"), [([-0.05, 0.04], "confirmed"), ([-0.3, -0.2], "refuted"),
                                             ([0.05, 0.2], "inconclusive")])
def test_verdict_from_the_gain_deviation(ci, verdict):
    assert entropy_masking.decide(_figures_with(ci))[0] == verdict


@pytest.fixture(scope="module")
def tiny_text(registry, tokenizer, texts):
    corpus = objreg.Corpus("tiny", tuple(tuple(objreg.split_sentences(t)) for t in texts * 3))
    train, heldout = corpus.split(heldout_every=3)
    return _support.DefaultText(registry, objreg.TokenizedCorpus(tokenizer, train, 32),
                                objreg.TokenizedCorpus(tokenizer, heldout, 32))


def test_same_seed_same_figures(tiny_text, tmp_path):
    config = entropy_masking.Config(train_steps=2, batch_size=4, rows=6, draws=30, seq_len=32, resamples=200)
    setting = Setting(quick=True, seed=3, out_dir=tmp_path, device="cpu")
    first = entropy_masking._run(config, setting, tiny_text, dict(TINY_MODEL))
    again = entropy_masking._run(config, Setting(quick=True, seed=3, device="cpu"), tiny_text, dict(TINY_MODEL))
    assert first.figures == again.figures and first.verdict == again.verdict
    json.dumps(first.to_dict(), allow_nan=False)
    ratio = first.figures["ratio"]
    assert ratio["closed_form"] >= 1 and ratio["ci95"][0] <= ratio["measured"] <= ratio["ci95"][1]
    assert (tmp_path / "entropy-masking.png").stat().st_size > 1000
    other = entropy_masking._run(config, Setting(quick=True, seed=4, device="cpu"), tiny_text, dict(TINY_MODEL))
    assert other.figures != first.figures
