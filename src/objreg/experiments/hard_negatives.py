"""Hard negatives: an RTD discriminator trained on a generator's plausible replacements detects
plausible replacements better than one trained on random replacements.

**Claim.** ELECTRA trains its discriminator on replacements sampled from a small MLM generator
rather than on easy random ones: plausible-in-context negatives are harder and make the better
discriminator; a generator that is too strong makes the task too hard (Clark et al. 2020,
ELECTRA, ICLR 2020, §3.2 and Figure 3, "the generator as a challenging but not too challenging
task"; hard negatives sharpen the task as in Robinson et al. 2021, ICLR 2021, for contrastive
learning). Tested here: on a common held-out set of plausible replacements, the discriminator
trained with a generator has a lower detection error than one trained on random replacements.

**Setting.** The default model is trained with ``rtd`` three times from one initialisation on the
same rows and the same corruption draws (the same positions are replaced; AdamW 1e-3; quick: 100
steps of 16 rows of 64 tokens; full: 600 steps), differing only in where
the replacements come from:

* ``random`` (the easy-negative baseline): ``temperature=1000``, so the generator's softmax is
  flat and a replacement is a uniformly random ordinary token (the generator still trains, at the
  same cost);
* ``generator``: ELECTRA as published (``temperature=1``);
* ``hard``: ``hard_negatives=true`` (``β = 1``: the generator's distribution squared, without the
  original token), harder still.

**Measured.** Two held-out replaced-token sets on the same held-out rows and positions (15% of
ordinary tokens, never the original token): *plausible*, drawn from a reference cloze model
(:class:`objreg.experiments.cloze_reference.ClozeCounts`: the tokens the training split has
between the position's two neighbours, in proportion to their counts, backing off to the tokens
after its left neighbour and to the unigram; none of the three discriminators trained against
it), and *random*, uniform over ordinary tokens. Each discriminator scores every real token; its error is the ranking error
``1 − AUC`` of its scores for "replaced" (the chance that a random original token outscores a
random replaced one: 0.5 for a scorer that ignores its input, whatever its threshold). The
balanced error at logit 0 (mean of the miss rate on replaced tokens and the false-alarm rate on
original ones) is reported too, but it degenerates: a discriminator still below logit 0 on every
token, as ELECTRA's is early in training with 15% replaced, reads exactly 0.5 however well it
ranks. The reference's top-1 accuracy at the positions (and the unigram baseline's: always the
most frequent token) is reported, as is each arm's training loss.

**Precondition** (``reference_is_plausible``): the reference's top-1 accuracy at the held-out
positions above 0.2 on every seed, about three times the unigram baseline's (0.06 on the default
corpus): replacements from a reference that cannot predict the original are hardly "plausible".

**Verdict.** Per seed, effect = ranking error of ``random`` minus that of ``generator`` on the
plausible set. Over seeds: the mean with a 95% t-interval; ``confirmed`` when it lies wholly above
0, ``refuted`` when wholly below. Null: harder training negatives do not help; the random-trained
discriminator detects plausible replacements as well. The random set shows the other side (a
discriminator trained on plausible negatives may miss blatant ones); it is reported, not part of
the rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from scipy.stats import rankdata
from torch import nn

from objreg import IGNORE_INDEX, CorruptedBatch, Objective, Vocabulary
from objreg.analysis.parallel.devices import resolve_device
from objreg.experiments import _support
from objreg.experiments.base import ExperimentResult, Setting, save_figure, verdict_from_interval
from objreg.experiments.cloze_reference import ClozeCounts, neighbours
from objreg.experiments.preconditions import Precondition
from objreg.toolkit.randomness import stream
from objreg.toolkit.replacement import ordinary_ids

NAME = "hard-negatives"
CLAIM = ("Replacements sampled from a small MLM generator are harder negatives than random tokens and train a better "
         "replaced-token discriminator: it detects plausible replacements with lower error (a generator that is too "
         "strong makes the task too hard).")
SOURCE = ("Clark et al., ELECTRA, ICLR 2020, §3.2 and Figure 3; hard negatives as in Robinson et al., "
          "Contrastive Learning with Hard Negative Samples, ICLR 2021")
RULE = ("Effect = ranking error (1 - AUC) of the random-replacement-trained discriminator minus the generator-trained "
        "one, on a common held-out set of plausible replacements; confirmed when the 95% t-interval of its mean over "
        "seeds lies wholly above 0, refuted when wholly below. Precondition: the reference's top-1 accuracy at the "
        "held-out positions above 0.2 on every seed.")
THRESHOLD = 0.0
DIRECTION = "above"
#: The three ways of drawing training replacements: rtd parameters.
ARMS = {"random": {"temperature": 1000.0}, "generator": {}, "hard": {"hard_negatives": True}}
SETS = ("plausible", "random")
RATES = ("ranking_error", "balanced_error", "miss_rate", "false_alarm_rate")
#: The reference must predict the original token well above the unigram baseline for its samples to be plausible.
PRECONDITIONS = (Precondition(
    "reference_is_plausible", "the reference cloze model's top-1 accuracy at the held-out positions", 0.2, "above",
    lambda figures, setting: figures["reference_top1_accuracy"]),)


@dataclass(frozen=True)
class Config:
    """Sizes of the experiment."""

    steps: int
    seq_len: int
    eval_rows: int
    batch_size: int = 16
    lr: float = 1e-3


QUICK = Config(steps=100, seq_len=64, eval_rows=128)
FULL = Config(steps=600, seq_len=64, eval_rows=256)


def run(setting: Setting) -> ExperimentResult:
    return _run(QUICK if setting.quick else FULL, setting)


def _run(config: Config, setting: Setting, text: _support.DefaultText | None = None,
         model_config: dict | None = None) -> ExperimentResult:
    device = resolve_device(setting.device)
    setting.status("loading the default corpus")
    text = text or _support.default_text(config.seq_len)
    registry, vocab = text.registry, text.train.vocab
    figures: dict = {"training_loss": {}, **{name: {} for name in RATES}}

    setting.status("counting the reference cloze model")
    reference = ClozeCounts(text.train)
    rtd = registry.get("rtd", vocab=vocab)
    rows = text.heldout.sample(config.eval_rows, stream(setting.seed, "heldout_rows"))
    positions_batch = rtd.corrupt(rows, stream(setting.seed, "heldout_corruption"))
    sets, accuracy = replaced_sets(reference, positions_batch, vocab, stream(setting.seed, "replacements"))
    figures.update(reference_top1_accuracy=accuracy["reference"], unigram_top1_accuracy=accuracy["unigram"])
    positions_batch = positions_batch.to(device)
    sets = {name: (replaced.to(device), is_replaced.to(device)) for name, (replaced, is_replaced) in sets.items()}

    for arm, params in ARMS.items():
        objective = registry.get("rtd", vocab=vocab, **params)
        model = _support.mlm_model(registry, objective, setting.seed, model_config).to(device)
        setting.status(f"training the {arm} discriminator for {config.steps} steps")
        losses = _support.train(model, objective, text.train, steps=config.steps, batch_size=config.batch_size,
                                lr=config.lr, seed=setting.seed, device=device)
        figures["training_loss"][arm] = _support.loss_summary(losses)
        for name in RATES:
            figures[name][arm] = {}
        for name, (replaced, is_replaced) in sets.items():
            rates = detection_error(model, rtd, positions_batch, replaced, is_replaced)
            for key, value in rates.items():
                figures[key][arm][name] = value
    ranking = figures["ranking_error"]
    figures["effect"] = _support.finite(ranking["random"]["plausible"] - ranking["generator"]["plausible"])
    verdict, reason = seed_verdict(figures)
    plots = [_plot(figures, setting)] if setting.out_dir is not None else []
    return ExperimentResult(NAME, CLAIM, verdict, reason, figures,
                            _support.settings(config, setting, device, model=model_config or "default",
                                              arms=ARMS), plots)


def replaced_sets(reference: ClozeCounts, batch: CorruptedBatch, vocab: Vocabulary,
                  generator: torch.Generator) -> tuple[dict, dict[str, float]]:
    """The held-out sets: ``{"plausible" | "random": (replaced ids [B, T], is_replaced [B, T])}``,
    both replacing exactly the positions ``batch`` selected (its labels), never by the original
    token; plausible ones drawn from ``reference`` in each position's original context. Also the
    top-1 accuracy there of the reference and of the unigram baseline (``{"reference", "unigram"}``)."""
    selected = batch.labels != IGNORE_INDEX  # (B, T)
    clean = torch.where(selected, batch.labels, batch.input_ids)  # (B, T): the row before corruption
    rows, positions = torch.nonzero(selected, as_tuple=True)
    originals = clean[rows, positions].tolist()
    contexts = [neighbours(clean, vocab, r, p) for r, p in zip(rows.tolist(), positions.tolist())]
    top1 = sum(reference.top1(*context) == original for context, original in zip(contexts, originals))
    unigram = sum(reference.unigram_top1() == original for original in originals)
    plausible = torch.tensor([reference.sample(*context, original, generator)
                              for context, original in zip(contexts, originals)], dtype=clean.dtype)
    pool = ordinary_ids(vocab, clean.device)
    # Uniform over the ordinary tokens other than the original: an index into the pool without it.
    index = torch.randint(len(pool) - 1, (len(originals),), generator=generator)
    target = torch.tensor(originals, dtype=clean.dtype)
    random = pool[index + (index >= torch.searchsorted(pool, target)).long()]
    sets = {}
    for name, draws in (("plausible", plausible), ("random", random)):
        replaced = clean.clone()
        replaced[rows, positions] = draws
        sets[name] = (replaced, replaced != clean)
    count = max(len(originals), 1)
    return sets, {"reference": top1 / count, "unigram": unigram / count}


@torch.no_grad()
def detection_error(model: nn.Module, rtd: Objective, batch: CorruptedBatch, replaced: torch.Tensor,
                    is_replaced: torch.Tensor) -> dict:
    """Over every real token: the ranking error ``1 − AUC`` of the discriminator's scores (the
    chance that a random original token scores above a random replaced one, ties counting half),
    and at logit 0 the miss rate (replaced tokens scored original), the false-alarm rate (original
    tokens scored replaced) and their mean, the balanced error."""
    hidden = model.encode(replaced, rtd.attention_mask(batch), batch.position_ids)
    scores = model.heads["discriminator"](hidden).squeeze(-1)  # (B, T)
    real = ~batch.is_padding
    says_replaced = scores > 0
    miss = float((~says_replaced & is_replaced & real).sum() / (is_replaced & real).sum().clamp(min=1))
    false_alarm = float((says_replaced & ~is_replaced & real).sum() / (~is_replaced & real).sum().clamp(min=1))
    return {"ranking_error": 1.0 - auc(scores[real], is_replaced[real]), "miss_rate": miss,
            "false_alarm_rate": false_alarm, "balanced_error": 0.5 * (miss + false_alarm)}


def auc(scores: torch.Tensor, positive: torch.Tensor) -> float:
    """The area under the ROC curve of ``scores`` for ``positive`` (Mann-Whitney, mid-ranks for ties)."""
    ranks = torch.from_numpy(rankdata(scores.double().cpu().numpy()))
    positive = positive.cpu()
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    if n_pos == 0 or n_neg == 0:
        raise ValueError("AUC needs both replaced and original tokens")
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def _plot(figures: dict, setting: Setting) -> str:
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6, 3.5))
    ax = figure.subplots()
    arms = list(ARMS)
    width = 0.38
    for i, (name, color) in enumerate(zip(SETS, ("tab:red", "tab:grey"))):
        values = [figures["ranking_error"][arm][name] for arm in arms]
        ax.bar([j + (i - 0.5) * width for j in range(len(arms))], values, width, color=color,
               label=f"held-out {name} replacements")
    ax.set_xticks(range(len(arms)), [f"trained on {arm}" for arm in arms])
    ax.axhline(0.5, color="black", linestyle=":", linewidth=1)
    ax.set_ylabel("ranking error (1 - AUC)")
    ax.legend(fontsize=8)
    ax.set_title(f"Discriminator error by training negatives (seed {setting.seed})", fontsize=10)
    figure.tight_layout()
    return save_figure(figure, setting.out_dir / f"{NAME}.png")


def seed_verdict(figures: dict[str, Any]) -> tuple[str, str]:
    """One seed's verdict and reason from its figures (``recombine`` reads them again after a rule change)."""
    ranking = figures["ranking_error"]
    effect = _support.finite(ranking["random"]["plausible"] - ranking["generator"]["plausible"])
    reason = (f"ranking error (1 - AUC) on plausible held-out replacements: random-trained "
              f"{ranking['random']['plausible']:.3f}, generator-trained {ranking['generator']['plausible']:.3f}, "
              f"hard-trained {ranking['hard']['plausible']:.3f}; on random replacements {ranking['random']['random']:.3f}, "
              f"{ranking['generator']['random']:.3f}, {ranking['hard']['random']:.3f}; effect {effect:+.3f} "
              "(one seed: no between-seed interval)")
    return verdict_from_interval(effect, effect, THRESHOLD, DIRECTION), reason
