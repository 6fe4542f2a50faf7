"""Entropy masking: masking the tokens a model finds surprising gives a larger learning signal and
learns faster than uniform masking.

**Claim.** Masking in proportion to the model's own surprisal (difficulty-aware masking) puts
the loss on the tokens the model gets wrong, so each step carries a larger learning signal (a
higher masked-token loss: the size-biased mean ``(σ²+μ²)/μ`` instead of ``μ``), and the model
learns faster than with uniform random masking at the same budget. Sources: Zhong et al. 2023
(Self-Evolution Learning for Discriminative Language Model Pretraining, Findings of ACL, §3),
Yang et al. 2023 (Learning Better Masking for Better Language Model Pre-training, ACL, §1);
the size-biased mean itself is a unit test of the ``entropy`` policy
(tests/toolkit/test_selection.py), not evidence here.

**Setting.** The default model is built twice from one initialisation and trained on the same
rows of the default corpus: ``mlm`` with ``masking_policy=uniform`` and with
``masking_policy=entropy`` (surprisal from the model being trained, recomputed every step), 15%
budget (quick: 100 AdamW steps of 16 rows × 64 tokens; full: 300 steps of 16 × 128). Both are
read on the same held-out rows (quick: 64 rows; full: 256) under each twin's own masking
distribution, the same masks for both models: *uniform* 15% masking, and *entropy* masking drawn
with the entropy twin's surprisal (the masks that twin trained on). Reading both twins only under
uniform masks scores them on the uniform twin's own distribution, a bias towards it.
:data:`MINILM` (not the full setting) continues all-MiniLM-L6-v2 instead, on WikiText-2 at 1e-4,
after fitting its MLM head alone (the checkpoint ships none, and the entropy policy reads its
surprisal through that head); both twins start from that one fitted model.

**Measured.** *Signal*: the ratio of the two models' mean training loss (each on the tokens its
own policy masked) over the second half of training. *Speed*: under each masking distribution,
the held-out masked loss of the uniform model minus the entropy model's (nats; positive means
entropy masking learned more in the same steps), with a within-seed bootstrap over held-out rows.
*Downstream* (reported, not in the rule): each twin's cross-validated SST-2 linear-probe accuracy
(:mod:`objreg.experiments.sst2_probe`) and their difference entropy − uniform; these small models'
probes sit near chance (rtd-efficiency's precondition), so it cannot decide the claim here.

**Verdict.** Over seeds, each part a mean with a between-seed 95% t-interval: the signal ratio
above 1, and the held-out gain above 0 under uniform masks (``heldout_gain``, the effect) and
under entropy masks (``heldout_gain_entropy_masks``). ``confirmed`` when all three are;
``refuted`` when the signal ratio lies wholly below 1, or the gain wholly below 0 under *both*
distributions (the entropy twin learned less even on its own masks); ``inconclusive`` otherwise.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from objreg.analysis.math.stats import bootstrap_ci95
from objreg.analysis.parallel.devices import resolve_device
from objreg.analysis.run.prepare import build_model
from objreg.experiments import _support
from objreg.experiments.base import CONFIRMED, INCONCLUSIVE, REFUTED, ExperimentResult, Setting, save_figure
from objreg.experiments.preconditions import Precondition
from objreg.experiments.replication import combine_parts
from objreg.experiments.sst2_probe import probe_correct, sentence_features, sst2
from objreg.toolkit.randomness import stream

NAME = "entropy-masking"
CLAIM = ("Masking the tokens the model finds most surprising gives each step a larger learning signal (higher "
         "masked-token loss) and learns faster (lower held-out masked-LM loss after the same steps) than uniform "
         "random masking at the same budget.")
SOURCE = ("Zhong et al. 2023, Self-Evolution Learning for Discriminative Language Model Pretraining, Findings of "
          "ACL, section 3; Yang et al. 2023, Learning Better Masking for Better Language Model Pre-training, ACL")
RULE = ("Over seeds (95% between-seed t-intervals): the training-loss ratio entropy/uniform lies above 1, and the "
        "held-out masked loss of the uniform twin minus the entropy twin lies above 0 under uniform masks and under "
        "entropy masks (the entropy twin's surprisal): confirmed when all three hold; refuted when the ratio lies "
        "wholly below 1 or the loss difference wholly below 0 under both masks; else inconclusive.")
PARTS = {"signal_ratio": (1.0, "above"), "heldout_gain": (0.0, "above"), "heldout_gain_entropy_masks": (0.0, "above")}
SPEED = ("heldout_gain", "heldout_gain_entropy_masks")
POLICIES = ("uniform", "entropy")
#: A speed compares twins that learned: each one's training loss (on its own masks) fell by at least a nat.
PRECONDITIONS = (Precondition(
    "both_twins_learned", "the smaller fall of the two twins' training loss, mean of the first 10 steps minus "
    "mean of the last 10 (nats, each on its own masks)", 1.0, "above",
    lambda figures, setting: min(loss["first"] - loss["last"] for loss in figures["training_loss"].values())),)


@dataclass(frozen=True)
class Config:
    """Sizes of the experiment."""

    steps: int = 100
    batch_size: int = 16
    seq_len: int = 64
    lr: float = 1e-3
    rows: int = 64
    folds: int = 5
    probe_seq_len: int = 64
    #: ``default``: the default model from its random start on the built-in corpus; ``minilm``:
    #: all-MiniLM-L6-v2 continued on WikiText-2 with its own tokenizer.
    model: str = "default"
    #: Steps fitting the MLM head alone at 1e-3, backbone frozen, before the twins part (MiniLM
    #: ships no MLM head, and the entropy policy reads its surprisal through that head).
    lm_head_steps: int = 0


QUICK = Config()
TOY = Config(steps=300, seq_len=128, rows=256)
MINILM = Config(steps=300, seq_len=128, rows=256, lr=1e-4, model="minilm", lm_head_steps=150)
FULL = TOY


def run(setting: Setting) -> ExperimentResult:
    return _run(QUICK if setting.quick else FULL, setting)


def combine(results: list[ExperimentResult], setting: Setting) -> ExperimentResult:
    overall = combine_parts(results, setting, PARTS)
    if len(results) > 1:
        overall.verdict = decide({key: part["verdict"] for key, part in overall.figures["parts"].items()})
        overall.figures["tests"] = {key: {**test, "verdict": overall.figures["parts"][key]["verdict"]}
                                    for key, test in overall.figures["tests"].items()}
    return overall


def decide(verdicts: dict[str, str]) -> str:
    """The claim's verdict from its parts' (see the module docstring): the speed is refuted only
    when the entropy twin learned less under both twins' masking distributions."""
    if all(verdicts[key] == CONFIRMED for key in PARTS):
        return CONFIRMED
    if verdicts["signal_ratio"] == REFUTED or all(verdicts[key] == REFUTED for key in SPEED):
        return REFUTED
    return INCONCLUSIVE


