"""NSP vs SOP: next-sentence negatives from other documents can be told apart by topic alone;
sentence-order negatives cannot.

**Claim.** BERT's next-sentence prediction (NSP) draws its negative second segment from another
document, so a model can solve it by noticing the change of topic without learning anything
about coherence; ALBERT's sentence-order prediction (SOP) takes both segments from one document
and swaps them, so topic gives nothing away and only order does. Source: Lan et al. 2020, ALBERT,
section 4.6 and table 5: a model trained with NSP is at chance on the SOP task (52.0%), while
one trained with SOP does well on both.

**Setting.** The default model is trained from one initialisation twice, once with ``nsp`` alone
and once with ``sop`` alone, on the same rows of the default corpus's training split (AdamW,
quick: 100 steps of 16 rows of 64 tokens; full: 1,500 steps of 32 rows of 64 tokens). Two probes
are built from the held-out documents (every row of at least two sentences, corrupted several
times with different seeds: quick 2 draws, full 4):

* ``topic_mismatched``: ``nsp``'s own pairs (half of the second segments from another document);
* ``topic_matched_order``: ``sop``'s own pairs (both segments from one document, half swapped).

In both, label 1 means "B is not A's continuation", so each model's own classifier head is read
on both probes (for NSP's head, "random next"; for SOP's, "swapped").

**Measured.** The *balanced* accuracy (mean of the two classes' recalls: 0.5 for any predictor
that ignores the input, whatever the label shares) of each model on each probe, with a 95%
bootstrap interval that resamples held-out rows (all draws of a row together); the paired
difference SOP − NSP on the ordering probe on the same resamples. A training-free topic
detector: the Jaccard overlap of the two segments' token sets, scored as a classifier by its
AUC on each probe (it is symmetric in the two segments, so it is blind to order by construction;
on the NSP probe it measures how far topic alone goes). Also each objective's alignment with the
``ordering`` downstream task: ``objreg.analysis.run.analyze(pretrain=["nsp", "sop"],
downstream="ordering")`` (quick: 4 steps; full: 16), the mean cosine of each objective's gradient
with ``∇D`` over the probes with a t interval, and the paired difference SOP − NSP.

**Verdict.** ``confirmed`` when all of these hold: the topic detector's AUC on the NSP probe is
above 0.5 (its interval), the NSP model's balanced accuracy on its own probe is above 0.5, its
balanced accuracy on the ordering probe lies within ``0.5 ± 0.05`` (interval wholly inside), and
SOP − NSP on the ordering probe is above 0. ``refuted`` when any of the predictions is contradicted
by its whole interval: the topic detector at or below chance on the NSP probe, the NSP model
outside ``0.5 ± 0.05`` on the ordering probe, or SOP below NSP there. ``inconclusive`` otherwise,
in particular when a model has not learned its own task in the steps given (then the probe
accuracies say nothing about what the objective teaches). The alignment figures are reported, not
part of the verdict.

This module runs past 300 lines because the claim has four checks (a topic detector, two trained
models on two probes, an ``analyze`` run), each with its statistics, read together with the verdict.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from scipy.stats import rankdata
from torch import nn

from objreg import CorruptedBatch, Objective, TokenizedCorpus, Vocabulary
from objreg.analysis.devices import resolve_device
from objreg.analysis.prepare import build_model
from objreg.analysis.run import analyze
from objreg.analysis.stats import mean_ci95, percentile_interval, seed_for
from objreg.experiments import _support
from objreg.experiments.base import CONFIRMED, INCONCLUSIVE, REFUTED, ExperimentResult, Setting, save_figure

NAME = "nsp-vs-sop"
CLAIM = ("NSP negatives drawn from other documents can be solved by topic alone, so an NSP-trained model stays at "
         "chance on sentence order, while SOP negatives (same document, swapped) cannot be solved by topic.")
OBJECTIVES = ("nsp", "sop")
PROBES = {"topic_mismatched": "nsp", "topic_matched_order": "sop"}
LABELS = {"nsp": "next_sentence_label", "sop": "order_label"}
#: Half-width of the band around 0.5 that counts as chance on the ordering probe (ALBERT: 52.0%).
CHANCE_MARGIN = 0.05


@dataclass(frozen=True)
class Config:
    """Sizes of the experiment."""

    steps: int
    batch_size: int
    seq_len: int
    probe_draws: int
    align_steps: int
    align_batch_size: int
    align_eval_size: int
    align_head_warmup_steps: int
    align_head_fit_size: int
    lr: float = 1e-4
    resamples: int = 2000


QUICK = Config(steps=100, batch_size=16, seq_len=64, probe_draws=2, align_steps=4, align_batch_size=8,
               align_eval_size=16, align_head_warmup_steps=20, align_head_fit_size=64)
FULL = Config(steps=1500, batch_size=32, seq_len=64, probe_draws=4, align_steps=16, align_batch_size=16,
              align_eval_size=64, align_head_warmup_steps=100, align_head_fit_size=512)


def run(setting: Setting) -> ExperimentResult:
    return _run(QUICK if setting.quick else FULL, setting)


def _run(config: Config, setting: Setting, text: _support.DefaultText | None = None,
         model_config: dict | None = None, corpus: str = "default") -> ExperimentResult:
    device = resolve_device(setting.device)
    setting.status("loading the default corpus")
    text = text or _support.default_text(config.seq_len)
    registry, vocab = text.registry, text.train.vocab
    objectives = {name: registry.get(name, vocab=vocab) for name in OBJECTIVES}
    initial = build_model(registry, "default", vocab, {n: o.info.heads for n, o in objectives.items()}, setting.seed,
                          model_config)
    start = {k: v.clone() for k, v in initial.state_dict().items()}

    setting.status("building the held-out probes")
    probes = build_probes(text.heldout, objectives, config.probe_draws, setting.seed)
    figures: dict[str, Any] = {"probes": {}, "balanced_accuracy": {}, "training_loss": {}}
    rng = np.random.default_rng(seed_for(setting.seed, NAME))
    rows = probes["topic_mismatched"][0].batch_size
    resample = rng.integers(0, rows, size=(config.resamples, rows))
    correct: dict[tuple[str, str], np.ndarray] = {}
    labels = {probe: np.stack([batch.extras[LABELS[PROBES[probe]]].numpy() for batch in draws])
              for probe, draws in probes.items()}
    for probe, draws in probes.items():
        overlap = np.stack([segment_overlap(batch, vocab) for batch in draws])
        figures["probes"][probe] = {
            "built_by": PROBES[probe], "rows": rows, "draws": len(draws),
            "label_1_share": float(labels[probe].mean()),
            "topic_auc": _auc_figures(overlap, labels[probe], resample),
        }

    for name, objective in objectives.items():
        model = initial
        model.load_state_dict(start)
        model.to(device)
        setting.status(f"training the default model with {name} alone for {config.steps} steps")
        losses = _support.train(model, objective, text.train, steps=config.steps, batch_size=config.batch_size,
                                lr=config.lr, seed=setting.seed, device=device)
        figures["training_loss"][name] = {"first_10": float(np.mean(losses[:10])), "last_10": float(np.mean(losses[-10:]))}
        figures["balanced_accuracy"][f"{name}_model"] = {}
        for probe, draws in probes.items():
            predicted = np.stack([predictions(model, objectives[PROBES[probe]], objective, batch, device)
                                  for batch in draws])
            correct[(name, probe)] = predicted == labels[probe]
            figures["balanced_accuracy"][f"{name}_model"][probe] = _accuracy_figures(
                correct[(name, probe)], labels[probe], resample)
        model.cpu()

    order = "topic_matched_order"
    difference = (balanced_accuracy(correct[("sop", order)], labels[order], resample)
                  - balanced_accuracy(correct[("nsp", order)], labels[order], resample))
    point = (balanced_accuracy(correct[("sop", order)], labels[order])
             - balanced_accuracy(correct[("nsp", order)], labels[order]))
    figures["sop_minus_nsp_on_order_probe"] = {"value": float(point), "ci95": list(percentile_interval(difference))}

    setting.status(f"measuring alignment with ordering for {config.align_steps} steps")
    figures["alignment_with_ordering"] = alignment_with_ordering(config, setting, registry, device, corpus)
    figures["checks"] = checks_of(figures)
    verdict, reason = decide(figures)
    plots = []
    if setting.out_dir is not None:
        plots.append(_plot(figures, setting))
    return ExperimentResult(NAME, CLAIM, verdict, reason, figures,
                            {**asdict(config), "seed": setting.seed, "quick": setting.quick, "device": str(device),
                             "model": "default" if not model_config else model_config,
                             "optimizer": "adamw (weight decay 0.01)"}, plots)


# -- training and probes -------------------------------------------------------------------------


def build_probes(heldout: TokenizedCorpus, objectives: dict[str, Objective], draws: int,
                 seed: int) -> dict[str, list[CorruptedBatch]]:
    """Every held-out row with two sentences or more, corrupted ``draws`` times by each probe's
    objective (draw ``d`` from a generator seeded by the seed, the probe and ``d``)."""
    chunks = heldout.eligible(2).tolist()
    rows = heldout.tokenizer.assemble([heldout.chunks[i] for i in chunks], heldout.seq_len)
    return {
        probe: [objectives[name].corrupt(rows, torch.Generator().manual_seed(seed * 1009 + 17 * k + d))
                for d in range(draws)]
        for k, (probe, name) in enumerate(PROBES.items())
    }


@torch.no_grad()
def predictions(model: nn.Module, builder: Objective, reader: Objective, batch: CorruptedBatch,
                device: torch.device, chunk: int = 64) -> np.ndarray:
    """The class ``reader``'s head predicts for each row of ``batch`` (built by ``builder``, whose
    attention mask it is read with)."""
    head = reader.info.heads[0].name
    out = []
    for start in range(0, batch.batch_size, chunk):
        part = batch.select(slice(start, start + chunk)).to(device)
        hidden = model.encode(part.input_ids, builder.attention_mask(part), part.position_ids)
        out.append(model.heads[head](hidden).argmax(dim=-1).cpu())
    return torch.cat(out).numpy()


def segment_overlap(batch: CorruptedBatch, vocab: Vocabulary) -> np.ndarray:
    """Per row (``[CLS] first [SEP] second [SEP]``), the Jaccard overlap of the token sets of its
    two segments (special tokens left out): a topic detector that knows nothing about order."""
    ids = batch.input_ids
    ordinary = ~torch.isin(ids, torch.tensor(vocab.special_ids, dtype=ids.dtype)) & ~batch.is_padding
    separator = (ids == vocab.sep_id).long()
    segment = separator.cumsum(dim=1) - separator  # separators before each position: 0 first, 1 second
    out = np.zeros(ids.shape[0])
    for b in range(ids.shape[0]):  # one set intersection per row: rows are few
        first = set(ids[b][ordinary[b] & (segment[b] == 0)].tolist())
        second = set(ids[b][ordinary[b] & (segment[b] == 1)].tolist())
        union = first | second
        out[b] = len(first & second) / len(union) if union else 0.0
    return out


# -- statistics ------------------------------------------------------------------------------------


def balanced_accuracy(correct: np.ndarray, labels: np.ndarray, resample: np.ndarray | None = None) -> Any:
    """Mean of the two classes' recalls over ``[draws, rows]`` predictions; with ``resample``
    ``[R, rows]`` (row indices), one value per resample, each taking all draws of a row."""
    counts = {c: ((labels == c) & correct).sum(axis=0) for c in (0, 1)}  # (rows,)
    totals = {c: (labels == c).sum(axis=0) for c in (0, 1)}
    if resample is None:
        return float(np.mean([counts[c].sum() / totals[c].sum() for c in (0, 1)]))
    return np.mean([counts[c][resample].sum(axis=1) / totals[c][resample].sum(axis=1) for c in (0, 1)], axis=0)


def auc(scores: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """The AUC of ``scores`` as a detector of label 0 (true continuation, high overlap) against
    label 1, along the last axis (Mann-Whitney, ties counted half)."""
    ranks = rankdata(scores, axis=-1)
    positive = labels == 0
    n_pos, n_neg = positive.sum(axis=-1), (~positive).sum(axis=-1)
    rank_sum = np.where(positive, ranks, 0.0).sum(axis=-1)
    return (rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


def _auc_figures(overlap: np.ndarray, labels: np.ndarray, resample: np.ndarray) -> dict[str, Any]:
    point = float(auc(overlap.reshape(-1), labels.reshape(-1)))
    replicates = auc(overlap[:, resample].transpose(1, 0, 2).reshape(len(resample), -1),
                     labels[:, resample].transpose(1, 0, 2).reshape(len(resample), -1))
    return {"value": point, "ci95": list(percentile_interval(replicates))}


def _accuracy_figures(correct: np.ndarray, labels: np.ndarray, resample: np.ndarray) -> dict[str, Any]:
    return {"value": balanced_accuracy(correct, labels), "accuracy": float(correct.mean()),
            "ci95": list(percentile_interval(balanced_accuracy(correct, labels, resample)))}


# -- alignment with ordering ---------------------------------------------------------------------


def alignment_with_ordering(config: Config, setting: Setting, registry, device: torch.device,
                            corpus: str) -> dict[str, Any]:
    """Each objective's cosine with ``∇D`` of the ``ordering`` task over the probes of an
    ``analyze`` run of ``nsp`` and ``sop`` together, with t intervals, and SOP − NSP per probe."""
    report = analyze(
        list(OBJECTIVES), "ordering", registry=registry, steps=config.align_steps, batch_size=config.align_batch_size,
        seq_len=config.seq_len, eval_size=config.align_eval_size, head_warmup_steps=config.align_head_warmup_steps,
        head_fit_size=config.align_head_fit_size, seed=setting.seed, device=str(device), corpus=corpus,
        attribution_top=0,
    )
    cosines = {name: [s["alignment"][name]["cosine"] for s in report.steps] for name in OBJECTIVES}
    out: dict[str, Any] = {"probes": len(report.steps)}
    for name, values in cosines.items():
        mean, low, high = mean_ci95(values)
        out[name] = {"cosine": mean, "cosine_ci95": [low, high], "dot": report.summary["alignment"][name]["dot"],
                     "dot_ci95": report.summary["alignment"][name]["ci95"]}
    mean, low, high = mean_ci95(np.subtract(cosines["sop"], cosines["nsp"]))
    out["sop_minus_nsp_cosine"] = {"value": mean, "ci95": [low, high]}
    return out


# -- verdict and plot -------------------------------------------------------------------------------


def checks_of(figures: dict[str, Any]) -> dict[str, str]:
    """Each of the four predictions' own verdict from its interval (see the module docstring)."""
    accuracy = figures["balanced_accuracy"]
    return {
        "topic": _support.verdict_from_interval(*figures["probes"]["topic_mismatched"]["topic_auc"]["ci95"], 0.5),
        "nsp_learned": _support.verdict_from_interval(*accuracy["nsp_model"]["topic_mismatched"]["ci95"], 0.5),
        "nsp_at_chance_on_order": _support.equivalence_verdict(
            *accuracy["nsp_model"]["topic_matched_order"]["ci95"], 0.5 - CHANCE_MARGIN, 0.5 + CHANCE_MARGIN),
        "sop_beats_nsp_on_order": _support.verdict_from_interval(*figures["sop_minus_nsp_on_order_probe"]["ci95"], 0.0),
    }


