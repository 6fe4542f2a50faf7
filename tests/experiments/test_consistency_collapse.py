"""consistency-collapse: the collapse metric, the stop-gradient, a forced collapse, a tiny run."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

import objreg
from objreg.experiments import _support
from objreg.experiments import consistency_collapse as cc
from objreg.experiments.base import Setting
from objreg.testing import TINY_MODEL


def test_normalised_std_against_a_float64_loop():
    z = torch.randn(9, 5, generator=torch.Generator().manual_seed(0))
    rows = [np.asarray(r, dtype=np.float64) / np.linalg.norm(np.asarray(r, dtype=np.float64)) for r in z.tolist()]
    stds = [math.sqrt(sum((r[j] - sum(q[j] for q in rows) / 9) ** 2 for r in rows) / 9) for j in range(5)]
    assert cc.normalised_std(z) == pytest.approx(sum(stds) / 5 * math.sqrt(5), rel=1e-12)


def test_normalised_std_is_one_for_gaussian_rows_and_zero_for_a_constant_direction():
    # E[u_j^2] = 1/d for a uniformly random unit vector: its per-dimension std is 1/sqrt(d).
    gaussian = torch.randn(20_000, 64, generator=torch.Generator().manual_seed(1))
    assert cc.normalised_std(gaussian) == pytest.approx(1.0, abs=0.02)
    scaled = torch.rand(50, 1, generator=torch.Generator().manual_seed(2)) * torch.arange(1.0, 65.0)
    assert cc.normalised_std(scaled + 1.0) < 0.5  # rows spread along a line: partly collapsed
    assert cc.normalised_std(torch.ones(50, 64) * 3.0) == 0.0


def test_stop_gradient_cuts_the_target_branch():
    g = torch.Generator().manual_seed(3)
    z1, p1, z2, p2 = (torch.randn(4, 6, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(4))
    loss = cc.simsiam_loss(z1, p1, z2, p2, stop_gradient=True)
    expected = -0.5 * (np.mean([np.dot(a, b) / np.linalg.norm(a) / np.linalg.norm(b)
                                for a, b in zip(p1.detach().numpy(), z2.detach().numpy())])
                       + np.mean([np.dot(a, b) / np.linalg.norm(a) / np.linalg.norm(b)
                                  for a, b in zip(p2.detach().numpy(), z1.detach().numpy())]))
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-12)
    grads = torch.autograd.grad(loss, [z1, p1, z2, p2], allow_unused=True)
    assert grads[0] is None and grads[2] is None
    assert float(grads[1].abs().sum()) > 0 and float(grads[3].abs().sum()) > 0
    free = torch.autograd.grad(cc.simsiam_loss(z1, p1, z2, p2, stop_gradient=False), [z1, z2])
    assert all(float(grad.abs().sum()) > 0 for grad in free)


@pytest.fixture(scope="module")
def tiny(tokenizer, texts):
    registry = objreg.Registry.load(load_entrypoints=False)
    corpus = objreg.Corpus("tiny", tuple(tuple(objreg.split_sentences(t)) for t in texts * 6))
    train, heldout = corpus.split(heldout_every=3)
    return _support.DefaultText(registry, objreg.TokenizedCorpus(tokenizer, train, 32),
                                objreg.TokenizedCorpus(tokenizer, heldout, 32))


@pytest.mark.parametrize("batch_norm", [True, False])
def test_a_model_forced_to_collapse_reads_zero(tiny, batch_norm):
    objective = tiny.registry.get("mlm", vocab=tiny.train.vocab, consistency_weight=1.0)
    rows = tiny.heldout.sample(12, torch.Generator().manual_seed(0))
    batch, _ = cc.two_views(objective, rows, torch.Generator().manual_seed(1), "cpu")
    model = _support.mlm_model(tiny.registry, objective, 0, dict(TINY_MODEL))
    siamese = cc.Siamese(model, model.backbone.hidden_size, torch.Generator().manual_seed(2), batch_norm).eval()
    assert cc.normalised_std(cc.representation(siamese, objective, batch)) > 0.05
    with torch.no_grad():  # the backbone's output becomes its final norm's bias: the same for every row
        model.backbone.final_norm.weight.zero_()
        model.backbone.final_norm.bias.normal_(generator=torch.Generator().manual_seed(3))
    assert cc.normalised_std(cc.representation(siamese, objective, batch)) < 1e-6


@pytest.mark.e2e
def test_tiny_run_trains_both_arms_and_is_reproducible(tiny, tmp_path):
    config = cc.Config(steps=25, eval_rows=12, batch_size=8, seq_len=32)
    result = cc._run(config, Setting(quick=True, seed=1, out_dir=tmp_path, device="cpu"), tiny, dict(TINY_MODEL))
    json.dumps(result.to_dict(), allow_nan=False)
    assert (tmp_path / "consistency-collapse.png").stat().st_size > 1000
    stds = result.figures["normalised_std"]
    assert result.figures["effect"] == pytest.approx(
        stds["simsiam"]["stop_gradient"]["trained"] - stds["simsiam"]["no_stop_gradient"]["trained"])
    # Without batch norm this tiny model collapses within 25 steps, with or without the stop-gradient.
    for arm in cc.ARMS:
        assert stds["no_batch_norm"][arm]["init"] > 0.3
        assert stds["no_batch_norm"][arm]["trained"] < 0.01
    again = cc._run(config, Setting(quick=True, seed=1, device="cpu"), tiny, dict(TINY_MODEL))
    assert again.figures == result.figures
