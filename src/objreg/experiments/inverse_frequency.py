"""Inverse-frequency masking: masking ∝ 1/p(token) flattens the masking rate across frequency ranks.

**Claim.** On a Zipfian corpus, masking each token with probability proportional to ``1/p(token)``
makes every token *type* equally likely to be the one masked: the distribution of the masked
tokens over frequency ranks is flat, where uniform masking reproduces the corpus's Zipf law.
Source: frequency-aware masking for rare words (e.g. "Frequency-aware masking", and the token
frequency weighting discussed by Levine et al. 2021, PMI-Masking), as stated in issue 9 and in
``objreg.toolkit.selection``'s ``inverse_frequency`` policy.

**Setting.** A seeded synthetic corpus: 4,000 rows ``[CLS] x₁ … x₁₂₆ [SEP]`` whose words are
drawn i.i.d. from a Zipf law ``p(r) ∝ 1/r`` over 1,000 types (ids 5…1004, rank 1 the most
frequent); the vocabulary's ``token_counts`` are the corpus's own counts (what
``TokenizedCorpus`` gives the policy). Each draw samples 64 rows and corrupts them with the
``mlm`` objective itself (``mask_prob`` 0.15), ``masking_policy=inverse_frequency`` and
``uniform``. Quick: 200 draws; full: 2,000.

**Measured.** Per rank ``r``, the *relative masking rate* ``V · m_r / Σ m``, ``m_r`` the number of
masked tokens of type ``r`` (1 everywhere means flat). The ranks are pooled into logarithmic bins
(1, 2–3, 4–7, …), and two statistics are computed from the binned counts:

* a χ² test of flatness (expected count of a bin ∝ its number of types, ``bins − 1`` degrees of
  freedom), which tests *exact* flatness: with millions of masked tokens it detects deviations of
  a few percent;
* the slope of ``log(rate)`` against ``log(rank)`` over the bins (least squares on the bins'
  geometric-mean ranks), with a 95% bootstrap interval over draws. Uniform masking gives the
  Zipf exponent's ``-1``; flat gives 0.

**Verdict.** From the slope's interval with an equivalence margin of ±0.1 (a tenth of the Zipf
slope that uniform masking shows): ``confirmed`` when the whole interval lies inside,
``refuted`` when it lies wholly outside, ``inconclusive`` otherwise. The χ² p-value and the
largest bin deviation are reported beside it and named in the reason, since the policy's per-row
budget (``min(1, c·w)``, ``c`` per row) makes exact flatness impossible at the rarest ranks.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

import numpy as np
import torch
from scipy import stats

from objreg import IGNORE_INDEX, Registry, TokenBatch, Vocabulary
from objreg.analysis.stats import percentile_interval
from objreg.experiments import _support
from objreg.experiments.base import ExperimentResult, Setting, save_figure

NAME = "inverse-frequency"
CLAIM = "Masking with probability proportional to 1/p(token) makes the masking rate flat across frequency ranks."
#: Equivalence margin on the log-log slope (uniform masking shows the Zipf exponent, -1).
TOLERANCE = 0.1
SPECIAL = 5  # [PAD] [UNK] [CLS] [SEP] [MASK]
POLICIES = ("inverse_frequency", "uniform")


@dataclass(frozen=True)
class Config:
    """Sizes of the experiment."""

    types: int = 1000
    exponent: float = 1.0
    corpus_rows: int = 4000
    seq_len: int = 128
    batch_rows: int = 64
    draws: int = 200
    mask_prob: float = 0.15
    resamples: int = 1000


QUICK = Config(draws=200)
FULL = Config(draws=2000)


def run(setting: Setting) -> ExperimentResult:
    return _run(QUICK if setting.quick else FULL, setting)


def _run(config: Config, setting: Setting) -> ExperimentResult:
    setting.status(f"drawing a Zipfian corpus of {config.corpus_rows} rows over {config.types} types")
    corpus, vocab = zipf_corpus(config, torch.Generator().manual_seed(setting.seed * 7919 + 5))
    registry = Registry.load()
    setting.status(f"corrupting {config.draws} batches with each policy")
    counts = {}
    for k, policy in enumerate(POLICIES):
        objective = registry.get("mlm", vocab=vocab, mask_prob=config.mask_prob, masking_policy=policy)
        counts[policy] = masked_counts(objective, corpus, config, torch.Generator().manual_seed(setting.seed * 31 + k))
    setting.status("testing flatness")
    figures = measure(counts, config, setting.seed)
    figures["corpus"] = {"tokens": int((~corpus.is_special).sum()), "types_seen": int((vocab.token_counts > 0).sum())}
    verdict, reason = decide(figures)
    plots = [_plot(counts, figures, setting)] if setting.out_dir is not None else []
    return ExperimentResult(NAME, CLAIM, verdict, reason, figures,
                            {**asdict(config), "seed": setting.seed, "quick": setting.quick}, plots)


def zipf_corpus(config: Config, generator: torch.Generator) -> tuple[TokenBatch, Vocabulary]:
    """``corpus_rows`` rows of one-token words drawn from ``p(r) ∝ r^-exponent`` (id ``SPECIAL + r - 1``
    for rank ``r``), each row its own document, and a vocabulary carrying the corpus's token counts."""
    ranks = torch.arange(1, config.types + 1, dtype=torch.float64)
    p = ranks ** -config.exponent
    N, T = config.corpus_rows, config.seq_len
    words = torch.multinomial(p / p.sum(), N * (T - 2), replacement=True, generator=generator).view(N, T - 2)
    vocab = Vocabulary(size=SPECIAL + config.types, pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4,
                       special_ids=tuple(range(SPECIAL)))
    ids = torch.cat([torch.full((N, 1), vocab.cls_id), SPECIAL + words, torch.full((N, 1), vocab.sep_id)], dim=1)
    special = torch.zeros(N, T, dtype=torch.bool)
    special[:, 0] = special[:, -1] = True
    batch = TokenBatch(
        input_ids=ids, is_padding=torch.zeros(N, T, dtype=torch.bool), is_special=special,
        word_ids=torch.where(special, -1, torch.arange(T).expand(N, T)), sentence_ids=torch.where(special, -1, 0),
        document_ids=torch.arange(N)[:, None].expand(N, T).clone(),
    )
    counts = torch.bincount(ids[~special], minlength=vocab.size)
    return batch, replace(vocab, token_counts=counts)


