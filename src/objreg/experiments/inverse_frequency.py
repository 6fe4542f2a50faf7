"""Inverse-frequency masking: masking rare tokens more often makes them a larger part of the
loss and improves the model's predictions of rare tokens.

**Claim.** Uniform masking spends most of its budget on frequent tokens, so rare tokens are
learned slowly; sampling the masked tokens with weights that decrease with frequency makes rare
tokens a larger share of the training loss and improves the model on them (Zhang et al. 2023,
Weighted Sampling for Masked Language Modeling, ICASSP, §2–4). That the ``inverse_frequency``
policy flattens the masked ranks is a unit test of the policy (tests/toolkit/test_selection.py),
not evidence here.

**Setting.** The default model is built twice from one initialisation and trained on the same
rows of the default corpus with ``mlm``, ``masking_policy=uniform`` and
``masking_policy=inverse_frequency`` (weights ∝ 1/count from the training split's token counts),
15% budget (quick: 150 AdamW steps of 16 rows × 64 tokens; full: 400 steps of 16 × 128). *Rare*
tokens are the types outside the most frequent ones that together make 80% of the training
split's tokens (the tail holding 20% of the running text).

**Measured.** On the same held-out rows (quick: 128; full: 256) with the same *uniform* 15%
masking, each model's mean NLL of the masked rare tokens and of the masked frequent ones. The
effect is the rare-token NLL of the uniform twin minus the inverse-frequency twin's (nats;
positive: inverse-frequency masking predicts rare tokens better), with a within-seed bootstrap
over held-out rows. Also: the share of each model's masked-token loss that rare tokens carry when
the held-out rows are masked by its own policy (the "loss contribution"), and the frequent-token
difference (the price paid).

**Verdict.** Over seeds, the mean rare-token NLL difference with its between-seed 95% t-interval:
above 0 ``confirmed``, below 0 ``refuted``, otherwise ``inconclusive``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from objreg.analysis.math.stats import bootstrap_ci95
from objreg.analysis.parallel.devices import resolve_device
from objreg.experiments import _support
from objreg.experiments.base import ExperimentResult, Setting, save_figure, verdict_from_interval
from objreg.experiments.preconditions import Precondition
from objreg.toolkit.randomness import stream

NAME = "inverse-frequency"
CLAIM = ("Masking tokens with weights that fall with their frequency makes rare tokens a larger share of the "
         "masked-LM loss and gives a model that predicts rare tokens better than uniform masking does.")
SOURCE = "Zhang et al. 2023, Weighted Sampling for Masked Language Modeling, ICASSP, sections 2-4"
RULE = ("The mean over seeds of the held-out rare-token NLL of the uniform twin minus the inverse-frequency twin has "
        "a 95% between-seed t-interval above 0: confirmed; below 0: refuted; else inconclusive.")
THRESHOLD = 0.0
DIRECTION = "above"
POLICIES = ("uniform", "inverse_frequency")
#: The manipulation check: the policy must put more of the loss on rare tokens than uniform masking does.
PRECONDITIONS = (Precondition(
    "rare_share_raised", "the rare tokens' share of the own-policy masked loss, inverse_frequency minus uniform",
    0.1, "above", lambda figures, setting: (figures["rare_share_of_own_masked_loss"]["inverse_frequency"]
                                            - figures["rare_share_of_own_masked_loss"]["uniform"])),)


@dataclass(frozen=True)
class Config:
    """Sizes of the experiment."""

    steps: int = 150
    batch_size: int = 16
    seq_len: int = 64
    lr: float = 1e-3
    rows: int = 128
    frequent_mass: float = 0.8


QUICK = Config()
FULL = Config(steps=400, seq_len=128, rows=256)


def run(setting: Setting) -> ExperimentResult:
    return _run(QUICK if setting.quick else FULL, setting)


def rare_types(counts: torch.Tensor, frequent_mass: float) -> torch.Tensor:
    """A bool ``[V]``: the types outside the most frequent ones that together reach
    ``frequent_mass`` of all tokens (ties broken by id, so it is deterministic)."""
    order = torch.argsort(-counts.double(), stable=True)
    covered = counts.double()[order].cumsum(0) / counts.sum()
    frequent = order[: int((covered < frequent_mass).sum()) + 1]
    rare = torch.ones(len(counts), dtype=torch.bool)
    rare[frequent] = False
    return rare


def _run(config: Config, setting: Setting, text: _support.DefaultText | None = None,
         model_config: dict | None = None) -> ExperimentResult:
    device = resolve_device(setting.device)
    text = text or _support.default_text(config.seq_len)
    vocab = text.train.vocab
    rare = rare_types(vocab.token_counts, config.frequent_mass)
    objectives = {p: text.registry.get("mlm", vocab=vocab, masking_policy=p) for p in POLICIES}
    rows = _support.heldout_rows(text.heldout, config.rows, setting.seed)
    shared = objectives["uniform"].corrupt(rows, stream(setting.seed, "heldout_corruption"))
    row_of = _row_index(shared)
    nll, share, losses = {}, {}, {}
    for policy, objective in objectives.items():
        setting.status(f"training with {policy} masking ({config.steps} steps)")
        model = _support.mlm_model(text.registry, objective, setting.seed, model_config).to(device)
        losses[policy] = _support.train(model, objective, text.train, steps=config.steps,
                                        batch_size=config.batch_size, lr=config.lr, seed=setting.seed, device=device)
        log_probs, targets = _support.masked_log_probs(model, objective, shared, device)
        nll[policy] = (-log_probs.gather(1, targets[:, None])[:, 0]).numpy()
        own = objective.corrupt(rows, stream(setting.seed, "second_heldout_corruption"))
        own_log_probs, own_targets = _support.masked_log_probs(model, objective, own, device)
        own_nll = -own_log_probs.gather(1, own_targets[:, None])[:, 0]
        share[policy] = float(own_nll[rare[own_targets]].sum() / own_nll.sum())
    is_rare = rare[targets].numpy()
    gain_per_row = _per_row_gain(nll, is_rare, row_of)
    gain = float(nll["uniform"][is_rare].mean() - nll["inverse_frequency"][is_rare].mean())
    low, high = bootstrap_ci95(gain_per_row, seed=[setting.seed, 6]) if len(gain_per_row) > 1 else (gain, gain)
    figures = {
        "effect": _support.finite(gain), "effect_ci95_within_seed": [low, high],
        "rare_nll": {p: float(v[is_rare].mean()) for p, v in nll.items()},
        "frequent_nll": {p: float(v[~is_rare].mean()) for p, v in nll.items()},
        "rare_share_of_own_masked_loss": share,
        "masked_tokens": int(len(is_rare)), "masked_rare_tokens": int(is_rare.sum()),
        "rare_types": int(rare.sum()), "types": int(vocab.size),
        "training_loss": {p: _support.loss_summary(v) for p, v in losses.items()},
    }
    verdict, reason = seed_verdict(figures)
    plots = [_plot(figures, setting)] if setting.out_dir is not None else []
    return ExperimentResult(NAME, CLAIM, verdict, reason, figures,
                            _support.settings(config, setting, device),
                            plots)


def _row_index(batch) -> np.ndarray:
    real = batch.extras["masked_weights"] > 0
    return torch.arange(real.shape[0])[:, None].expand_as(real)[real].numpy()


def _per_row_gain(nll: dict, is_rare: np.ndarray, row_of: np.ndarray) -> np.ndarray:
    """Per held-out row with a masked rare token, the uniform twin's rare-token NLL minus the
    other's (summed over the row's rare tokens, scaled so their mean is the pooled difference)."""
    rows = np.unique(row_of[is_rare])
    diff = nll["uniform"] - nll["inverse_frequency"]
    per_row = np.array([diff[is_rare & (row_of == r)].sum() for r in rows])
    return per_row * len(rows) / is_rare.sum()


def _plot(figures: dict, setting: Setting) -> str:
    from matplotlib.figure import Figure

    figure = Figure(figsize=(5.5, 3.5))
    axes = figure.add_subplot()
    x = np.arange(2)
    for i, policy in enumerate(POLICIES):
        values = [figures["rare_nll"][policy], figures["frequent_nll"][policy]]
        axes.bar(x + 0.4 * i, values, width=0.4, label=f"trained with {policy}")
    axes.set_xticks(x + 0.2, ["rare tokens", "frequent tokens"])
    axes.set_ylabel("held-out NLL (nats), uniform masks")
    axes.set_title(f"Inverse-frequency vs uniform masking, seed {setting.seed}")
    axes.legend(fontsize=8)
    figure.tight_layout()
    return save_figure(figure, setting.out_dir / f"{NAME}.png")


def seed_verdict(figures: dict[str, Any]) -> tuple[str, str]:
    """One seed's verdict and reason from its figures (``recombine`` reads them again after a rule change)."""
    gain, (low, high) = figures["effect"], figures["effect_ci95_within_seed"]
    frequent, share = figures["frequent_nll"], figures["rare_share_of_own_masked_loss"]
    reason = (f"rare-token NLL uniform − inverse_frequency {gain:+.3f} nats (within-seed bootstrap over rows "
              f"[{low:+.3f}, {high:+.3f}], {figures['masked_rare_tokens']} masked rare tokens); frequent tokens "
              f"{frequent['uniform'] - frequent['inverse_frequency']:+.3f}; rare share of "
              f"the own-policy loss {share['uniform']:.2f} → {share['inverse_frequency']:.2f}")
    return verdict_from_interval(low, high), reason
