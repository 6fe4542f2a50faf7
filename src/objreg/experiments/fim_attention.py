"""FIM: a model trained to fill in the middle keeps its left-to-right loss ("FIM-for-free") and
learns to infill, which a left-to-right model cannot.

**Claim.** Bavarian et al. 2022 (Efficient Training of Language Models to Fill in the Middle,
§3, figures 1-2): training with the fill-in-the-middle transformation on a share of the data
(50% in their default) does not harm left-to-right generative ability, measured by the
left-to-right test loss against a model trained without FIM, while it teaches the model to
infill, which a left-to-right model does badly. Both halves are tested.

The ``fim`` objective keeps the tokens in their original order and applies the FIM order through
position ids and a permuted causal mask; that this computes exactly what the reordered sequence
would, and keeps ``n(n+1)/2`` connections, are unit tests of the objective
(tests/plugins/objectives/test_fim.py), not evidence here.

**Setting.** The default model is built twice from one initialisation and trained on the same
rows of the default corpus: ``fim`` with ``fim_rate=0.5`` (the FIM model) and ``fim`` with
``fim_rate=0`` (plain causal LM through the same code: the left-to-right model). Quick: 150
AdamW steps of 16 rows × 64 tokens; full: 400 steps of 16 × 128. Both are read on the same
held-out rows (quick: 64; full: 256): left-to-right (``fim_rate=0``), and PSM-transformed
(``fim_rate=1``, ``fim_spm_rate=0``, the same split points for both models).

**Measured.** *Left-to-right loss*: each model's mean next-token NLL on the plain rows. *Infilling
loss*: each model's mean NLL of the middle and of the ``[SEP]`` that ends it, given the prefix
and suffix (the positions from ``[FIM_MIDDLE]`` on in the FIM order). Per seed, with within-seed
bootstrap intervals over held-out rows: ``fim_cost`` = L2R loss of the FIM model − of the L2R
model (the effect; the claim says about 0), ``infilling_gain`` = infilling loss of the L2R
model − of the FIM model.

**Verdict.** Two parts over seeds, each with its between-seed 95% t-interval: ``fim_cost`` below
0.05 nats (at most a twentieth of a nat worse left to right) and ``infilling_gain`` above 0.
``confirmed`` when both are, ``refuted`` when either lies wholly on the wrong side,
``inconclusive`` otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from objreg import IGNORE_INDEX
from objreg.analysis.math.stats import bootstrap_ci95
from objreg.analysis.parallel.devices import resolve_device
from objreg.experiments import _support
from objreg.experiments.base import CONFIRMED, INCONCLUSIVE, REFUTED, ExperimentResult, Setting, save_figure
from objreg.experiments.preconditions import Precondition
from objreg.experiments.replication import combine_parts
from objreg.toolkit import losses, seq2seq
from objreg.toolkit.randomness import stream

NAME = "fim-attention"
CLAIM = ("Training with the fill-in-the-middle transformation on half of the data leaves the left-to-right loss "
         "as good as a left-to-right model's (FIM-for-free), while the FIM model infills a middle from its prefix "
         "and suffix far better than the left-to-right model.")
SOURCE = ("Bavarian et al. 2022, Efficient Training of Language Models to Fill in the Middle, arXiv:2207.14255, "
          "section 3 and figures 1-2")
RULE = ("Over seeds (95% between-seed t-intervals): the left-to-right loss of the FIM model minus the left-to-right "
        "model's lies below 0.05 nats and the infilling loss of the left-to-right model minus the FIM model's lies "
        "above 0: confirmed; either wholly on the other side: refuted; else inconclusive.")
FREE_MARGIN = 0.05
PARTS = {"fim_cost": (FREE_MARGIN, "below"), "infilling_gain": (0.0, "above")}
MODELS = {"fim": 0.5, "left_to_right": 0.0}
#: Both models must have learned from their training (a loss that did not fall says nothing about FIM).
PRECONDITIONS = (Precondition(
    "both_models_learned", "the smaller fall of the two models' training loss, mean of the first 10 steps minus "
    "mean of the last 10 (nats)", 1.0, "above",
    lambda figures, setting: min(loss["first"] - loss["last"] for loss in figures["training_loss"].values())),)


@dataclass(frozen=True)
class Config:
    """Sizes of the experiment."""

    steps: int = 150
    batch_size: int = 16
    seq_len: int = 64
    lr: float = 1e-3
    rows: int = 64


QUICK = Config()
FULL = Config(steps=400, seq_len=128, rows=256)


def run(setting: Setting) -> ExperimentResult:
    return _run(QUICK if setting.quick else FULL, setting)


def combine(results: list[ExperimentResult], setting: Setting) -> ExperimentResult:
    return combine_parts(results, setting, PARTS)


def middle_positions(batch, middle_id: int) -> torch.Tensor:
    """A bool ``[B, T]``: the positions whose label is a middle token or the ``[SEP]`` after it,
    i.e. labelled positions from ``[FIM_MIDDLE]`` on in the FIM order (PSM rows)."""
    marker_rank = torch.where(batch.input_ids == middle_id, batch.position_ids, -1).max(dim=1).values  # (B,)
    return (batch.position_ids >= marker_rank[:, None]) & (marker_rank[:, None] >= 0) & (batch.labels != IGNORE_INDEX)


@torch.no_grad()
def row_losses(model, objective, batch, device: torch.device, positions: torch.Tensor | None = None,
               chunk: int = 32) -> np.ndarray:
    """Per row, the mean next-token NLL over labelled positions (or over ``positions``)."""
    model.eval()
    out = []
    for start in range(0, batch.input_ids.shape[0], chunk):
        part = batch.select(slice(start, start + chunk)).to(device)
        mask = objective.attention_mask(part)
        hidden = model.encode(part.input_ids, mask, part.position_ids)
        logits = model.heads["lm"](hidden)
        nll, labelled = losses.token_nll(logits, part.labels)
        if positions is not None:
            labelled = labelled & positions[start:start + chunk].to(device)
        out.append(losses.weighted_mean(nll, labelled).double().cpu().numpy())
    return np.concatenate(out)


def _run(config: Config, setting: Setting, text: _support.DefaultText | None = None,
         model_config: dict | None = None) -> ExperimentResult:
    device = resolve_device(setting.device)
    text = text or _support.default_text(config.seq_len)
    vocab = text.train.vocab
    objectives = {name: text.registry.get("fim", vocab=vocab, fim_rate=rate) for name, rate in MODELS.items()}
    plain = objectives["left_to_right"]
    infill = text.registry.get("fim", vocab=vocab, fim_rate=1.0, fim_spm_rate=0.0)
    rows = _support.heldout_rows(text.heldout, config.rows, setting.seed)
    plain_batch = plain.corrupt(rows, stream(setting.seed, "heldout_corruption"))
    infill_batch = infill.corrupt(rows, stream(setting.seed, "second_heldout_corruption"))
    middle = middle_positions(infill_batch, seq2seq.named_id(vocab, "[FIM_MIDDLE]", "fim"))
    l2r, infilling, training = {}, {}, {}
    for name, objective in objectives.items():
        setting.status(f"training the {name} model ({config.steps} steps)")
        model = _support.mlm_model(text.registry, objective, setting.seed, model_config).to(device)
        training[name] = _support.train(model, objective, text.train, steps=config.steps,
                                        batch_size=config.batch_size, lr=config.lr, seed=setting.seed, device=device)
        l2r[name] = row_losses(model, plain, plain_batch, device)
        infilling[name] = row_losses(model, infill, infill_batch, device, middle)
    cost_rows = l2r["fim"] - l2r["left_to_right"]
    gain_rows = infilling["left_to_right"] - infilling["fim"]
    cost, gain = float(cost_rows.mean()), float(gain_rows.mean())
    cost_ci = bootstrap_ci95(cost_rows, seed=[setting.seed, 7])
    gain_ci = bootstrap_ci95(gain_rows, seed=[setting.seed, 8])
    figures = {
        "effect": _support.finite(cost), "effect_ci95_within_seed": list(cost_ci),
        "parts": {"fim_cost": cost, "infilling_gain": _support.finite(gain)},
        "infilling_gain_ci95_within_seed": list(gain_ci),
        "left_to_right_loss": {name: float(v.mean()) for name, v in l2r.items()},
        "infilling_loss": {name: float(v.mean()) for name, v in infilling.items()},
        "middle_positions": int(middle.sum()),
        "training_loss": {name: _support.loss_summary(v) for name, v in training.items()},
    }
    verdict, reason = seed_verdict(figures)
    plots = [_plot(figures, setting)] if setting.out_dir is not None else []
    return ExperimentResult(NAME, CLAIM, verdict, reason, figures,
                            _support.settings(config, setting, device, fim_rate=MODELS),
                            plots)


def _plot(figures: dict, setting: Setting) -> str:
    from matplotlib.figure import Figure

    figure = Figure(figsize=(5.5, 3.5))
    axes = figure.add_subplot()
    x = np.arange(2)
    for i, name in enumerate(MODELS):
        values = [figures["left_to_right_loss"][name], figures["infilling_loss"][name]]
        axes.bar(x + 0.4 * i, values, width=0.4, label=f"{name} model")
    axes.set_xticks(x + 0.2, ["left-to-right loss", "infilling loss (middle)"])
    axes.set_ylabel("held-out NLL (nats)")
    axes.set_title(f"FIM-for-free and infilling, seed {setting.seed}")
    axes.legend(fontsize=8)
    figure.tight_layout()
    return save_figure(figure, setting.out_dir / f"{NAME}.png")


def seed_verdict(figures: dict[str, Any]) -> tuple[str, str]:
    """One seed's verdict and reason from its figures (``recombine`` reads them again after a rule change)."""
    cost, cost_ci = figures["parts"]["fim_cost"], figures["effect_ci95_within_seed"]
    gain, gain_ci = figures["parts"]["infilling_gain"], figures["infilling_gain_ci95_within_seed"]
    verdicts = [_support.verdict_from_interval(*cost_ci, FREE_MARGIN, "below"),
                _support.verdict_from_interval(*gain_ci, 0.0, "above")]
    verdict = REFUTED if REFUTED in verdicts else CONFIRMED if all(v == CONFIRMED for v in verdicts) else INCONCLUSIVE
    reason = (f"left-to-right loss FIM − L2R model {cost:+.4f} nats (within-seed [{cost_ci[0]:+.4f}, "
              f"{cost_ci[1]:+.4f}], claim below {FREE_MARGIN}); infilling loss L2R − FIM model {gain:+.3f} nats "
              f"(within-seed [{gain_ci[0]:+.3f}, {gain_ci[1]:+.3f}], claim above 0)")
    return verdict, reason