def _run(config: Config, setting: Setting, text: _support.DefaultText | None = None,
         model_config: dict | None = None, data: tuple[list[str], torch.Tensor] | None = None,
         model_path: str | None = None) -> ExperimentResult:
    """One seed of ``config``; the tests pass small stand-ins (``text``, a ``model_config`` for the
    default model, ``data``, and ``model_path`` for MiniLM's)."""
    device = resolve_device(setting.device)
    source = _support.model_source(config.model, model_path)
    text = text or _support.setting_text(config.model, config.seq_len, source)
    texts, labels = data or sst2()
    vocab, tokenizer = text.train.vocab, text.train.tokenizer
    uniform = text.registry.get("mlm", vocab=vocab)
    rows = _support.heldout_rows(text.heldout, config.rows, setting.seed)
    batches = {"uniform": uniform.corrupt(rows, stream(setting.seed, "heldout_corruption"))}
    losses, models, probe = {}, {}, {}
    start = build_model(text.registry, source, vocab, {uniform.name: uniform.info.heads}, setting.seed,
                        model_config).to(device)
    head_fit = []
    if config.lm_head_steps:
        setting.status(f"fitting the MLM head alone for {config.lm_head_steps} steps")
        head_fit = _support.fit_lm_head(start, uniform, text.train, steps=config.lm_head_steps,
                                        batch_size=config.batch_size, lr=1e-3, seed=setting.seed, device=device)
    for policy in POLICIES:
        setting.status(f"training with {policy} masking ({config.steps} steps)")
        objective = text.registry.get("mlm", vocab=vocab, masking_policy=policy)
        models[policy] = model = copy.deepcopy(start)  # twins: one initialisation, one fitted head
        losses[policy] = _support.train(model, objective, text.train, steps=config.steps,
                                        batch_size=config.batch_size, lr=config.lr, seed=setting.seed, device=device)
        features = sentence_features(model, tokenizer, texts, config.probe_seq_len, device)
        probe[policy] = float(probe_correct(features, labels, config.folds, setting.seed)[0].double().mean())
    # The entropy twin's own masks: its policy's weights from its own surprisal on the held-out rows.
    entropy = text.registry.get("mlm", vocab=vocab, masking_policy="entropy")
    prepared = entropy.prepare(rows.to(device), models["entropy"]).to("cpu")
    batches["entropy"] = entropy.corrupt(prepared, stream(setting.seed, "entropy_heldout_corruption"))
    heldout = {masks: {policy: _support.mean_loss(models[policy], uniform, batch, device) for policy in POLICIES}
               for masks, batch in batches.items()}
    half = config.steps // 2
    signal = float(np.mean(losses["entropy"][half:]) / np.mean(losses["uniform"][half:]))
    gains, intervals = {}, {}
    for masks, loss in heldout.items():
        gain_rows = loss["uniform"] - loss["entropy"]
        gains[masks] = _support.finite(float(gain_rows.mean()))
        intervals[masks] = list(bootstrap_ci95(gain_rows, seed=[setting.seed, 5]))
    figures = {
        "effect": gains["uniform"], "effect_ci95_within_seed": intervals["uniform"],
        "parts": {"signal_ratio": _support.finite(signal), "heldout_gain": gains["uniform"],
                  "heldout_gain_entropy_masks": gains["entropy"]},
        "heldout_gain_ci95_within_seed": intervals,
        "heldout_loss": {p: float(v.mean()) for p, v in heldout["uniform"].items()},
        "heldout_loss_entropy_masks": {p: float(v.mean()) for p, v in heldout["entropy"].items()},
        "downstream": {"sst2_probe_accuracy": probe, "gain": probe["entropy"] - probe["uniform"]},
        "training_loss": {p: _support.loss_summary(v) for p, v in losses.items()},
        "lm_head_fit_loss": _support.loss_summary(head_fit),
    }
    verdict, reason = seed_verdict(figures)
    plots = [_plot(losses, heldout["uniform"], setting)] if setting.out_dir is not None else []
    return ExperimentResult(NAME, CLAIM, verdict, reason, figures,
                            _support.settings(config, setting, device,
                                              model=_support.model_name(config.model, model_config)),
                            plots)