def masked_counts(objective, corpus: TokenBatch, config: Config, generator: torch.Generator) -> np.ndarray:
    """``[draws, types]``: per draw of ``batch_rows`` corpus rows corrupted by ``objective``, how
    many tokens of each rank were masked."""
    out = np.zeros((config.draws, config.types))
    for d in range(config.draws):
        rows = torch.randint(corpus.input_ids.shape[0], (config.batch_rows,), generator=generator)
        batch = TokenBatch(*(t[rows] if t is not None else None for t in corpus))
        selected = objective.corrupt(batch, generator).labels != IGNORE_INDEX
        out[d] = torch.bincount(batch.input_ids[selected] - SPECIAL, minlength=config.types).numpy()
    return out


def rank_bins(types: int) -> list[tuple[int, int]]:
    """Logarithmic rank bins ``[2^k, 2^(k+1))`` (1-based ranks), the last one cut at ``types``."""
    bins, low = [], 1
    while low <= types:
        bins.append((low, min(2 * low, types + 1)))
        low *= 2
    return bins


def binned(counts: np.ndarray, bins: list[tuple[int, int]]) -> np.ndarray:
    """Masked counts summed per rank bin: ``[..., types]`` to ``[..., bins]``."""
    return np.stack([counts[..., lo - 1:hi - 1].sum(axis=-1) for lo, hi in bins], axis=-1)


def flatness(bin_counts: np.ndarray, bins: list[tuple[int, int]], types: int) -> dict:
    """Relative rate per bin (``V · share / types in the bin``), the log-log slope over the bins,
    and the χ² test of flatness."""
    widths = np.array([hi - lo for lo, hi in bins], dtype=np.float64)
    centres = np.array([math.exp(np.mean(np.log(np.arange(lo, hi)))) for lo, hi in bins])
    total = bin_counts.sum()
    rate = bin_counts / total * types / widths
    slope = np.polyfit(np.log(centres), np.log(np.maximum(rate, 1e-12)), 1)[0]
    expected = total * widths / types
    chi2 = float(((bin_counts - expected) ** 2 / expected).sum())
    return {"rate": rate, "slope": float(slope), "chi2": chi2, "dof": len(bins) - 1,
            "p_value": float(stats.chi2.sf(chi2, len(bins) - 1)), "centres": centres}


