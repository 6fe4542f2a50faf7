"""Entropy masking: masking in proportion to surprisal raises the learning signal to (σ²+μ²)/μ.

**Claim.** If each token is masked with probability proportional to the model's surprisal ``s``
of it, the expected surprisal of a masked token (the learning signal a masked-LM step gets) is
the size-biased mean ``E[s²]/E[s] = (σ² + μ²)/μ`` instead of the uniform policy's ``μ``: a gain
of ``1 + σ²/μ²``. Source: the entropy/difficulty-based masking line of work (e.g. PMI-Masking,
Levine et al. 2021; "Learning Better Masking for Better Language Model Pre-training", Yang et al.
2023), as stated in issue 9; the closed form is the size-biased mean.

**Setting.** The default model is trained with ``mlm`` on the default corpus's training split
(quick: 40 AdamW steps of 16 rows; full: 400). Its surprisals
(:func:`objreg.toolkit.surprisal.token_surprisal`, 7 interleaved masked passes) are computed on
rows of the held-out split (quick: 64 rows of 128 tokens; full: 256). Those rows are then
corrupted by the ``mlm`` objective itself, ``masking_policy=entropy`` and ``uniform``, with
``mask_prob`` 0.15, over many seeded draws (quick: 200 each; full: 1,000).

**Measured.** The mean surprisal of the masked tokens, pooled over all draws, under each policy
and their ratio, with a 95% bootstrap interval over draws. Against it:

* the claim's closed form from the same surprisals, ``μ`` and ``σ²`` over all maskable tokens
  (``closed_form``);
* the exact expectation of the objective's own selection rule (``exact``), computed from its
  inclusion probabilities: ``mlm`` selects each token independently with ``π = min(1, c·s)``,
  ``c`` set **per row** so the row's expected count is ``0.15 n``, and forces one token
  (drawn ∝ ``s``) into a row where nothing was selected (BERT's ``max(1, ·)``). The expected
  masked-token mean is then ``Σ(π s + P₀ q s) / Σ(π + P₀ q)`` over all tokens, ``P₀`` the row's
  chance of selecting nothing and ``q = s/Σs`` the forced draw. Its gap to the closed form comes
  from the per-row budget (between-row variance of the surprisal does not raise the signal), the
  cap at 1 and the forced token;
* ``per_row_closed_form``: the closed form applied per row and averaged by row length, what the
  rule gives without caps and forcing.

**Verdict.** From the gain ``ratio − 1`` against the closed form's ``σ²/μ²``: the relative
deviation ``gain / (σ²/μ²) − 1`` with its bootstrap interval. ``confirmed`` when the whole
interval lies within ±10% (the closed form predicts the size of the gain to within a tenth),
``refuted`` when it lies wholly outside, ``inconclusive`` otherwise. The Monte Carlo mean is also
checked against ``exact`` (``z_vs_exact``, in bootstrap standard errors): that tests the
measurement, not the claim.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import torch

from objreg import IGNORE_INDEX, TokenBatch
from objreg.analysis.devices import resolve_device
from objreg.analysis.stats import percentile_interval
from objreg.experiments import _support
from objreg.experiments.base import ExperimentResult, Setting, save_figure
from objreg.toolkit.selection import inclusion_probabilities, maskable
from objreg.toolkit.surprisal import token_surprisal

NAME = "entropy-masking"
CLAIM = ("Masking with probability proportional to surprisal raises the mean surprisal of the masked tokens "
         "from mu to (sigma^2 + mu^2) / mu.")
#: Equivalence margin on the relative deviation of the measured gain from the closed form's.
TOLERANCE = 0.10


@dataclass(frozen=True)
class Config:
    """Sizes of the experiment."""

    train_steps: int
    batch_size: int
    rows: int
    draws: int
    seq_len: int = 128
    lr: float = 1e-3
    mask_prob: float = 0.15
    groups: int = 7
    resamples: int = 2000


QUICK = Config(train_steps=40, batch_size=16, rows=64, draws=200)
FULL = Config(train_steps=400, batch_size=16, rows=256, draws=1000)


def run(setting: Setting) -> ExperimentResult:
    return _run(QUICK if setting.quick else FULL, setting)


def _run(config: Config, setting: Setting, text: _support.DefaultText | None = None,
         model_config: dict | None = None) -> ExperimentResult:
    device = resolve_device(setting.device)
    setting.status("loading the default corpus")
    text = text or _support.default_text(config.seq_len)
    registry, vocab = text.registry, text.train.vocab
    mlm = registry.get("mlm", vocab=vocab, mask_prob=config.mask_prob)
    model = _support.mlm_model(registry, mlm, setting.seed, model_config).to(device)
    setting.status(f"training the default model with mlm for {config.train_steps} steps")
    losses = _support.train(model, mlm, text.train, steps=config.train_steps, batch_size=config.batch_size,
                            lr=config.lr, seed=setting.seed, device=device)
    setting.status(f"scoring the surprisal of {config.rows} held-out rows")
    batch = text.heldout.sample(config.rows, torch.Generator().manual_seed(setting.seed * 7919 + 3))
    surprisal = token_surprisal(model, batch.to(device), vocab, groups=config.groups).cpu()
    batch = batch._replace(surprisal=surprisal)

    setting.status(f"corrupting {config.draws} times with each policy")
    draws = {}
    for k, policy in enumerate(("uniform", "entropy")):
        objective = registry.get("mlm", vocab=vocab, mask_prob=config.mask_prob, masking_policy=policy)
        generator = torch.Generator().manual_seed(setting.seed * 31 + k)
        draws[policy] = masked_sums(objective, batch, config.draws, generator)
    figures = measure(batch, draws, config.mask_prob, config.resamples, setting.seed)
    figures["training_loss"] = _support.loss_summary(losses)
    verdict, reason = decide(figures)
    plots = []
    if setting.out_dir is not None:
        plots.append(_plot(batch, registry, vocab, config, setting, figures))
    return ExperimentResult(NAME, CLAIM, verdict, reason, figures,
                            {**asdict(config), "seed": setting.seed, "quick": setting.quick, "device": str(device),
                             "model": "default" if not model_config else model_config,
                             "surprisal": f"model after {config.train_steps} mlm steps"}, plots)


def masked_sums(objective, batch: TokenBatch, draws: int, generator: torch.Generator) -> np.ndarray:
    """``[draws, 2]``: per corruption of ``batch`` by ``objective``, the sum of the masked tokens'
    surprisal and their count."""
    out = np.zeros((draws, 2))
    s = batch.surprisal.double()
    for d in range(draws):
        selected = objective.corrupt(batch, generator).labels != IGNORE_INDEX
        out[d] = float(s[selected].sum()), float(selected.sum())
    return out


def closed_form(surprisal: torch.Tensor, can: torch.Tensor) -> dict[str, float]:
    """``μ``, ``σ²`` (population) of the maskable tokens' surprisal, the claim's ``(σ²+μ²)/μ`` and
    gain ``σ²/μ²``, and the closed form per row averaged by row length."""
    s = surprisal.double()
    values = s[can]
    mu, var = float(values.mean()), float(values.var(unbiased=False))
    n = can.sum(dim=1).double()
    s_row = torch.where(can, s, 0.0)
    rows = n > 0
    per_row = (s_row**2).sum(dim=1)[rows] / s_row.sum(dim=1)[rows].clamp(min=1e-300)
    return {"mu": mu, "sigma2": var, "closed_form": (var + mu**2) / mu, "closed_form_gain": var / mu**2,
            "per_row_closed_form": float((per_row * n[rows]).sum() / n[rows].sum())}


def expected_masked_mean(weights: torch.Tensor, can: torch.Tensor, surprisal: torch.Tensor, rate: float) -> float:
    """The exact expected mean surprisal of the tokens ``mlm`` selects (ratio of expectations over
    the whole batch) for selection weights ``weights``: inclusion ``min(1, c·w)`` per row, plus the
    forced token ∝ ``w`` in rows where nothing was selected."""
    w = torch.where(can, weights.double(), 0.0)
    w = torch.where(w.sum(dim=1, keepdim=True) > 0, w, can.double())  # all-zero rows fall back to uniform
    n = can.sum(dim=1, keepdim=True).double()
    pi = inclusion_probabilities(w, rate * n).double()
    pi = torch.where(can, pi, 0.0)
    none_selected = torch.exp(torch.log1p(-pi.clamp(max=1.0 - 1e-16)).sum(dim=1, keepdim=True))
    none_selected = torch.where((pi >= 1).any(dim=1, keepdim=True) | (n == 0), 0.0, none_selected)
    floored = torch.where(can, torch.maximum(w, 1e-6 * w.amax(dim=1, keepdim=True)), 0.0)
    forced = floored / floored.sum(dim=1, keepdim=True).clamp(min=1e-300)
    inclusion = pi + none_selected * forced
    s = surprisal.double()
    return float((inclusion * s).sum() / inclusion.sum())


def measure(batch: TokenBatch, draws: dict[str, np.ndarray], rate: float, resamples: int, seed: int) -> dict:
    """Every figure of the experiment from the scored batch and the draws of each policy."""
    can = maskable(batch)
    figures = {"maskable_tokens": int(can.sum()), "rows": int(batch.input_ids.shape[0]),
               **closed_form(batch.surprisal, can)}
    exact = {"uniform": expected_masked_mean(can.double(), can, batch.surprisal, rate),
             "entropy": expected_masked_mean(batch.surprisal, can, batch.surprisal, rate)}
    rng = np.random.default_rng([seed, 3])
    D = len(draws["uniform"])
    index = rng.integers(0, D, size=(resamples, D))
    means = {p: d[:, 0].sum() / d[:, 1].sum() for p, d in draws.items()}
    boot = {p: d[index, 0].sum(axis=1) / d[index, 1].sum(axis=1) for p, d in draws.items()}
    ratio_boot = boot["entropy"] / boot["uniform"]
    gain = figures["closed_form_gain"]
    deviation_boot = (ratio_boot - 1) / gain - 1
    for policy in ("uniform", "entropy"):
        figures[policy] = {
            "masked_mean": _support.finite(means[policy]),
            "ci95": list(percentile_interval(boot[policy])),
            "masked_per_draw": _support.finite(draws[policy][:, 1].mean()),
            "exact": exact[policy],
            # How many bootstrap standard errors the Monte Carlo mean lies from the exact expectation.
            "z_vs_exact": _support.finite((means[policy] - exact[policy]) / max(float(boot[policy].std()), 1e-12)),
        }
    ratio = means["entropy"] / means["uniform"]
    figures["ratio"] = {"measured": _support.finite(ratio), "ci95": list(percentile_interval(ratio_boot)),
                        "closed_form": 1 + gain, "exact": exact["entropy"] / exact["uniform"],
                        "per_row_closed_form": figures["per_row_closed_form"] / figures["mu"]}
    figures["gain_deviation"] = {"measured": _support.finite((ratio - 1) / gain - 1),
                                 "ci95": list(percentile_interval(deviation_boot)), "tolerance": TOLERANCE}
    return figures


def decide(figures: dict) -> tuple[str, str]:
    """The verdict from the interval of the gain's relative deviation from the closed form."""
    low, high = figures["gain_deviation"]["ci95"]
    verdict = _support.equivalence_verdict(low, high, -TOLERANCE, TOLERANCE)
    ratio = figures["ratio"]
    reason = (
        f"masked-token mean surprisal {figures['entropy']['masked_mean']:.3f} (entropy) vs "
        f"{figures['uniform']['masked_mean']:.3f} (uniform): ratio {ratio['measured']:.3f} "
        f"[{ratio['ci95'][0]:.3f}, {ratio['ci95'][1]:.3f}] vs closed form 1 + sigma^2/mu^2 = "
        f"{ratio['closed_form']:.3f} (mu {figures['mu']:.3f}, sigma^2 {figures['sigma2']:.3f}); the gain deviates by "
        f"{figures['gain_deviation']['measured']:+.1%} [{low:+.1%}, {high:+.1%}] (tolerance ±{TOLERANCE:.0%}); "
        f"exact expectation of mlm's per-row rule: ratio {ratio['exact']:.3f}"
    )
    return verdict, reason


