"""RTD efficiency: replaced-token detection learns more per example than MLM because its loss is
defined over every input token, not only the ~15% masked ones.

**Claim.** ELECTRA's replaced-token detection is more sample-efficient than masked language
modelling, and the gain comes mostly from the loss being defined over all input tokens: the
"ELECTRA 15%" ablation, whose discriminator loss covers only the 15% of tokens that were masked,
does about as well as BERT and clearly worse than ELECTRA (GLUE 82.4 vs BERT 82.2 vs ELECTRA
85.0). Source: Clark et al. 2020, ELECTRA, ICLR 2020, §3.2 (efficiency analysis) and Table 5.

**Setting.** The default model is trained three times from one initialisation on the same rows
in the same order (AdamW 1e-3; quick: 120 steps of 16 rows of 64 tokens; full: 480 steps),
differing only in the objective:

* ``mlm``: BERT's masked LM, 15% of tokens selected (the baseline);
* ``rtd``: ELECTRA (``rtd`` with its defaults: 15% replaced by its generator's samples, the
  discriminator loss over every real token, weight 50);
* ``rtd15`` (the null): the same generator, samples and weights, but the discriminator loss is
  the mean over the selected 15% of positions only (ELECTRA 15%): ``rtd`` with
  ``discriminator_positions="selected"``.

**Measured.** A downstream task on real data, read as ELECTRA's Table 5 reads GLUE: by
fine-tuning each model at the end of its pre-training
(:func:`objreg.experiments.sst2_finetune.finetune_correct`). On the 872 sentences of SST-2
(GLUE's dev set, in ``shared/data/glue/SST-2``), 5-fold cross validation (the same folds for every
model): per fold, a copy of the backbone and a linear head on its mean-pooled output trained end
to end on the other four folds (10 epochs of 16 sentences, AdamW 1e-3; quick: 2 epochs), then the
held-out fold predicted; the cross-validated accuracy. The fine-tune of the untrained model is
reported as the floor. Beside it, deciding nothing, the frozen linear probe (L2 logistic
regression on the standardised mean-pooled output, :func:`~objreg.experiments.sst2_probe.probe_correct`;
the reading before 2026-11-27, near chance at 0.54 to 0.59) after a third, two thirds and all of
the training steps: the sample-efficiency curve, cheap enough to read at every checkpoint.

**Verdict.** Per seed: the fine-tuned ``accuracy(rtd) − accuracy(mlm)`` and
``accuracy(rtd) − accuracy(rtd15)``; the effect is the smaller of the two (both halves of
the claim must hold). Over seeds: the mean with a 95% t-interval; ``confirmed`` when it lies
wholly above 0, ``refuted`` when wholly below. The null (the all-token loss brings nothing) is
``rtd15`` doing as well as ``rtd``.

**Precondition** (``sst2_above_chance``): every arm's fine-tuned accuracy
above :data:`~objreg.experiments.sst2_probe.PROBE_ABOVE_CHANCE` (0.6, chance 0.5) on every seed;
where a reading sits at chance the gaps are noise and the verdict is ``inconclusive (precondition
failed: …)``.

The SST-2 helpers (:mod:`~objreg.experiments.sst2_probe`, :mod:`~objreg.experiments.sst2_finetune`)
are shared with ``char-noise-robustness``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from objreg.analysis.parallel.devices import resolve_device
from objreg.experiments import _support
from objreg.experiments.base import ExperimentResult, Setting, save_figure, verdict_from_interval
from objreg.experiments.preconditions import Precondition
from objreg.experiments.sst2_finetune import FineTune, finetune_correct
from objreg.experiments.sst2_probe import PROBE_ABOVE_CHANCE, probe_correct, sentence_features, sst2

NAME = "rtd-efficiency"
CLAIM = ("Replaced-token detection is more sample-efficient than masked language modelling because its loss is "
         "defined over all input tokens: restricted to the 15% masked positions (ELECTRA 15%) it does about as well "
         "as MLM and worse than full RTD.")
SOURCE = "Clark et al., ELECTRA: Pre-training Text Encoders as Discriminators Rather Than Generators, ICLR 2020, §3.2, Table 5"
RULE = ("Effect = the smaller of the SST-2 accuracy gaps rtd - mlm and rtd - rtd15 after the last pre-training step, "
        "each accuracy a 5-fold cross-validated fine-tune (backbone + linear head on the mean-pooled output); "
        "confirmed when the 95% t-interval of its mean over seeds lies wholly above 0, refuted when wholly below. "
        "Precondition: every arm's fine-tuned accuracy above 0.6 (chance 0.5) on every seed.")
#: ELECTRA's claim is about pre-training from scratch, which this project's CPU cannot run far
#: enough for the comparison to mean anything (docs/experiments.md, rtd-efficiency).
NOT_TESTABLE_HERE = ("the claim is about pre-training from scratch, and no from-scratch run this 2-core CPU can afford "
                     "fine-tunes above the untrained model's SST-2 floor (six pilots, 2026-11-27); it needs a GPU-lent "
                     "task")
THRESHOLD = 0.0
DIRECTION = "above"
ARMS = ("mlm", "rtd", "rtd15")
#: Gaps between readings at chance are noise: every arm must read sentiment for a gap to mean anything.
PRECONDITIONS = (Precondition(
    "sst2_above_chance",
    "the lowest of the three arms' fine-tuned SST-2 accuracies after pre-training (chance 0.5)",
    PROBE_ABOVE_CHANCE, "above",
    lambda figures, setting: min(figures["accuracy"][arm] for arm in ARMS)),)


@dataclass(frozen=True)
class Config:
    """Sizes of the experiment."""

    steps: int
    seq_len: int
    batch_size: int = 16
    lr: float = 1e-3
    checkpoints: int = 3
    folds: int = 5
    probe_seq_len: int = 64
    finetune_epochs: int = 10
    finetune_lr: float = 1e-3

    @property
    def finetune(self) -> FineTune:
        return FineTune(epochs=self.finetune_epochs, lr=self.finetune_lr)


#: The quick setting fine-tunes for 2 epochs to stay cheap (its accuracies are lower than the full setting's).
QUICK = Config(steps=120, seq_len=64, finetune_epochs=2)
FULL = Config(steps=480, seq_len=64)


# -- the experiment -----------------------------------------------------------------------------------------


def run(setting: Setting) -> ExperimentResult:
    return _run(QUICK if setting.quick else FULL, setting)


def _run(config: Config, setting: Setting, text: _support.DefaultText | None = None,
         model_config: dict | None = None, data: tuple[list[str], torch.Tensor] | None = None) -> ExperimentResult:
    device = resolve_device(setting.device)
    setting.status("loading the default corpus and SST-2")
    text = text or _support.default_text(config.seq_len)
    texts, labels = data or sst2()
    registry, vocab, tokenizer = text.registry, text.train.vocab, text.train.tokenizer
    objectives = {"mlm": registry.get("mlm", vocab=vocab), "rtd": registry.get("rtd", vocab=vocab),
                  "rtd15": registry.get("rtd", vocab=vocab, discriminator_positions="selected")}
    every = max(1, config.steps // config.checkpoints)
    marks = [every * (i + 1) for i in range(config.checkpoints - 1)] + [config.steps]
    figures: dict = {"checkpoints": marks, "accuracy": {}, "probe_accuracy": {}, "training_loss": {}}

    def probe(model: nn.Module) -> float:
        features = sentence_features(model, tokenizer, texts, config.probe_seq_len, device)
        return float(probe_correct(features, labels, config.folds, setting.seed)[0].double().mean())

    def finetune(model: nn.Module) -> float:
        return float(finetune_correct(model, tokenizer, texts, labels, config.folds, setting.seed,
                                      config.probe_seq_len, device, config.finetune)[0].double().mean())

    for arm, objective in objectives.items():
        model = _support.mlm_model(registry, objective, setting.seed, model_config).to(device)
        if arm == "mlm":
            setting.status("fine-tuning the untrained model")
            figures["probe_accuracy"]["untrained"] = probe(model)
            figures["accuracy"]["untrained"] = finetune(model)
        setting.status(f"training {arm} for {config.steps} steps")
        measured: list[float] = []
        losses = _support.train(model, objective, text.train, steps=config.steps, batch_size=config.batch_size,
                                lr=config.lr, seed=setting.seed, device=device, measure_after=marks,
                                measure=lambda trained, into=measured: into.append(probe(trained)))
        figures["probe_accuracy"][arm] = measured
        figures["training_loss"][arm] = _support.loss_summary(losses)
        setting.status(f"fine-tuning {arm} on SST-2")
        figures["accuracy"][arm] = finetune(model)
    acc = figures["accuracy"]
    figures["gap"] = {"rtd_minus_mlm": acc["rtd"] - acc["mlm"], "rtd_minus_rtd15": acc["rtd"] - acc["rtd15"]}
    figures["effect"] = _support.finite(min(figures["gap"].values()))
    verdict, reason = seed_verdict(figures)
    plots = [_plot(figures, config, setting)] if setting.out_dir is not None else []
    probe = (f"SST-2 dev ({len(texts)} sentences), {config.folds}-fold fine-tune (backbone + linear head, "
             f"{config.finetune_epochs} epochs, AdamW {config.finetune_lr:g}); frozen logistic-regression probe beside it")
    return ExperimentResult(NAME, CLAIM, verdict, reason, figures,
                            _support.settings(config, setting, device, model=model_config or "default",
                                              probe=probe),
                            plots)


def _plot(figures: dict, config: Config, setting: Setting) -> str:
    from matplotlib.figure import Figure

    figure = Figure(figsize=(5.5, 3.5))
    ax = figure.subplots()
    seen = [mark * config.batch_size for mark in figures["checkpoints"]]
    for arm, color in zip(ARMS, ("tab:blue", "tab:red", "tab:orange")):
        ax.plot(seen, figures["probe_accuracy"][arm], marker=".", linestyle="--", color=color, alpha=0.6,
                label=f"{arm} frozen probe")
        ax.plot(seen[-1], figures["accuracy"][arm], marker="o", markersize=8, linestyle="none", color=color,
                label=f"{arm} fine-tuned")
    ax.axhline(figures["accuracy"]["untrained"], color="grey", linestyle=":", label="untrained, fine-tuned")
    ax.axhline(figures["probe_accuracy"]["untrained"], color="grey", linestyle="--", alpha=0.5,
               label="untrained, frozen probe")
    ax.set_xlabel("training rows seen")
    ax.set_ylabel("SST-2 accuracy (5-fold)")
    ax.legend(fontsize=8)
    ax.set_title(f"Sample efficiency of RTD vs MLM (seed {setting.seed})", fontsize=10)
    figure.tight_layout()
    return save_figure(figure, setting.out_dir / f"{NAME}.png")


def seed_verdict(figures: dict[str, Any]) -> tuple[str, str]:
    """One seed's verdict and reason from its figures (``recombine`` reads them again after a rule change)."""
    acc, gaps = figures["accuracy"], figures["gap"]
    effect = _support.finite(min(gaps.values()))
    steps = figures["training_loss"]["rtd"]["steps"]
    reason = (f"SST-2 fine-tuned accuracy after {steps} steps: rtd {acc['rtd']:.3f}, mlm {acc['mlm']:.3f}, "
              f"rtd15 {acc['rtd15']:.3f} (untrained {acc['untrained']:.3f}); gaps "
              f"rtd-mlm {gaps['rtd_minus_mlm']:+.3f}, rtd-rtd15 {gaps['rtd_minus_rtd15']:+.3f}; effect "
              f"{effect:+.3f} (one seed: no between-seed interval)")
    return verdict_from_interval(effect, effect, THRESHOLD, DIRECTION), reason
