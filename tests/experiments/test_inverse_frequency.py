"""inverse-frequency: the Zipfian corpus, the per-rank tallies, flatness statistics, the verdict."""

from __future__ import annotations

import json
import math
from collections import Counter

import numpy as np
import pytest
import torch
from scipy import stats

import objreg
from objreg import IGNORE_INDEX
from objreg.experiments import inverse_frequency
from objreg.experiments.base import Setting

SMALL = inverse_frequency.Config(types=40, corpus_rows=300, seq_len=34, batch_rows=16, draws=40, resamples=100)


def test_zipf_corpus_rows_and_counts():
    corpus, vocab = inverse_frequency.zipf_corpus(SMALL, torch.Generator().manual_seed(0))
    ids = corpus.input_ids
    assert ids.shape == (300, 34)
    assert (ids[:, 0] == vocab.cls_id).all() and (ids[:, -1] == vocab.sep_id).all()
    words = ids[:, 1:-1]
    assert words.min() >= inverse_frequency.SPECIAL and words.max() < vocab.size
    expected = Counter(words.flatten().tolist())
    assert all(int(vocab.token_counts[i]) == n for i, n in expected.items())
    assert int(vocab.token_counts.sum()) == words.numel()
    # Rank 1 is the most frequent: about twice rank 2, ten times rank 10 (p ∝ 1/r).
    counts = vocab.token_counts[inverse_frequency.SPECIAL:].double()
    assert 1.6 < counts[0] / counts[1] < 2.5 and 6 < counts[0] / counts[9] < 15
    again, _ = inverse_frequency.zipf_corpus(SMALL, torch.Generator().manual_seed(0))
    assert torch.equal(again.input_ids, ids)


def test_rank_bins_cover_every_rank_once():
    for types in (1, 5, 40, 1000):
        bins = inverse_frequency.rank_bins(types)
        covered = [r for lo, hi in bins for r in range(lo, hi)]
        assert covered == list(range(1, types + 1))
        assert all(hi - lo == lo for lo, hi in bins[:-1])  # [2^k, 2^(k+1))


def test_masked_counts_tally_the_objectives_selection():
    corpus, vocab = inverse_frequency.zipf_corpus(SMALL, torch.Generator().manual_seed(1))
    objective = objreg.Registry.load(load_entrypoints=False).get("mlm", vocab=vocab, masking_policy="inverse_frequency")
    config = inverse_frequency.Config(**{**SMALL.__dict__, "draws": 3})
    counts = inverse_frequency.masked_counts(objective, corpus, config, torch.Generator().manual_seed(2))
    # The same draws by hand: rows, then the corruption, from one generator in the same order.
    g = torch.Generator().manual_seed(2)
    for d in range(3):
        rows = torch.randint(300, (16,), generator=g)
        batch = objreg.TokenBatch(*(t[rows] if t is not None else None for t in corpus))
        labels = objective.corrupt(batch, g).labels
        masked = Counter((labels[labels != IGNORE_INDEX] - inverse_frequency.SPECIAL).tolist())
        assert counts[d].tolist() == [masked.get(r, 0) for r in range(40)]


def test_flatness_statistics_against_numpy_and_scipy():
    bins = inverse_frequency.rank_bins(40)
    widths = np.array([hi - lo for lo, hi in bins])
    flat = inverse_frequency.flatness(widths * 100.0, bins, 40)
    assert flat["slope"] == pytest.approx(0, abs=1e-9) and flat["chi2"] == pytest.approx(0) and flat["p_value"] == 1
    # Masked counts ∝ 1/rank per type (uniform masking of a Zipf corpus), summed per bin by a loop.
    per_type = 1000.0 / np.arange(1, 41)
    bin_counts = np.array([sum(per_type[r - 1] for r in range(lo, hi)) for lo, hi in bins])
    zipf = inverse_frequency.flatness(bin_counts, bins, 40)
    rate = bin_counts / bin_counts.sum() * 40 / widths
    centres = np.array([math.exp(np.log(np.arange(lo, hi)).mean()) for lo, hi in bins])
    slope = np.linalg.lstsq(np.stack([np.log(centres), np.ones(len(bins))], 1), np.log(rate), rcond=None)[0][0]
    assert zipf["slope"] == pytest.approx(slope) and -1.1 < slope < -0.9
    expected = bin_counts.sum() * widths / 40
    chi2, p = stats.chisquare(bin_counts, expected)
    assert zipf["chi2"] == pytest.approx(chi2) and zipf["p_value"] == pytest.approx(p)


@pytest.mark.parametrize(("ci", "verdict"), [([-0.05, 0.03], "confirmed"), ([0.2, 0.3], "refuted"),
                                             ([-0.15, -0.05], "inconclusive")])
def test_verdict_from_the_slope_interval(ci, verdict):
    policy = {"slope": sum(ci) / 2, "slope_ci95": ci, "max_bin_deviation": 0.1, "chi2": 30.0, "dof": 9,
              "p_value": 0.001}
    figures = {"inverse_frequency": policy, "uniform": {**policy, "slope": -1.0}}
    assert inverse_frequency.decide(figures)[0] == verdict


def test_small_run_is_flat_under_the_policy_and_zipfian_without_it(tmp_path):
    config = inverse_frequency.Config(**{**SMALL.__dict__, "draws": 200})
    result = inverse_frequency._run(config, Setting(quick=True, seed=5, out_dir=tmp_path))
    flat, zipf = result.figures["inverse_frequency"], result.figures["uniform"]
    assert abs(flat["slope"]) < 0.1 and -1.1 < zipf["slope"] < -0.85
    assert result.verdict == "confirmed"
    json.dumps(result.to_dict(), allow_nan=False)
    assert (tmp_path / "inverse-frequency.png").stat().st_size > 1000
    again = inverse_frequency._run(config, Setting(quick=True, seed=5))
    assert again.figures == result.figures
