"""hard-negatives: the held-out replaced-token sets, the detection error, the easy-negative arm."""

from __future__ import annotations

import json

import pytest
import torch
from scipy import stats

import objreg
from objreg import IGNORE_INDEX
from objreg.experiments import _support
from objreg.experiments import hard_negatives as hn
from objreg.experiments.base import Setting
from objreg.experiments.cloze_reference import ClozeCounts
from objreg.plugins.objectives.rtd import sample_replacements
from objreg.testing import TINY_MODEL


@pytest.fixture(scope="module")
def setup(tokenizer, texts):
    registry = objreg.Registry.load(load_entrypoints=False)
    mlm = registry.get("mlm", vocab=tokenizer.vocab)
    rtd = registry.get("rtd", vocab=tokenizer.vocab)
    batch = rtd.corrupt(tokenizer.batch_from_texts(texts, seq_len=32), torch.Generator().manual_seed(0))
    corpus = objreg.Corpus("tiny", tuple(tuple(objreg.split_sentences(t)) for t in texts * 3))
    reference = ClozeCounts(objreg.TokenizedCorpus(tokenizer, corpus, 32))
    return registry, mlm, rtd, batch, reference


def test_held_out_sets_replace_exactly_the_selected_positions_never_by_the_original(setup, tokenizer):
    _, _, _, batch, reference = setup
    sets, accuracy = hn.replaced_sets(reference, batch, tokenizer.vocab, torch.Generator().manual_seed(1))
    selected = batch.labels != IGNORE_INDEX
    clean = torch.where(selected, batch.labels, batch.input_ids)
    special = tokenizer.vocab.special_id_tensor()
    # The reference counted these very texts: it predicts the original far more often than the unigram.
    assert 0.5 < accuracy["reference"] <= 1.0 and accuracy["unigram"] < 0.2
    for replaced, is_replaced in sets.values():
        assert torch.equal(is_replaced, selected)  # every selected position changed, nothing else
        assert torch.equal(replaced[~selected], clean[~selected])
        assert not torch.isin(replaced[selected], special).any()
    assert not torch.equal(sets["plausible"][0], sets["random"][0])


def test_random_replacements_are_uniform_over_the_other_ordinary_tokens(setup, tokenizer):
    _, _, _, batch, reference = setup
    ordinary = tokenizer.vocab.normal_token_weights() > 0
    n = int(ordinary.sum())
    counts = torch.zeros(tokenizer.vocab.size, dtype=torch.float64)
    expected = torch.zeros(tokenizer.vocab.size, dtype=torch.float64)
    selected = batch.labels != IGNORE_INDEX
    originals = torch.bincount(batch.labels[selected], minlength=tokenizer.vocab.size).double()
    for seed in range(200):
        sets, _ = hn.replaced_sets(reference, batch, tokenizer.vocab, torch.Generator().manual_seed(seed))
        replaced, is_replaced = sets["random"]
        counts += torch.bincount(replaced[is_replaced], minlength=tokenizer.vocab.size)
        # Each position draws uniformly from the n - 1 ordinary tokens other than its original.
        expected += torch.where(ordinary, (int(selected.sum()) - originals) / (n - 1), 0.0)
    assert counts[~ordinary].sum() == 0
    assert stats.chisquare(counts[ordinary].numpy(), expected[ordinary].numpy()).pvalue > 1e-3