def decide(figures: dict[str, Any]) -> tuple[str, str]:
    """The verdict from the four checks (:func:`checks_of`)."""
    accuracy = figures["balanced_accuracy"]
    topic = figures["probes"]["topic_mismatched"]["topic_auc"]
    nsp_own = accuracy["nsp_model"]["topic_mismatched"]
    nsp_order = accuracy["nsp_model"]["topic_matched_order"]
    sop_order = accuracy["sop_model"]["topic_matched_order"]
    difference = figures["sop_minus_nsp_on_order_probe"]
    checks = checks_of(figures)
    # Not having learned its own task in the steps given says nothing against the claim.
    contradicted = {k: v for k, v in checks.items() if k != "nsp_learned"}
    if any(v == REFUTED for v in contradicted.values()):
        verdict = REFUTED
    elif all(v == CONFIRMED for v in checks.values()):
        verdict = CONFIRMED
    else:
        verdict = INCONCLUSIVE

    def shown(figure: dict[str, Any]) -> str:
        return f"{figure['value']:.3f} [{figure['ci95'][0]:.3f}, {figure['ci95'][1]:.3f}]"

    reason = (
        f"topic-only detector AUC on the NSP probe {shown(topic)}; NSP model balanced accuracy on its own probe "
        f"{shown(nsp_own)}, on the ordering probe {shown(nsp_order)} (chance band 0.5 +- {CHANCE_MARGIN:g}); "
        f"SOP model on the ordering probe {shown(sop_order)}; SOP - NSP there {shown(difference)}; "
        f"checks: {', '.join(f'{k} {v}' for k, v in checks.items())}"
    )
    return verdict, reason


