"""consistency-collapse: the views, the collapse metric, the stop-gradient, a forced collapse, a tiny run."""

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


def _tokens(batch, row: int) -> list[int]:
    """Row ``row``'s ids between its [CLS] and its [SEP], read off its padding mask in plain Python."""
    ids = [i for i, pad in zip(batch.input_ids[row].tolist(), batch.is_padding[row].tolist()) if not pad]
    return ids[1:-1]


@pytest.mark.parametrize("split", ["middle", "drawn"])
def test_the_two_views_split_each_row_into_disjoint_spans_of_its_document(tiny, split):
    rows = tiny.train.sample(16, torch.Generator().manual_seed(4))
    vocab = tiny.train.vocab
    generator = torch.Generator().manual_seed(5) if split == "drawn" else None
    first, second = cc.two_views(rows, vocab.pad_id, generator)
    for r in range(16):
        whole = [i for i, pad in zip(rows.input_ids[r].tolist(), rows.is_padding[r].tolist()) if not pad][1:-1]
        a, b = _tokens(first, r), _tokens(second, r)
        # The views partition the row's tokens: the first a prefix, the second the rest, each non-empty,
        # so no token position of the row is in both.
        assert a + b == whole and a and b
        if split == "middle":
            assert len(a) == (len(whole) + 1) // 2
        for view in (first, second):
            real = ~view.is_padding[r]
            ids = view.input_ids[r][real].tolist()
            assert ids[0] == vocab.cls_id and ids[-1] == vocab.sep_id
            assert not bool(view.is_padding[r][: int(real.sum())].any())  # padding only on the right
            assert set(view.document_ids[r][real].tolist()) == {int(rows.document_ids[r, 0])}
            assert set(view.document_ids[r][~real].tolist()) <= {-1}
            assert set(view.input_ids[r][~real].tolist()) <= {vocab.pad_id}
            assert view.position_ids[r].tolist() == list(range(view.input_ids.shape[1]))
            assert set(view.labels[r].tolist()) == {objreg.IGNORE_INDEX}


def test_the_drawn_split_is_the_seeds_and_uniform_over_the_inner_points(tiny):
    rows = tiny.train.sample(16, torch.Generator().manual_seed(4))
    pad = tiny.train.vocab.pad_id
    once, again = (cc.two_views(rows, pad, torch.Generator().manual_seed(6)) for _ in range(2))
    assert all(torch.equal(a, b) for x, y in zip(once, again) for a, b in zip(x[:5], y[:5]))
    other = cc.two_views(rows, pad, torch.Generator().manual_seed(7))
    assert not torch.equal(once[0].is_padding, other[0].is_padding)
    row = rows.select(slice(0, 1))
    n = len(_tokens(row, 0))
    generator = torch.Generator().manual_seed(8)
    draws = 200 * (n - 1)
    points = np.bincount([len(_tokens(cc.two_views(row, pad, generator)[0], 0)) for _ in range(draws)], minlength=n + 1)
    assert points[0] == 0 and points[n] == 0  # each view keeps at least one token
    # Every inner point is drawn about 200 times (a binomial sd of about 14): within 5 sd of it.
    assert np.all(np.abs(points[1:n] - 200) < 5 * math.sqrt(200 * (1 - 1 / (n - 1))))


def test_a_row_of_one_token_cannot_be_split(tiny):
    row = objreg.tokenize(["a sentence of words"], 3, tiny.train.tokenizer)  # truncated to one token
    assert len(_tokens(row, 0)) == 1
    with pytest.raises(objreg.DataError, match="cannot be split into two views"):
        cc.two_views(row, tiny.train.vocab.pad_id)


@pytest.mark.parametrize("batch_norm", [True, False])
def test_a_model_forced_to_collapse_reads_zero(tiny, batch_norm):
    objective = tiny.registry.get("mlm", vocab=tiny.train.vocab)
    rows = tiny.heldout.sample(12, torch.Generator().manual_seed(0))
    batch, _ = cc.two_views(rows, tiny.heldout.vocab.pad_id, torch.Generator().manual_seed(1))
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


def test_the_committed_result_was_run_with_the_views_and_steps_of_the_full_setting():
    from objreg.experiments import docs

    result = json.loads((docs.DOCS / "experiments" / "results" / "consistency-collapse.json").read_text())
    for replicate in result["replicates"]:
        assert replicate["setting"]["views"] == cc.VIEWS
        assert replicate["setting"]["steps"] == cc.FULL.steps
        assert replicate["figures"]["training_loss"]["simsiam"]["no_stop_gradient"]["steps"] == cc.FULL.steps