def _plot(losses: dict, heldout: dict, setting: Setting) -> str:
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6, 3.5))
    axes = figure.add_subplot()
    for policy, values in losses.items():
        axes.plot(values, label=f"{policy}: training loss (own masks); held-out {heldout[policy].mean():.3f}")
    axes.set_xlabel("step")
    axes.set_ylabel("masked-token loss (nats)")
    axes.set_title(f"Entropy vs uniform masking, seed {setting.seed}")
    axes.legend(fontsize=7)
    figure.tight_layout()
    return save_figure(figure, setting.out_dir / f"{NAME}.png")


def seed_verdict(figures: dict[str, Any]) -> tuple[str, str]:
    """One seed's verdict and reason from its figures (``recombine`` reads them again after a rule change):
    the within-seed intervals decide each speed part; the signal is above 1 or not."""
    signal, intervals = figures["parts"]["signal_ratio"], figures["heldout_gain_ci95_within_seed"]
    part = {m: f"heldout_gain{'' if m == 'uniform' else '_entropy_masks'}" for m in intervals}
    gains = {m: figures["parts"][key] for m, key in part.items()}
    verdict = decide({"signal_ratio": CONFIRMED if signal > 1 else REFUTED,
                      **{part[m]: _support.verdict_from_interval(*intervals[m]) for m in intervals}})
    reason = (f"training-loss ratio entropy/uniform {signal:.3f} (second half of training); held-out loss uniform − "
              "entropy " + ", ".join(f"under {m} masks {gains[m]:+.4f} nats (within-seed bootstrap "
                                     f"[{intervals[m][0]:+.4f}, {intervals[m][1]:+.4f}])" for m in intervals)
              + f"; SST-2 probe accuracy entropy − uniform {figures['downstream']['gain']:+.4f} (reported)")
    return verdict, reason