def slope_replicates(counts: np.ndarray, bins: list[tuple[int, int]], types: int, resamples: int,
                     rng: np.random.Generator) -> np.ndarray:
    """Bootstrap over draws: the slope of each resample."""
    per_draw = binned(counts, bins)  # (D, bins)
    D = len(per_draw)
    index = rng.integers(0, D, size=(resamples, D))
    return np.array([flatness(per_draw[i].sum(axis=0), bins, types)["slope"] for i in index])


def measure(counts: dict[str, np.ndarray], config: Config, seed: int) -> dict:
    """Per policy: the binned relative rates, the slope with its interval, χ², its p-value."""
    bins = rank_bins(config.types)
    figures: dict = {"bins": [[lo, hi - 1] for lo, hi in bins]}
    for k, policy in enumerate(POLICIES):
        total = counts[policy].sum(axis=0)
        result = flatness(binned(total, bins), bins, config.types)
        replicates = slope_replicates(counts[policy], bins, config.types, config.resamples,
                                      np.random.default_rng([seed, 11, k]))
        figures[policy] = {
            "relative_rate_per_bin": [_support.finite(r) for r in result["rate"]],
            "slope": result["slope"], "slope_ci95": list(percentile_interval(replicates)),
            "chi2": result["chi2"], "dof": result["dof"], "p_value": result["p_value"],
            "max_bin_deviation": _support.finite(np.abs(result["rate"] - 1).max()),
            "masked_tokens": int(total.sum()), "types_never_masked": int((total == 0).sum()),
        }
    return figures


def decide(figures: dict) -> tuple[str, str]:
    flat, zipf = figures["inverse_frequency"], figures["uniform"]
    low, high = flat["slope_ci95"]
    verdict = _support.equivalence_verdict(low, high, -TOLERANCE, TOLERANCE)
    reason = (
        f"log-rate vs log-rank slope {flat['slope']:+.3f} [{low:+.3f}, {high:+.3f}] under inverse_frequency "
        f"(margin ±{TOLERANCE}) vs {zipf['slope']:+.3f} under uniform; largest bin deviation from flat "
        f"{flat['max_bin_deviation']:.1%}; chi2 {flat['chi2']:.1f} on {flat['dof']} dof, p = {flat['p_value']:.3g} "
        f"({'exact flatness rejected' if flat['p_value'] < 0.01 else 'exact flatness not rejected'})"
    )
    return verdict, reason


def _plot(counts: dict[str, np.ndarray], figures: dict, setting: Setting) -> str:
    """Relative masking rate per rank (points) and per logarithmic bin (lines), both policies."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 4))
    ax = figure.add_subplot()
    bins = [(lo, hi + 1) for lo, hi in figures["bins"]]
    centres = [math.exp(np.mean(np.log(np.arange(lo, hi)))) for lo, hi in bins]
    for policy, color in (("uniform", "tab:blue"), ("inverse_frequency", "tab:red")):
        total = counts[policy].sum(axis=0)
        types = len(total)
        ranks = np.arange(1, types + 1)
        shown = total > 0
        ax.scatter(ranks[shown], (total / total.sum() * types)[shown], s=2, alpha=0.25, color=color)
        f = figures[policy]
        ax.plot(centres, f["relative_rate_per_bin"], "o-", color=color,
                label=f"{policy} (slope {f['slope']:+.2f})")
    ax.axhline(1.0, color="black", linestyle=":", label="flat")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("frequency rank")
    ax.set_ylabel("relative masking rate (V x share of masked tokens)")
    ax.set_title("Masked tokens across frequency ranks (Zipfian corpus)")
    ax.legend(fontsize=8)
    figure.tight_layout()
    return save_figure(figure, setting.out_dir / f"{NAME}.png")
