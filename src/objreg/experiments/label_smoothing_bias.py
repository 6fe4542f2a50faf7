"""Label smoothing bias: a model trained with smoothing ε moves its predicted marginal toward
uniform by ε(1/V − π_i).

**Claim.** Label smoothing replaces the one-hot target by ``(1−ε)δ_y + ε/V``; its optimum is
``q(·|x) = (1−ε)p(·|x) + ε/V``, so the model's average prediction moves from the label marginal
``π`` toward uniform: ``q̄_i − π_i = ε(1/V − π_i)``, frequent tokens down and rare ones up
(Szegedy et al. 2016, §7; Müller et al. 2019, §2). The closed form of the optimum itself is a
unit test of :func:`objreg.toolkit.losses.smoothed_nll` (tests/toolkit/test_losses.py); this
experiment asks whether a *trained* masked-LM model realises the shift.

**Setting.** The default model is built twice from one initialisation and trained on the same
rows of the default corpus with ``mlm``: once plain (ε = 0), once with ``label_smoothing=0.2``
(quick: 150 AdamW steps of 16 rows × 64 tokens; full: 1,200 steps of 16 × 128, long enough
for the plain twin, the reference the shift is measured from, to settle). Both are read on the
same held-out rows with the same uniform 15% masking (quick: 64 rows; full: 256).

**Measured.** The mean predicted distribution over the held-out masked positions of each model,
``q̄_0`` and ``q̄_ε``. The plain twin stands in for ``p``: if the smoothed model is at the smoothed
optimum of what the plain one learned, ``q̄_ε − q̄_0 = ε(1/V − q̄_0)`` exactly. The effect is the
least-squares slope of ``q̄_ε − q̄_0`` on ``1/V − q̄_0`` over the vocabulary (no intercept: both
sum to 0), divided by ε: 1 is the claim, 0 is no shift (the null). Within one seed a bootstrap
over held-out rows gives an interval for that seed's model and rows only. Also reported: the
same slope against the held-out label marginal ``π`` for each model.

**Verdict.** Over seeds, the mean of ``slope/ε`` with its between-seed 95% t-interval against
the margin [0.75, 1.25]: ``confirmed`` inside, ``refuted`` wholly outside, ``inconclusive``
otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from objreg.analysis.parallel.devices import resolve_device
from objreg.experiments import _support
from objreg.experiments.base import ExperimentResult, Setting, save_figure
from objreg.experiments.preconditions import Precondition
from objreg.experiments.replication import combine_equivalence
from objreg.toolkit.randomness import stream

NAME = "label-smoothing-bias"
CLAIM = ("A model trained with label smoothing epsilon predicts (1-epsilon) p + epsilon/V, so its average "
         "prediction moves from the label marginal toward uniform by epsilon (1/V - pi_i): frequent tokens down, "
         "rare tokens up.")
SOURCE = ("Szegedy et al. 2016, Rethinking the Inception Architecture for Computer Vision, CVPR, section 7; "
          "Mueller, Kornblith and Hinton 2019, When Does Label Smoothing Help?, NeurIPS, section 2")
RULE = ("The mean over seeds of slope/epsilon (the smoothed twin's marginal shift regressed on epsilon (1/V - q0)) "
        "has a 95% between-seed t-interval inside [0.75, 1.25]: confirmed; wholly outside: refuted; else "
        "inconclusive.")
MARGIN = (0.75, 1.25)
#: The reference must have learned the label marginal: the shift is measured from the plain twin.
PRECONDITIONS = (Precondition(
    "reference_learned_marginal", "the slope of the plain twin's average prediction minus the label marginal on "
    "1/V minus the label marginal: 0 at the marginal, 1 at uniform", 0.5, "below",
    lambda figures, setting: figures["against_label_marginal"]["plain"] * figures["epsilon"]),)


@dataclass(frozen=True)
class Config:
    """Sizes of the experiment."""

    epsilon: float = 0.2
    steps: int = 150
    batch_size: int = 16
    seq_len: int = 64
    lr: float = 1e-3
    rows: int = 64
    resamples: int = 400


QUICK = Config()
FULL = Config(steps=1200, seq_len=128, rows=256)


def run(setting: Setting) -> ExperimentResult:
    return _run(QUICK if setting.quick else FULL, setting)


def combine(results: list[ExperimentResult], setting: Setting) -> ExperimentResult:
    return combine_equivalence(results, setting, *MARGIN)


def _run(config: Config, setting: Setting, text: _support.DefaultText | None = None,
         model_config: dict | None = None) -> ExperimentResult:
    device = resolve_device(setting.device)
    text = text or _support.default_text(config.seq_len)
    vocab = text.train.vocab
    plain = text.registry.get("mlm", vocab=vocab)
    smoothed = text.registry.get("mlm", vocab=vocab, label_smoothing=config.epsilon)
    rows = _support.heldout_rows(text.heldout, config.rows, setting.seed)
    batch = plain.corrupt(rows, stream(setting.seed, "heldout_corruption"))
    sums, losses = {}, {}
    for name, objective in (("plain", plain), ("smoothed", smoothed)):
        setting.status(f"training the {name} twin ({config.steps} steps)")
        model = _support.mlm_model(text.registry, plain, setting.seed, model_config).to(device)
        losses[name] = _support.train(model, objective, text.train, steps=config.steps, batch_size=config.batch_size,
                                      lr=config.lr, seed=setting.seed, device=device)
        log_probs, targets = _support.masked_log_probs(model, plain, batch, device)
        sums[name] = log_probs.exp()
    row_of = _row_index(batch)
    per_row = {name: _per_row_sums(p, row_of, config.rows) for name, p in sums.items()}
    counts = np.bincount(row_of, minlength=config.rows).astype(np.float64)
    V = vocab.size
    slope = shift_slope(per_row["smoothed"].sum(0), per_row["plain"].sum(0), counts.sum(), V)
    generator = np.random.default_rng([setting.seed, 11])
    weights = generator.multinomial(config.rows, np.full(config.rows, 1 / config.rows), size=config.resamples)
    boot = [shift_slope(w @ per_row["smoothed"], w @ per_row["plain"], float(w @ counts), V) for w in weights]
    low, high = (float(v) / config.epsilon for v in np.quantile(boot, [0.025, 0.975]))
    effect = slope / config.epsilon
    label = np.bincount(targets.numpy(), minlength=V) / len(targets)
    figures = {
        "effect": _support.finite(effect), "effect_ci95_within_seed": [low, high],
        "slope": slope, "epsilon": config.epsilon, "masked_tokens": len(targets),
        "against_label_marginal": {
            name: label_slope(sums[name].mean(0).numpy(), label, V) / config.epsilon for name in sums},
        "training_loss": {name: _support.loss_summary(v) for name, v in losses.items()},
    }
    verdict, reason = seed_verdict(figures)
    plots = [_plot(per_row, counts, V, config.epsilon, setting)] if setting.out_dir is not None else []
    return ExperimentResult(NAME, CLAIM, verdict, reason, figures,
                            _support.settings(config, setting, device),
                            plots)


def _row_index(batch) -> np.ndarray:
    real = batch.extras["masked_weights"] > 0
    return torch.arange(real.shape[0])[:, None].expand_as(real)[real].numpy()


def _per_row_sums(probs: torch.Tensor, row_of: np.ndarray, rows: int) -> np.ndarray:
    out = np.zeros((rows, probs.shape[1]))
    np.add.at(out, row_of, probs.numpy())
    return out


def shift_slope(smoothed_sum: np.ndarray, plain_sum: np.ndarray, count: float, V: int) -> float:
    """Least-squares slope (no intercept) of ``q̄_ε − q̄_0`` on ``1/V − q̄_0``, from the summed
    predictions of the two models over ``count`` positions."""
    q0, qe = plain_sum / count, smoothed_sum / count
    x = 1.0 / V - q0
    return float(((qe - q0) * x).sum() / (x * x).sum())


def label_slope(mean_prediction: np.ndarray, label: np.ndarray, V: int) -> float:
    """Slope (no intercept) of ``q̄ − π`` on ``1/V − π``, ``π`` the held-out label marginal."""
    x = 1.0 / V - label
    return float(((mean_prediction - label) * x).sum() / (x * x).sum())


def _plot(per_row: dict, counts: np.ndarray, V: int, epsilon: float, setting: Setting) -> str:
    from matplotlib.figure import Figure

    q0 = per_row["plain"].sum(0) / counts.sum()
    qe = per_row["smoothed"].sum(0) / counts.sum()
    x = 1.0 / V - q0
    figure = Figure(figsize=(5.5, 4))
    axes = figure.add_subplot()
    axes.scatter(x, qe - q0, s=4, alpha=0.5, label="one token type")
    line = np.array([x.min(), x.max()])
    axes.plot(line, epsilon * line, color="black", label=f"claim: slope epsilon = {epsilon}")
    axes.set_xlabel("1/V − q̄₀ (plain twin's marginal)")
    axes.set_ylabel("q̄_ε − q̄₀")
    axes.set_title(f"Label smoothing shift, seed {setting.seed}")
    axes.legend(fontsize=8)
    figure.tight_layout()
    return save_figure(figure, setting.out_dir / f"{NAME}.png")


def seed_verdict(figures: dict[str, Any]) -> tuple[str, str]:
    """One seed's verdict and reason from its figures (``recombine`` reads them again after a rule change)."""
    effect, (low, high) = figures["effect"], figures["effect_ci95_within_seed"]
    reason = (f"slope/epsilon {effect:.3f} (within-seed bootstrap [{low:.3f}, {high:.3f}], {figures['masked_tokens']} "
              f"masked tokens) against the margin [{MARGIN[0]}, {MARGIN[1]}]")
    return _support.equivalence_verdict(low, high, *MARGIN), reason
