"""nsp-vs-sop: the probe statistics against loops, the verdict rule, and a tiny run."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch

import objreg
from objreg.experiments import _support
from objreg.experiments import nsp_vs_sop as ns
from objreg.experiments.base import ExperimentResult, Setting
from objreg.toolkit.cache import cache_dir
from objreg.toolkit.tokenizer import TokenizedCorpus

TINY_MODEL = {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "intermediate_size": 32}


def test_balanced_accuracy_is_the_mean_recall_and_resamples_rows_whole():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, size=(3, 20))
    correct = rng.random((3, 20)) < 0.7
    recalls = [np.mean([c for c, lab in zip(correct.ravel(), labels.ravel()) if lab == k]) for k in (0, 1)]
    assert ns.balanced_accuracy(correct, labels) == pytest.approx(np.mean(recalls))
    identity = np.arange(20)[None, :]
    assert ns.balanced_accuracy(correct, labels, identity)[0] == pytest.approx(np.mean(recalls))
    # A resample that takes row 4 twice counts all three of its draws twice.
    labels[:, 4], labels[:, 7] = [0, 1, 0], [1, 1, 0]
    picked = np.array([[4, 4, 7]])
    c, lab = correct[:, [4, 4, 7]].ravel(), labels[:, [4, 4, 7]].ravel()
    expected = np.mean([c[lab == k].mean() for k in (0, 1)])
    assert ns.balanced_accuracy(correct, labels, picked)[0] == pytest.approx(expected)
    # A predictor that ignores its input sits at 0.5 whatever the label shares.
    skewed = np.array([[0, 0, 0, 1]])
    assert ns.balanced_accuracy(skewed == 0, skewed) == 0.5


def test_auc_counts_pairs_with_ties_as_half():
    rng = np.random.default_rng(1)
    scores = rng.integers(0, 5, size=30).astype(float)  # many ties
    labels = rng.integers(0, 2, size=30)
    pos, neg = scores[labels == 0], scores[labels == 1]
    pairs = [1.0 if p > n else 0.5 if p == n else 0.0 for p, n in itertools.product(pos, neg)]
    assert float(ns.auc(scores, labels)) == pytest.approx(np.mean(pairs))


def test_segment_overlap_matches_sets_read_between_the_separators(tokenizer, texts):
    registry = objreg.Registry.load(load_entrypoints=False)
    nsp = registry.get("nsp", vocab=tokenizer.vocab)
    rows = tokenizer.batch_from_texts(texts, 48)
    batch = nsp.corrupt(rows, torch.Generator().manual_seed(0))
    overlap = ns.segment_overlap(batch, tokenizer.vocab)
    v = tokenizer.vocab
    for b, ids in enumerate(batch.input_ids.tolist()):
        seps = [i for i, t in enumerate(ids) if t == v.sep_id]
        first, second = set(ids[1:seps[0]]), set(ids[seps[0] + 1:seps[1]])
        assert overlap[b] == pytest.approx(len(first & second) / len(first | second))


def _parts(topic, nsp_own, nsp_order, difference, sop_on_nsp=(0.6, 0.7)):
    keys = ("topic_auc_on_nsp", "nsp_model_on_nsp", "nsp_model_on_order", "sop_minus_nsp_on_order",
            "sop_model_on_nsp")
    return {k: {"value": sum(v) / 2, "ci95": list(v)} for k, v in zip(keys, (topic, nsp_own, nsp_order, difference,
                                                                            sop_on_nsp))}


@pytest.mark.parametrize(("topic", "nsp_own", "nsp_order", "difference", "sop_on_nsp", "expected"), [
    ((0.7, 0.8), (0.6, 0.7), (0.47, 0.53), (0.05, 0.2), (0.6, 0.7), "confirmed"),
    # Whether NSP learned NSP is the precondition (test_the_nsp_learned_precondition), not a check.
    ((0.7, 0.8), (0.45, 0.55), (0.47, 0.53), (0.05, 0.2), (0.6, 0.7), "confirmed"),
    ((0.7, 0.8), (0.6, 0.7), (0.42, 0.53), (0.05, 0.2), (0.6, 0.7), "inconclusive"),  # not clearly within the band
    ((0.7, 0.8), (0.6, 0.7), (0.6, 0.7), (0.05, 0.2), (0.6, 0.7), "refuted"),  # NSP learned order
    ((0.7, 0.8), (0.6, 0.7), (0.47, 0.53), (-0.2, -0.05), (0.6, 0.7), "refuted"),  # SOP worse on order
    ((0.4, 0.48), (0.6, 0.7), (0.47, 0.53), (0.05, 0.2), (0.6, 0.7), "refuted"),  # topic says nothing
    ((0.7, 0.8), (0.6, 0.7), (0.47, 0.53), (0.05, 0.2), (0.40, 0.48), "refuted"),  # SOP model fails NSP
    ((0.7, 0.8), (0.6, 0.7), (0.47, 0.53), (0.05, 0.2), (0.48, 0.6), "inconclusive"),
    # Above 0.5 but inside the chance band is not doing well on NSP: the bar is the NSP model's own (0.55).
    ((0.7, 0.8), (0.6, 0.7), (0.47, 0.53), (0.05, 0.2), (0.51, 0.54), "refuted"),
    ((0.7, 0.8), (0.6, 0.7), (0.47, 0.53), (0.05, 0.2), (0.52, 0.58), "inconclusive"),
])
def test_verdict_rule(topic, nsp_own, nsp_order, difference, sop_on_nsp, expected):
    parts = _parts(topic, nsp_own, nsp_order, difference, sop_on_nsp)
    checks = ns.checks_of({k: v["ci95"] for k, v in parts.items()})
    verdict, reason = ns.decide(checks, parts, "test")
    assert verdict == expected
    assert "chance band 0.5 +- 0.05" in reason


def test_combine_reads_between_seed_intervals():
    def seed(values):
        return ExperimentResult(ns.NAME, ns.CLAIM, "inconclusive", "r",
                                {"effect": values[3], "parts": dict(zip(_parts(*[(0, 0)] * 4), values))})

    agreeing = [seed((0.72, 0.62, 0.50, 0.15, 0.61)), seed((0.74, 0.64, 0.51, 0.12, 0.63)),
                seed((0.73, 0.60, 0.49, 0.14, 0.62))]
    result = ns.combine(agreeing, Setting(seed=0))
    assert result.verdict == "confirmed", result.reason
    assert result.figures["parts"]["sop_minus_nsp_on_order"]["value"] == pytest.approx(0.41 / 3)
    scattered = [seed((0.72, 0.62, 0.50, 0.15, 0.61)), seed((0.74, 0.64, 0.51, -0.1, 0.63)),
                 seed((0.73, 0.60, 0.49, 0.14, 0.62))]
    assert ns.combine(scattered, Setting(seed=0)).verdict == "inconclusive"


def test_the_nsp_learned_precondition_decides_before_the_checks():
    from objreg.experiments.replication import conclude

    def seed(values):
        return ExperimentResult(ns.NAME, ns.CLAIM, "confirmed", "r",
                                {"effect": values[3], "parts": dict(zip(_parts(*[(0, 0)] * 4), values))},
                                {"seed": 0})

    # Every check holds; the NSP model is above 0.5 on NSP pairs on every seed but below 0.55 on one.
    seeds = [seed((0.72, 0.62, 0.50, 0.15, 0.61)), seed((0.74, 0.54, 0.51, 0.12, 0.63)),
             seed((0.73, 0.60, 0.49, 0.14, 0.62))]
    result = conclude(ns, seeds, Setting(seed=0))
    [check] = result.preconditions
    assert (check["name"], check["threshold"], check["passed"], check["seeds_holding"]) == ("nsp_learned", 0.55,
                                                                                           False, 2)
    assert result.verdict == "inconclusive" and result.reason.startswith("precondition failed: nsp_learned")
    assert "would read confirmed" in result.reason
    seeds[1].figures["parts"]["nsp_model_on_nsp"] = 0.58
    for s in seeds:
        s.preconditions, s.verdict = [], "confirmed"
    assert conclude(ns, seeds, Setting(seed=0)).verdict == "confirmed"


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory, texts):
    # 20 documents (two held out by the corpus split, each with three sentences or more).
    path = tmp_path_factory.mktemp("nsp") / "corpus.txt"
    path.write_text("\n\n".join(f"{texts[i % len(texts)]} Note {i} ends here." for i in range(20)))
    return path


def test_a_tiny_run_is_deterministic(corpus_file, tmp_path):
    registry = objreg.Registry.load(load_entrypoints=False)
    corpus = registry.load_corpus(str(corpus_file), cache_dir())
    tokenizer = registry.load_tokenizer("default", corpus, cache_dir())
    rows = TokenizedCorpus(tokenizer, corpus, 40)
    text = _support.DefaultText(registry, rows, rows)
    config = ns.Config(steps=3, batch_size=4, seq_len=40, probe_draws=2, resamples=200)
    setting = Setting(quick=True, seed=0, out_dir=tmp_path, device="cpu")
    result = ns._run(config, setting, text=text, model_config=TINY_MODEL)
    json.dumps(result.to_dict(), allow_nan=False)
    figures = result.figures
    assert figures["probes"]["topic_mismatched"]["rows"] == len(rows.eligible(2))
    for probe in ns.PROBES:
        assert 0.0 <= figures["balanced_accuracy"]["nsp_model"][probe]["value"] <= 1.0
    assert figures["effect"] == figures["parts"]["sop_minus_nsp_on_order"]
    assert (tmp_path / "nsp-vs-sop.png").is_file()
    again = ns._run(config, Setting(quick=True, seed=0, device="cpu"), text=text, model_config=TINY_MODEL)
    assert again.figures == figures