def _plot(figures: dict[str, Any], setting: Setting) -> str:
    """Balanced accuracy of each model on each probe (with the topic-only detector's AUC), and
    the alignment with ordering."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 4))
    left, right = figure.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    probes = list(PROBES)
    bars = {"topic overlap (AUC)": [figures["probes"][p]["topic_auc"] for p in probes],
            "NSP model": [figures["balanced_accuracy"]["nsp_model"][p] for p in probes],
            "SOP model": [figures["balanced_accuracy"]["sop_model"][p] for p in probes]}
    width = 0.26
    for k, (label, values) in enumerate(bars.items()):
        x = np.arange(len(probes)) + (k - 1) * width
        means = np.array([v["value"] for v in values])
        low = np.array([v["ci95"][0] for v in values])
        high = np.array([v["ci95"][1] for v in values])
        left.bar(x, means, width, label=label, alpha=0.75)
        left.errorbar(x, means, yerr=[means - low, high - means], fmt="none", ecolor="black", capsize=3)
    left.axhspan(0.5 - CHANCE_MARGIN, 0.5 + CHANCE_MARGIN, color="grey", alpha=0.15)
    left.axhline(0.5, color="black", linewidth=0.8)
    left.set_xticks(range(len(probes)))
    left.set_xticklabels(["topic-mismatched\n(NSP pairs)", "topic-matched order\n(SOP pairs)"], fontsize=8)
    left.set_ylim(0.3, 1.0)
    left.set_ylabel("balanced accuracy / AUC (95% CI)")
    left.legend(fontsize=7)
    left.set_title("Held-out probes", fontsize=9)
    alignment = figures["alignment_with_ordering"]
    means = np.array([alignment[n]["cosine"] for n in OBJECTIVES])
    low = np.array([alignment[n]["cosine_ci95"][0] for n in OBJECTIVES])
    high = np.array([alignment[n]["cosine_ci95"][1] for n in OBJECTIVES])
    right.bar(range(len(OBJECTIVES)), means, color=["tab:orange", "tab:green"], alpha=0.75)
    right.errorbar(range(len(OBJECTIVES)), means, yerr=[means - low, high - means], fmt="none", ecolor="black",
                   capsize=4)
    right.axhline(0.0, color="black", linewidth=0.8)
    right.set_xticks(range(len(OBJECTIVES)))
    right.set_xticklabels([n.upper() for n in OBJECTIVES])
    right.set_ylabel("cosine(grad objective, grad D_ordering)")
    right.set_title(f"Alignment with ordering ({alignment['probes']} probes)", fontsize=9)
    figure.tight_layout()
    return save_figure(figure, setting.out_dir / f"{NAME}.png")
