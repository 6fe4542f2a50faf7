"""The SST-2 probe: the logistic regression against scikit-learn, cross-validation on signal and
noise, the sentence features against a per-text loop, reading SST-2."""

from __future__ import annotations

import pytest
import torch

import objreg
from objreg import masks
from objreg.experiments import _support
from objreg.experiments import sst2_probe as probe
from objreg.testing import TINY_MODEL


def test_probe_predicts_like_scikit_learn():
    sklearn = pytest.importorskip("sklearn.linear_model")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(300, 6, generator=g, dtype=torch.float64)
    y = ((x[:, 0] - 0.5 * x[:, 1] + 0.8 * torch.randn(300, generator=g, dtype=torch.float64)) > 0).long()
    l2 = 1e-2
    weight, bias = probe.fit_logistic(x, y, 2, l2)
    # Two softmax columns with l2 on both equal a logistic regression with penalty (l2 / 2)·|w|²,
    # scikit-learn's C·Σ log-loss + ½|w|² with C = 1 / (l2 · N).
    reference = sklearn.LogisticRegression(C=1 / (l2 * 300), tol=1e-10, max_iter=10_000).fit(x.numpy(), y.numpy())
    ours = (weight[:, 1] - weight[:, 0]).numpy()
    assert ours == pytest.approx(reference.coef_[0], rel=1e-4, abs=1e-6)
    assert float(bias[1] - bias[0]) == pytest.approx(reference.intercept_[0], rel=1e-4, abs=1e-6)


def test_cross_validated_probe_separates_signal_from_noise():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(400, 8, generator=g, dtype=torch.float64)
    separable = (x[:, 2] > 0).long()
    [correct] = probe.probe_correct(x, separable, 5, seed=0)
    assert float(correct.double().mean()) > 0.95
    shuffled = torch.randint(2, (400,), generator=g)
    [chance] = probe.probe_correct(x, shuffled, 5, seed=0)
    assert 0.4 < float(chance.double().mean()) < 0.6
    # A second view of the rows is predicted by the probe fitted on the first: itself scores the same.
    same, again = probe.probe_correct(x, separable, 5, seed=0, also=[x])
    assert torch.equal(same, again)


def test_sentence_features_are_per_text_means_of_the_backbone_output(registry, tokenizer, texts):
    mlm = registry.get("mlm", vocab=tokenizer.vocab)
    model = _support.mlm_model(registry, mlm, 0, dict(TINY_MODEL)).eval()
    features = probe.sentence_features(model, tokenizer, texts, 40, "cpu", chunk=4)
    for i, t in enumerate(texts):  # one text alone: no padding, nothing to exclude
        batch = tokenizer.batch_from_texts([t])
        mask = masks.AttentionMask.bidirectional(batch.is_padding, batch.document_ids).dense()
        with torch.no_grad():
            hidden = model.encode(batch.input_ids, mask, masks.positions_within_documents(batch.document_ids))
        torch.testing.assert_close(features[i], hidden[0].mean(dim=0).double(), rtol=1e-5, atol=1e-6)


def test_sst2_is_read_with_both_labels(shared_file):
    texts, labels = probe.sst2(shared_file(probe.SST2))
    assert len(texts) == len(labels) == 872
    assert set(labels.tolist()) == {0, 1}


def test_missing_sst2_is_one_clear_error(tmp_path):
    with pytest.raises(objreg.DataError, match="SST-2"):
        probe.sst2(tmp_path / "absent.tsv")
