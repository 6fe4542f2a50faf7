"""Consistency collapse: without the stop-gradient, a siamese consistency loss collapses the
representation; with it, it does not.

**Claim.** In a siamese consistency objective (two augmented views of one input, a predictor on
one branch, the negative cosine between the predictor's output and the other branch's output), the
stop-gradient on the target branch prevents representational collapse: without it the
optimizer finds the degenerate solution at once (loss −1, the per-dimension std of the
l2-normalised output goes to 0), with it the std stays near ``1/√d``. Source: Chen & He 2021,
Exploring Simple Siamese Representation Learning (SimSiam), CVPR 2021, §4.1 and Figure 2.

**Setting.** The two views of a row are two disjoint spans of it: its tokens before a split point
drawn uniformly for each row (each view keeps at least one token) and its tokens from that point
on, each framed ``[CLS] … [SEP]`` as a row of its own (:func:`two_views`). Rows hold consecutive
sentences of one document of the default corpus, so the views share their document and no token:
like SimSiam's crops of one image, they can be matched only through what they are about, never
exactly, and (the split drawn at random) not by their lengths. The default backbone (initialised
from the seed) is followed by SimSiam's heads at the backbone's width ``d``: the representation
``z`` = a projector on the mean of the backbone's output over the row's real tokens,
``BN(W₂ relu(BN(W₁ x)))``, and a bottleneck predictor ``p = W₄ relu(BN(W₃ z))`` (width
``d/4``). Loss ``½ D(p₁, sg z₂) + ½ D(p₂, sg z₁)``, ``D`` the negative cosine. Two runs from one
initialisation on the same rows and the same views, differing only in ``sg``: *stop-gradient*
(``detach``) and *no stop-gradient* (identity). SimSiam's optimizer (SGD, momentum 0.9, weight
decay 1e-4, lr 0.05; quick: 60 steps of 32 rows of 64 tokens; full: 400 steps). The same pair is
run again with every batch norm removed from the heads (reported, not part of the rule:
SimSiam's §4.4 finds batch norm helps optimisation, not that it prevents collapse).

**Measured.** On held-out rows (quick 256, full 512; the first view of each, split at its
middle), the per-dimension standard deviation over rows of ``z/‖z‖``, averaged over dimensions
and multiplied by ``√d``: about 1 for an output spread like a random Gaussian vector, 0 for a
collapsed one (SimSiam's Figure 2, middle, in units of ``1/√d``). Measured at initialisation and
after training. It can also read near 0 for a representation that did not collapse but is
dominated by one shared direction (then all rows point the same way): that is what SimSiam's
metric calls collapse too.

**Verdict.** The per-seed effect is the normalised std with the stop-gradient minus without it,
after training. Over seeds: the mean effect with a 95% t-interval; ``confirmed`` when it lies
wholly above 0.25 (the stop-gradient keeps at least a quarter of an uncollapsed output's spread
more than the run without it), ``refuted`` when it lies wholly below, ``inconclusive`` otherwise.
The null (the stop-gradient makes no difference) predicts an effect near 0.

**Precondition** (``no_stop_gradient_collapses``, the positive control): with SimSiam's heads the
run without the stop-gradient collapses, its normalised std after training below
:data:`COLLAPSED` (0.1) on every seed. Without a collapse to prevent, the effect says nothing about
the stop-gradient: the verdict is then ``inconclusive (precondition failed: …)``, never ``refuted``.

objreg's own consistency modifier (``consistency_weight``) is a KL between the two views' MLM
predictions, always added to the MLM loss, which anchors the output: collapse cannot arise there
with or without ``sg``, so the mechanism is tested in SimSiam's pure form. Until 2026-11-27 the
views were that modifier's (two 15% maskings of one row, 200 steps): they share most of their
tokens, every run matched them exactly (loss −1) without collapsing, and the positive control
failed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from objreg import IGNORE_INDEX, CorruptedBatch, DataError, Objective, TokenBatch
from objreg.analysis.parallel.devices import resolve_device
from objreg.experiments import _support
from objreg.experiments.base import ExperimentResult, Setting, save_figure, verdict_from_interval
from objreg.experiments.preconditions import Precondition
from objreg.toolkit.randomness import stream
from objreg.toolkit.seq2seq import compact, row_document

NAME = "consistency-collapse"
CLAIM = ("In siamese consistency learning the stop-gradient prevents collapse: without it the output collapses (the "
         "per-dimension std of the l2-normalised output goes to 0); with it the std stays near 1/sqrt(d).")
SOURCE = "Chen & He, Exploring Simple Siamese Representation Learning (SimSiam), CVPR 2021, §4.1 and Figure 2"
RULE = ("Effect = sqrt(d) x std of the l2-normalised output with stop-gradient minus without, after training; "
        "confirmed when the 95% t-interval of its mean over seeds lies wholly above 0.25, refuted when wholly below. "
        "Precondition (positive control): with SimSiam's heads the no-stop-gradient run collapses, its normalised std "
        "after training below 0.1 on every seed.")
THRESHOLD = 0.25
DIRECTION = "above"
ARMS = ("stop_gradient", "no_stop_gradient")
#: The heads: SimSiam's (with batch norm; the verdict's) and the same without batch norm.
HEADS = {"simsiam": True, "no_batch_norm": False}
#: The positive control: the claim is that the stop-gradient prevents a collapse, so the run without it must
#: collapse (a tenth of an uncollapsed output's spread at most). Where it does not, an effect near 0 says
#: the setting never produces collapse, not that the stop-gradient fails to prevent it.
COLLAPSED = 0.1
PRECONDITIONS = (Precondition(
    "no_stop_gradient_collapses", "sqrt(d) x std of the l2-normalised output of the no-stop-gradient run with "
    "SimSiam's heads, after training (0: collapsed, about 1: spread)", COLLAPSED, "below",
    lambda figures, setting: figures["normalised_std"]["simsiam"]["no_stop_gradient"]["trained"]),)


@dataclass(frozen=True)
class Config:
    """Sizes of the experiment."""

    steps: int
    eval_rows: int
    batch_size: int = 32
    seq_len: int = 64
    lr: float = 0.05


QUICK = Config(steps=60, eval_rows=256)
#: What a result records as its views (the ``views`` of its setting).
VIEWS = "two disjoint spans of each row: its tokens before a split point drawn uniformly per row, and the rest"
FULL = Config(steps=400, eval_rows=512)


class Siamese(nn.Module):
    """SimSiam's projector and predictor on a backbone: ``forward(ids, mask, positions, padding)``
    gives ``(z, p)``, each ``[B, d]``. With ``batch_norm`` (SimSiam's own heads): projector
    ``BN(W₂ relu(BN(W₁ x)))``, predictor ``W₄ relu(BN(W₃ z))``; without: the same with every BN
    removed."""

    def __init__(self, model: nn.Module, width: int, generator: torch.Generator, batch_norm: bool):
        super().__init__()
        self.model = model
        norm = (lambda n: nn.BatchNorm1d(n)) if batch_norm else (lambda n: nn.Identity())
        bottleneck = width // 4
        linears = [nn.Linear(width, width), nn.Linear(width, width), nn.Linear(width, bottleneck),
                   nn.Linear(bottleneck, width)]
        self.projector = nn.Sequential(linears[0], norm(width), nn.ReLU(), linears[1], norm(width))
        self.predictor = nn.Sequential(linears[2], norm(bottleneck), nn.ReLU(), linears[3])
        for layer in linears:
            nn.init.normal_(layer.weight, 0.0, 0.02, generator=generator)  # BERT's init, from the seed
            nn.init.zeros_(layer.bias)

    def forward(self, input_ids, mask, position_ids, is_padding) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.model.encode(input_ids, mask, position_ids)  # (B, T, d)
        real = (~is_padding).unsqueeze(-1).to(hidden.dtype)
        z = self.projector((hidden * real).sum(dim=1) / real.sum(dim=1).clamp(min=1))  # (B, d)
        return z, self.predictor(z)


def simsiam_loss(z1: torch.Tensor, p1: torch.Tensor, z2: torch.Tensor, p2: torch.Tensor, stop_gradient: bool):
    """``½ D(p₁, sg z₂) + ½ D(p₂, sg z₁)`` with ``D`` the mean negative cosine; ``sg`` the identity
    when ``stop_gradient`` is False."""
    if stop_gradient:
        z1, z2 = z1.detach(), z2.detach()
    return -0.5 * (F.cosine_similarity(p1, z2, dim=-1).mean() + F.cosine_similarity(p2, z1, dim=-1).mean())


def normalised_std(z: torch.Tensor) -> float:
    """``√d`` × the mean over dimensions of the std over rows of ``z/‖z‖`` (``z`` ``[N, d]``):
    about 1 for isotropic Gaussian rows, 0 when every row points the same way."""
    unit = F.normalize(z.double(), dim=-1)
    return float(unit.std(dim=0, unbiased=False).mean() * math.sqrt(z.shape[1]))


def two_views(rows: TokenBatch, pad_id: int,
              generator: torch.Generator | None = None) -> tuple[CorruptedBatch, CorruptedBatch]:
    """The two views of each row: its tokens before a split point and its tokens from it on, each
    framed ``[CLS] … [SEP]`` like a row of its own and right-padded with ``pad_id``. The split
    point is drawn uniformly from ``generator`` (each view keeps at least one token), or, without
    one, is the middle (the larger half first). The views share no token of the row, only its
    document: a representation can match them through what the document is about, not by copying
    tokens, and (the point drawn at random) not by their lengths either."""
    real = ~rows.is_padding
    tokens = (real.sum(dim=1) - 2).clamp(min=0)  # [B]: between [CLS] and [SEP]
    short = (tokens < 2).nonzero()
    if len(short):
        raise DataError(f"a row with {int(tokens[short[0, 0]])} token(s) cannot be split into two views: each needs one")
    if generator is None:
        split = (tokens + 1) // 2
    else:  # one draw per row, in row order
        split = torch.stack([torch.randint(1, int(n), (1,), generator=generator)[0] for n in tokens])
    rank = real.long().cumsum(dim=1) - 1  # [B, T]: 0 at [CLS], tokens from 1, tokens + 1 at [SEP]
    frame = (rank == 0) | (rank == tokens[:, None] + 1)
    before = rank <= split[:, None]
    document = row_document(rows)
    return (_view(rows.input_ids, real & (before | frame), document, pad_id),
            _view(rows.input_ids, real & (~before | frame), document, pad_id))


def _view(input_ids: torch.Tensor, keep: torch.Tensor, document: torch.Tensor, pad_id: int) -> CorruptedBatch:
    """The ``keep`` tokens of each row as one right-padded batch, positions from 0, no labels."""
    ids, lengths = compact(input_ids, keep, pad_id)
    positions = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
    is_padding = positions >= lengths[:, None]
    return CorruptedBatch(input_ids=ids, labels=torch.full_like(ids, IGNORE_INDEX), is_padding=is_padding,
                          position_ids=positions.clone(),
                          document_ids=torch.where(is_padding, -1, document.unsqueeze(1)), extras={})


def train(siamese: Siamese, objective: Objective, text: _support.DefaultText, config: Config, seed: int,
          stop_gradient: bool, device) -> list[float]:
    """``config.steps`` SGD steps of the SimSiam loss; rows and split points from generators
    seeded by ``seed`` only, so both arms see the same views in the same order."""
    data, splits = stream(seed, "data"), stream(seed, "collapse_views")
    # SimSiam's optimizer: SGD, momentum 0.9, weight decay 1e-4.
    optimizer = torch.optim.SGD(siamese.parameters(), lr=config.lr, momentum=0.9, weight_decay=1e-4)
    siamese.train()
    losses = []
    for _ in range(config.steps):
        first, second = (view.to(device) for view in two_views(text.train.sample(config.batch_size, data),
                                                                text.train.vocab.pad_id, splits))
        z1, p1 = siamese(first.input_ids, objective.attention_mask(first), first.position_ids, first.is_padding)
        z2, p2 = siamese(second.input_ids, objective.attention_mask(second), second.position_ids, second.is_padding)
        loss = simsiam_loss(z1, p1, z2, p2, stop_gradient)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    siamese.eval()
    return losses


@torch.no_grad()
def representation(siamese: Siamese, objective: Objective, batch: CorruptedBatch) -> torch.Tensor:
    """``z`` ``[N, d]`` of the rows of ``batch`` (a view)."""
    mask = objective.attention_mask(batch)
    return siamese(batch.input_ids, mask, batch.position_ids, batch.is_padding)[0]


def run(setting: Setting) -> ExperimentResult:
    return _run(QUICK if setting.quick else FULL, setting)


def _run(config: Config, setting: Setting, text: _support.DefaultText | None = None,
         model_config: dict | None = None) -> ExperimentResult:
    device = resolve_device(setting.device)
    setting.status("loading the default corpus")
    text = text or _support.default_text(config.seq_len)
    # The objective gives the backbone and its attention mask only; the loss is SimSiam's.
    objective = text.registry.get("mlm", vocab=text.train.vocab)
    rows = text.heldout.sample(config.eval_rows, stream(setting.seed, "heldout_rows"))
    held_out = two_views(rows, text.heldout.vocab.pad_id)[0].to(device)
    figures: dict = {"normalised_std": {}, "training_loss": {}}
    curves: dict = {}
    for heads, batch_norm in HEADS.items():
        figures["normalised_std"][heads], figures["training_loss"][heads] = {}, {}
        for arm in ARMS:
            model = _support.mlm_model(text.registry, objective, setting.seed, model_config)
            width = model.backbone.hidden_size
            siamese = Siamese(model, width, stream(setting.seed, "new_weights"), batch_norm)
            siamese.to(device).eval()
            initial = normalised_std(representation(siamese, objective, held_out))
            setting.status(f"training {heads}, {arm} for {config.steps} steps")
            losses = train(siamese, objective, text, config, setting.seed, arm == "stop_gradient", device)
            trained = normalised_std(representation(siamese, objective, held_out))
            figures["normalised_std"][heads][arm] = {"init": initial, "trained": trained}
            figures["training_loss"][heads][arm] = _support.loss_summary(losses)
            curves[(heads, arm)] = losses
    after = figures["normalised_std"]["simsiam"]
    figures["effect"] = _support.finite(after["stop_gradient"]["trained"] - after["no_stop_gradient"]["trained"])
    figures["width"] = width
    verdict, reason = seed_verdict(figures)
    plots = [_plot(curves, figures, setting)] if setting.out_dir is not None else []
    return ExperimentResult(NAME, CLAIM, verdict, reason, figures,
                            _support.settings(config, setting, device, model=model_config or "default",
                                              views=VIEWS), plots)


def _plot(curves: dict, figures: dict, setting: Setting) -> str:
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7.5, 3.5))
    left, right = figure.subplots(1, 2)
    colors = {"stop_gradient": "tab:blue", "no_stop_gradient": "tab:red"}
    for (heads, arm), losses in curves.items():
        left.plot(np.arange(1, len(losses) + 1), losses, color=colors[arm],
                  linestyle="-" if heads == "simsiam" else "--", label=f"{heads}, {arm.replace('_', ' ')}")
    left.set_xlabel("step")
    left.set_ylabel("SimSiam loss (negative cosine)")
    left.legend(fontsize=7)
    labels = [f"{heads}\n{arm.replace('_', ' ')}" for heads in HEADS for arm in ARMS]
    values = [figures["normalised_std"][heads][arm]["trained"] for heads in HEADS for arm in ARMS]
    right.bar(labels, values, color=[colors[arm] for _ in HEADS for arm in ARMS])
    right.axhline(1.0, color="grey", linestyle=":", label="isotropic Gaussian")
    right.set_ylabel("sqrt(d) x std of z/|z| (held out)")
    right.tick_params(axis="x", labelsize=7)
    right.legend(fontsize=8)
    figure.suptitle(f"Stop-gradient and collapse (seed {setting.seed})", fontsize=10)
    figure.tight_layout()
    return save_figure(figure, setting.out_dir / f"{NAME}.png")


def seed_verdict(figures: dict[str, Any]) -> tuple[str, str]:
    """One seed's verdict and reason from its figures (``recombine`` reads them again after a rule change)."""
    after, plain = figures["normalised_std"]["simsiam"], figures["normalised_std"]["no_batch_norm"]
    effect = _support.finite(after["stop_gradient"]["trained"] - after["no_stop_gradient"]["trained"])
    steps = figures["training_loss"]["simsiam"]["stop_gradient"]["steps"]
    reason = (f"sqrt(d) x std of the normalised output after {steps} steps, SimSiam heads: with stop-gradient "
              f"{after['stop_gradient']['trained']:.3f}, without {after['no_stop_gradient']['trained']:.3f} "
              f"(at init {after['stop_gradient']['init']:.3f}); without batch norm: "
              f"{plain['stop_gradient']['trained']:.3f} and {plain['no_stop_gradient']['trained']:.3f}; "
              f"effect {effect:+.3f} against the threshold {THRESHOLD} (one seed: no between-seed interval)")
    return verdict_from_interval(effect, effect, THRESHOLD, DIRECTION), reason
