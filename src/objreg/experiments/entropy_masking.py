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
read on the same held-out rows with the same *uniform* 15% masking (quick: 64 rows; full: 256).

**Measured.** *Signal*: the ratio of the two models' mean training loss (each on the tokens its
own policy masked) over the second half of training. *Speed*: the held-out uniform-masked loss
of the uniform model minus the entropy model's (nats; positive means entropy masking learned
more in the same steps), with a within-seed bootstrap over held-out rows.

**Verdict.** Two parts over seeds, each a mean with a between-seed 95% t-interval: the signal
ratio above 1 and the held-out loss difference (the effect) above 0. ``confirmed`` when both
are, ``refuted`` when either lies wholly on the wrong side, ``inconclusive`` otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from objreg.analysis.math.stats import bootstrap_ci95
from objreg.analysis.parallel.devices import resolve_device
from objreg.experiments import _support
from objreg.experiments.base import ExperimentResult, Setting, save_figure, verdict_from_interval
from objreg.experiments.replication import combine_parts
from objreg.toolkit.randomness import stream

NAME = "entropy-masking"
CLAIM = ("Masking the tokens the model finds most surprising gives each step a larger learning signal (higher "
         "masked-token loss) and learns faster (lower held-out masked-LM loss after the same steps) than uniform "
         "random masking at the same budget.")
SOURCE = ("Zhong et al. 2023, Self-Evolution Learning for Discriminative Language Model Pretraining, Findings of "
          "ACL, section 3; Yang et al. 2023, Learning Better Masking for Better Language Model Pre-training, ACL")
RULE = ("Over seeds (95% between-seed t-intervals): the training-loss ratio entropy/uniform lies above 1 and the "
        "held-out uniform-masked loss of the uniform twin minus the entropy twin lies above 0: confirmed; either "
        "wholly on the other side: refuted; else inconclusive.")
PARTS = {"signal_ratio": (1.0, "above"), "heldout_gain": (0.0, "above")}


@dataclass(frozen=True)
class Config:
    """Sizes of the experiment."""

    steps: int = 100
    batch_size: int = 16
    seq_len: int = 64
    lr: float = 1e-3
    rows: int = 64


QUICK = Config()
FULL = Config(steps=300, seq_len=128, rows=256)


def run(setting: Setting) -> ExperimentResult:
    return _run(QUICK if setting.quick else FULL, setting)


def combine(results: list[ExperimentResult], setting: Setting) -> ExperimentResult:
    return combine_parts(results, setting, PARTS)


def _run(config: Config, setting: Setting, text: _support.DefaultText | None = None,
         model_config: dict | None = None) -> ExperimentResult:
    device = resolve_device(setting.device)
    text = text or _support.default_text(config.seq_len)
    vocab = text.train.vocab
    uniform = text.registry.get("mlm", vocab=vocab)
    rows = _support.heldout_rows(text.heldout, config.rows, setting.seed)
    batch = uniform.corrupt(rows, stream(setting.seed, "heldout_corruption"))
    losses, heldout = {}, {}
    for policy in ("uniform", "entropy"):
        setting.status(f"training with {policy} masking ({config.steps} steps)")
        objective = text.registry.get("mlm", vocab=vocab, masking_policy=policy)
        model = _support.mlm_model(text.registry, uniform, setting.seed, model_config).to(device)
        losses[policy] = _support.train(model, objective, text.train, steps=config.steps,
                                        batch_size=config.batch_size, lr=config.lr, seed=setting.seed, device=device)
        heldout[policy] = _support.mean_loss(model, uniform, batch, device)
    half = config.steps // 2
    signal = float(np.mean(losses["entropy"][half:]) / np.mean(losses["uniform"][half:]))
    gain_rows = heldout["uniform"] - heldout["entropy"]
    gain = float(gain_rows.mean())
    low, high = bootstrap_ci95(gain_rows, seed=[setting.seed, 5])
    figures = {
        "effect": _support.finite(gain), "effect_ci95_within_seed": [low, high],
        "parts": {"signal_ratio": _support.finite(signal), "heldout_gain": gain},
        "heldout_loss": {p: float(v.mean()) for p, v in heldout.items()},
        "training_loss": {p: _support.loss_summary(v) for p, v in losses.items()},
    }
    # One seed: the speed part's within-seed interval decides, unless the signal is not larger.
    verdict = verdict_from_interval(low, high) if signal > 1 else "refuted"
    reason = (f"training-loss ratio entropy/uniform {signal:.3f} (second half of training); held-out loss "
              f"uniform − entropy {gain:+.4f} nats (within-seed bootstrap [{low:+.4f}, {high:+.4f}])")
    plots = [_plot(losses, heldout, setting)] if setting.out_dir is not None else []
    return ExperimentResult(NAME, CLAIM, verdict, reason, figures,
                            _support.settings(config, setting, device),
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
