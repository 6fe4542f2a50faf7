"""char-noise-robustness: fragmentation, the nearest-original share, a tiny run."""

from __future__ import annotations

import json

import pytest
import torch

import objreg
from objreg.experiments import _support
from objreg.experiments import char_noise_robustness as cn
from objreg.experiments.base import Setting
from objreg.testing import TINY_MODEL


def test_tokens_per_word_counts_ordinary_tokens(tokenizer, texts):
    words = sum(len(t.split()) for t in texts)
    tokens = sum(len(tokenizer.batch_from_texts([t]).input_ids[0]) - 2 for t in texts)  # minus [CLS], [SEP]
    assert cn.tokens_per_word(tokenizer, texts) == pytest.approx(tokens / words)


def test_misspelling_fragments_words(tokenizer, texts):
    noisy = cn.char_noise(texts, cn.NOISE, torch.Generator().manual_seed(0))
    assert noisy != texts
    assert cn.tokens_per_word(tokenizer, noisy) > cn.tokens_per_word(tokenizer, texts)


def test_nearest_is_original_against_a_loop():
    g = torch.Generator().manual_seed(0)
    clean = torch.randn(40, 8, generator=g, dtype=torch.float64) + 5.0  # a shared offset, as pooled features have
    assert cn.nearest_is_original(clean, clean) == 1.0
    noisy = clean + 0.8 * torch.randn(40, 8, generator=g, dtype=torch.float64)
    center = clean.mean(dim=0)
    hits = 0
    for i in range(40):
        cosines = [float(torch.nn.functional.cosine_similarity(noisy[i] - center, clean[j] - center, dim=0))
                   for j in range(40)]
        hits += max(range(40), key=cosines.__getitem__) == i
    assert cn.nearest_is_original(clean, noisy) == pytest.approx(hits / 40)
    assert cn.nearest_is_original(clean, clean[torch.randperm(40, generator=g)]) < 0.2


@pytest.mark.e2e
def test_tiny_run_is_reproducible(tokenizer, texts, tmp_path):
    registry = objreg.Registry.load(load_entrypoints=False)
    corpus = objreg.Corpus("tiny", tuple(tuple(objreg.split_sentences(t)) for t in texts * 6))
    train, heldout = corpus.split(heldout_every=3)
    text = _support.DefaultText(registry, objreg.TokenizedCorpus(tokenizer, train, 32),
                                objreg.TokenizedCorpus(tokenizer, heldout, 32))
    data = (texts * 5, torch.tensor([i % 2 for i in range(30)]))
    config = cn.Config(steps=6, seq_len=32, batch_size=4, probe_seq_len=40, finetune_epochs=1)
    result = cn._run(config, Setting(quick=True, seed=1, out_dir=tmp_path, device="cpu"), text, dict(TINY_MODEL),
                     data)
    json.dumps(result.to_dict(), allow_nan=False)
    assert (tmp_path / "char-noise-robustness.png").stat().st_size > 1000
    figures = result.figures
    for arm in cn.ARMS:
        assert figures["drop"][arm] == pytest.approx(figures["accuracy"][arm]["clean"]
                                                     - figures["accuracy"][arm]["misspelled"])
    assert figures["effect"] == pytest.approx(figures["drop"]["clean"] - figures["drop"]["char_noise"])
    assert all(set(figures["probe_accuracy"][arm]) == {"clean", "misspelled"} for arm in cn.ARMS)
    assert cn.PRECONDITIONS[0].measure(figures, None) == min(figures["accuracy"][arm]["clean"] for arm in cn.ARMS)
    # The two arms trained on different text: their training losses differ.
    assert figures["training_loss"]["clean"] != figures["training_loss"]["char_noise"]
    again = cn._run(config, Setting(quick=True, seed=1, device="cpu"), text, dict(TINY_MODEL), data)
    assert again.figures == figures


def test_the_full_setting_is_minilm_continued_pre_training():
    assert cn.FULL.model == "minilm" and cn.TOY.model == "default"
    assert (cn.FULL.lr, cn.FULL.finetune_lr) == (1e-4, 1e-4)  # tapt's rates for a pre-trained model


@pytest.mark.e2e
def test_tiny_continued_pre_training_of_a_hugging_face_encoder(tiny_bert, hf_text, texts):
    # The MiniLM setting's path on a 2-layer BERT with MiniLM's tokenizer: both arms start from the
    # same saved weights, and the result names the setting.
    data = (texts * 5, torch.tensor([i % 2 for i in range(30)]))
    config = cn.Config(steps=3, seq_len=32, batch_size=4, lr=1e-4, probe_seq_len=40, finetune_epochs=1,
                       finetune_lr=1e-4, model="minilm")
    result = cn._run(config, Setting(quick=True, seed=0, device="cpu"), hf_text, None, data, str(tiny_bert))
    json.dumps(result.to_dict(), allow_nan=False)
    assert result.setting["model"].startswith("all-MiniLM-L6-v2") and result.setting["lr"] == 1e-4
    figures = result.figures
    assert figures["training_loss"]["clean"]["steps"] == 3
    assert figures["training_loss"]["clean"] != figures["training_loss"]["char_noise"]
    # WordPiece fragments misspelled words too.
    assert figures["tokens_per_word"]["misspelled"] > figures["tokens_per_word"]["clean"]
    assert cn.seed_verdict(figures) == (result.verdict, result.reason)