def test_detection_error_against_a_loop(setup, tokenizer):
    registry, _, rtd, batch, reference = setup
    sets, _ = hn.replaced_sets(reference, batch, tokenizer.vocab, torch.Generator().manual_seed(1))
    model = _support.mlm_model(registry, rtd, 0, dict(TINY_MODEL)).eval()
    replaced, is_replaced = sets["plausible"]
    rates = hn.detection_error(model, rtd, batch, replaced, is_replaced)
    with torch.no_grad():
        scores = model.heads["discriminator"](model.encode(replaced, rtd.attention_mask(batch), batch.position_ids))
    misses = hits = alarms = quiet = 0
    for b in range(replaced.shape[0]):
        for t in range(replaced.shape[1]):
            if batch.is_padding[b, t]:
                continue
            says = float(scores[b, t, 0]) > 0
            if is_replaced[b, t]:
                misses, hits = misses + (not says), hits + says
            else:
                alarms, quiet = alarms + says, quiet + (not says)
    assert rates["miss_rate"] == pytest.approx(misses / (misses + hits))
    assert rates["false_alarm_rate"] == pytest.approx(alarms / (alarms + quiet))
    assert rates["balanced_error"] == pytest.approx(0.5 * (rates["miss_rate"] + rates["false_alarm_rate"]))
    real = ~batch.is_padding
    positives, negatives = scores[..., 0][real & is_replaced].tolist(), scores[..., 0][real & ~is_replaced].tolist()
    above = sum((n > p) + 0.5 * (n == p) for p in positives for n in negatives)
    assert rates["ranking_error"] == pytest.approx(above / (len(positives) * len(negatives)))


def test_auc_counts_ties_as_half():
    assert hn.auc(torch.tensor([0.1, 0.4, 0.35, 0.8]), torch.tensor([False, False, True, True])) == 0.75
    assert hn.auc(torch.tensor([1.0, 1.0, 1.0]), torch.tensor([True, False, False])) == 0.5
    with pytest.raises(ValueError, match="both"):
        hn.auc(torch.tensor([1.0, 2.0]), torch.tensor([True, True]))


def test_the_easy_arm_samples_nearly_uniformly(setup, tokenizer):
    registry = setup[0]
    easy = registry.get("rtd", vocab=tokenizer.vocab, **hn.ARMS["random"])
    V = tokenizer.vocab.size
    logits = 5.0 * torch.randn(1, 20_000, V, generator=torch.Generator().manual_seed(0))  # a confident generator
    noise = torch.rand(1, 20_000, generator=torch.Generator().manual_seed(1))
    targets = torch.zeros(1, 20_000, dtype=torch.long)
    counts = torch.bincount(sample_replacements(logits, targets, noise, easy.params, tokenizer.vocab).flatten(),
                            minlength=V)
    ordinary = tokenizer.vocab.normal_token_weights() > 0
    share = counts[ordinary].double() / (20_000 / int(ordinary.sum()))
    assert float(share.max()) < 2.0 and float(share.min()) > 0.2  # at temperature 1: a few tokens take everything
    confident = sample_replacements(logits, targets, noise, registry.get("rtd", vocab=tokenizer.vocab).params,
                                    tokenizer.vocab)
    assert float((confident == logits.masked_fill(~ordinary, -1e9).argmax(-1)).double().mean()) > 0.5


@pytest.mark.e2e
def test_tiny_run_is_reproducible(setup, tokenizer, texts, tmp_path):
    registry = setup[0]
    corpus = objreg.Corpus("tiny", tuple(tuple(objreg.split_sentences(t)) for t in texts * 6))
    train, heldout = corpus.split(heldout_every=3)
    text = _support.DefaultText(registry, objreg.TokenizedCorpus(tokenizer, train, 32),
                                objreg.TokenizedCorpus(tokenizer, heldout, 32))
    config = hn.Config(steps=6, seq_len=32, eval_rows=8, batch_size=4)
    result = hn._run(config, Setting(quick=True, seed=1, out_dir=tmp_path, device="cpu"), text, dict(TINY_MODEL))
    json.dumps(result.to_dict(), allow_nan=False)
    assert (tmp_path / "hard-negatives.png").stat().st_size > 1000
    errors = result.figures["ranking_error"]
    assert 0.0 <= result.figures["unigram_top1_accuracy"] <= result.figures["reference_top1_accuracy"] <= 1.0
    assert result.figures["effect"] == pytest.approx(errors["random"]["plausible"] - errors["generator"]["plausible"])
    assert all(0.0 <= errors[arm][name] <= 1.0 for arm in hn.ARMS for name in hn.SETS)
    again = hn._run(config, Setting(quick=True, seed=1, device="cpu"), text, dict(TINY_MODEL))
    assert again.figures == result.figures