def _plot(batch: TokenBatch, registry, vocab, config: Config, setting: Setting, figures: dict) -> str:
    """Histogram of the maskable tokens' surprisal, and of the tokens each policy masked in one
    draw set, with the means."""
    from matplotlib.figure import Figure

    can = maskable(batch)
    s = batch.surprisal
    generator = torch.Generator().manual_seed(setting.seed * 31 + 7)
    masked = {}
    for policy in ("uniform", "entropy"):
        objective = registry.get("mlm", vocab=vocab, mask_prob=config.mask_prob, masking_policy=policy)
        picks = [s[objective.corrupt(batch, generator).labels != IGNORE_INDEX] for _ in range(20)]
        masked[policy] = torch.cat(picks).numpy()
    figure = Figure(figsize=(7, 4))
    ax = figure.add_subplot()
    bins = np.linspace(0, math.ceil(float(s[can].max())), 40)
    ax.hist(s[can].numpy(), bins=bins, density=True, alpha=0.35, color="grey", label="all maskable tokens")
    for policy, color in (("uniform", "tab:blue"), ("entropy", "tab:red")):
        ax.hist(masked[policy], bins=bins, density=True, histtype="step", color=color, label=f"masked ({policy})")
    ax.axvline(figures["mu"], color="tab:blue", linestyle="--", label=rf"$\mu$ = {figures['mu']:.2f}")
    ax.axvline(figures["closed_form"], color="black", linestyle=":",
               label=rf"$(\sigma^2+\mu^2)/\mu$ = {figures['closed_form']:.2f}")
    ax.axvline(figures["entropy"]["masked_mean"], color="tab:red", linestyle="--",
               label=f"entropy masked mean = {figures['entropy']['masked_mean']:.2f}")
    ax.set_xlabel("surprisal (nats)")
    ax.set_ylabel("density")
    ax.set_title("Surprisal of masked tokens: uniform vs entropy masking")
    ax.legend(fontsize=7)
    figure.tight_layout()
    return save_figure(figure, setting.out_dir / f"{NAME}.png")
