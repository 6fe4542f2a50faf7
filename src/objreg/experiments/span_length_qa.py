"""Span length and extractive QA: span masking whose lengths match real answers aligns better
with QA than span masking with clearly mismatched lengths.

**Claim.** SpanBERT (Joshi et al. 2020, §3.1 and §5) masks contiguous spans, with lengths from a
clipped geometric distribution, because span-selection tasks such as extractive QA need a model
that predicts whole spans; the seed material's sharper form: span masking whose length
distribution matches the downstream answers gives a pre-training gradient better aligned with
extractive QA than spans of mismatched length at the same budget. Here "matched" means measured
from real SQuAD v1.1 answers, not from the built-in cloze task (whose answers are 96% one word).

**Data.** ``squad_v1.1/dev-v1.1.half-a.json`` gives the matched lengths: each question's first
answer in words as the tokenizer splits them, answers over 10 words dropped (as SpanBERT clips
its spans; :func:`objreg.toolkit.lengths.answer_length_distribution`). The disjoint
``dev-v1.1.half-b.json`` is the downstream task: the ``qa`` task's SQuAD reader, its probe fit and
``D`` on different questions. The data folder is ``$OBJREG_SHARED_DATA`` or ``../shared/data``
beside the checkout; without it the experiment stops with a clear error.

**Setting.** Full (:data:`MINILM`): all-MiniLM-L6-v2 as shipped, a model that already knows the
language, read on WikiText-2 (valid) with its own tokenizer; its checkpoint has no MLM head, so the
head is first fitted alone on the frozen encoder (150 AdamW steps of 16 rows of 128 tokens), and the
alignment is that of the first step of continued pre-training. Toy (:data:`TOY`) and quick: the
default model trained with ``mlm`` on the default corpus (quick: 40 AdamW steps of 16 rows of 64
tokens; toy: 400 steps of 32 rows of 128 tokens). The ``qa`` head is fitted
as a linear probe on half-b questions (backbone frozen, as ``objreg analyze`` does), and ``D`` is
the ``qa`` loss on a disjoint set of half-b questions (quick: 32; full: 64). The conditions, all
``span`` with ``mask_prob = 0.15``: ``matched`` (SQuAD's lengths, mean about 2.7 words),
``single_word`` (every span one word), ``long`` (every span 8 words), and ``geometric``
(SpanBERT's default, ``p = 0.2`` on 1..10 words, mean 3.8: close to SQuAD's, reported, not a
mismatched condition).

**Measured.** On the same rows (quick and MiniLM: 40 batches of 16 rows; toy: 150 of 32) and the same fixed
parameters, each condition's mean-loss gradient on the shared parameters and its cosine with
``∇D``; the paired differences ``cos(matched) − cos(other)`` over batches, with a within-seed
Student-t interval (one model, one evaluation set). The effect is the mean of the differences
from ``single_word`` and ``long``.

**Verdict.** Two parts over seeds, each with its between-seed 95% t-interval: ``cos(matched) −
cos(single_word)`` and ``cos(matched) − cos(long)`` above 0. ``confirmed`` when both are,
``refuted`` when either lies wholly below 0, ``inconclusive`` otherwise. Within one seed the same
rule on the paired within-seed intervals.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from objreg import IGNORE_INDEX, CorruptedBatch, DataError, Objective
from objreg.analysis.math.downstream import Downstream
from objreg.analysis.math.functional import detached, flat_dot, flat_norm, shared_parameters
from objreg.analysis.math.gradients import mean_loss_gradient, shared_part
from objreg.analysis.math.refit import make_downstream
from objreg.analysis.math.stats import bootstrap_ci95, mean_ci95, seed_for
from objreg.analysis.parallel.devices import resolve_device
from objreg.analysis.run.headfit import fit_downstream_head
from objreg.analysis.run.prepare import build_model, split_evaluation
from objreg.experiments import _support
from objreg.experiments.base import CONFIRMED, INCONCLUSIVE, REFUTED, ExperimentResult, Setting, save_figure
from objreg.experiments.preconditions import Precondition
from objreg.experiments.replication import combine_parts
from objreg.toolkit import lengths, selection
from objreg.toolkit.randomness import stream

NAME = "span-length-qa"
CLAIM = ("Span masking whose span lengths match the downstream answer lengths (real SQuAD answers) aligns better "
         "with extractive QA than span masking with clearly mismatched lengths (single words, long spans), at the "
         "same masking budget.")
SOURCE = ("Joshi et al. 2020, SpanBERT: Improving Pre-training by Representing and Predicting Spans, TACL, sections "
          "3.1 and 5; answer lengths from Rajpurkar et al. 2016, SQuAD v1.1 dev")
RULE = ("Over seeds (95% between-seed t-intervals): cos(matched, grad D) - cos(single_word, grad D) and "
        "cos(matched) - cos(long) both above 0: confirmed; either wholly below 0: refuted; else inconclusive.")
#: Conditions the verdict compares ``matched`` with; ``geometric`` is reported only.
MISMATCHED = ("single_word", "long")
CONDITIONS = ("matched", "geometric", *MISMATCHED)
PARTS = {f"vs_{name}": (0.0, "above") for name in MISMATCHED}
SQUAD_FILES = ("dev-v1.1.half-a.json", "dev-v1.1.half-b.json")  # lengths from a, the task from b
MAX_ANSWER_WORDS = 10
#: The conditions must differ only in span length (the same share masked), and the qa probe must have
#: learned something for its gradient to be about QA.
PRECONDITIONS = (
    Precondition("equal_budget", "the largest distance of a condition's realised masked share from mask_prob",
                 0.005, "below", lambda figures, setting: max(abs(c["masked_share"] - setting["mask_prob"])
                                                             for c in figures["conditions"].values())),
    Precondition("qa_probe_learned", "log(seq_len) (a uniform guess over the row's positions) minus the qa "
                 "probe's loss D (nats)", 1.0, "above",
                 lambda figures, setting: math.log(setting["seq_len"]) - figures["downstream_loss"]),
)


def squad_dir() -> Path:
    """The SQuAD v1.1 folder: ``$OBJREG_SHARED_DATA/squad_v1.1`` or ``../shared/data/squad_v1.1``."""
    return _support.shared_data() / "squad_v1.1"


@dataclass(frozen=True)
class Config:
    """Sizes of the experiment."""

    batches: int
    batch_size: int
    seq_len: int
    pretrain_steps: int
    pretrain_batch_size: int
    eval_size: int
    head_fit_size: int
    head_warmup_steps: int
    lr: float = 1e-3
    mask_prob: float = 0.15
    #: ``default``: the default model pre-trained from its random start on the built-in corpus;
    #: ``minilm``: all-MiniLM-L6-v2 as shipped, read on WikiText-2 with its own tokenizer.
    model: str = "default"
    #: Steps fitting the MLM head alone, backbone frozen, before measuring (MiniLM ships no MLM head).
    lm_head_steps: int = 0


QUICK = Config(batches=40, batch_size=16, seq_len=64, pretrain_steps=40, pretrain_batch_size=16, eval_size=32,
               head_fit_size=256, head_warmup_steps=30)
TOY = Config(batches=150, batch_size=32, seq_len=128, pretrain_steps=400, pretrain_batch_size=32, eval_size=64,
             head_fit_size=1024, head_warmup_steps=100)
MINILM = Config(batches=40, batch_size=16, seq_len=128, pretrain_steps=0, pretrain_batch_size=16, eval_size=64,
                head_fit_size=1024, head_warmup_steps=100, model="minilm", lm_head_steps=150)
FULL = MINILM
#: Why the registered setting's decision waits on more than this CPU (read by the results table).
HARDWARE_LIMIT = ("its registered MiniLM setting's two pilot seeds put the deciding part, vs_long, at an effect of "
                  "about 0 (-0.0001, sd 0.003): n80 about 6,700 seeds at 620 CPU s a seed, past the 3 CPU hours an "
                  "experiment may take here and past any device call")


def run(setting: Setting) -> ExperimentResult:
    return _run(QUICK if setting.quick else FULL, setting)


def combine(results: list[ExperimentResult], setting: Setting) -> ExperimentResult:
    return combine_parts(results, setting, PARTS)


def _run(config: Config, setting: Setting, text: _support.DefaultText | None = None,
         model_config: dict | None = None, squad: Path | None = None, model_path: str | None = None) -> ExperimentResult:
    """One seed of ``config``; the tests pass small stand-ins (``text``, a ``model_config`` for the
    default model, ``squad``, and ``model_path`` for MiniLM's)."""
    device = resolve_device(setting.device)
    source = _support.model_source(config.model, model_path)
    squad = squad or squad_dir()
    missing = [name for name in SQUAD_FILES if not (squad / name).is_file()]
    if missing:
        raise DataError(f"{NAME} needs SQuAD v1.1 dev halves in {squad} ({', '.join(missing)} missing); set "
                        "OBJREG_SHARED_DATA to the folder that holds squad_v1.1/")
    setting.status("loading the text")
    text = text or _support.setting_text(config.model, config.seq_len, source)
    registry, vocab, tokenizer = text.registry, text.train.vocab, text.train.tokenizer
    task = registry.get_task("qa")
    data, task_heads = task.task_data(str(squad / SQUAD_FILES[1]), (), tokenizer, config.seq_len,
                                      config.eval_size + config.head_fit_size)
    answer_lengths = lengths.answer_length_distribution(squad / SQUAD_FILES[0], tokenizer, MAX_ANSWER_WORDS)
    conditions = condition_params(answer_lengths)

    mlm = registry.get("mlm", vocab=vocab, mask_prob=config.mask_prob)
    model = build_model(registry, source, vocab, {"mlm": mlm.info.heads, task.name: task_heads}, setting.seed,
                        model_config).to(device)
    setting.status(f"training the model with mlm for {config.pretrain_steps} steps")
    losses = _support.train(model, mlm, text.train, steps=config.pretrain_steps, batch_size=config.pretrain_batch_size,
                            lr=config.lr, seed=setting.seed, device=device)
    if config.lm_head_steps:
        setting.status(f"fitting the MLM head alone for {config.lm_head_steps} steps")
        losses = _support.fit_lm_head(model, mlm, text.train, steps=config.lm_head_steps,
                                      batch_size=config.pretrain_batch_size, lr=config.lr, seed=setting.seed,
                                      device=device)
    setting.status("fitting the qa probe")
    evaluation, fit = split_evaluation(data, config.eval_size, with_fit=True)
    fit_downstream_head(model, task, fit.to(device), config.head_warmup_steps)
    downstream = make_downstream(task, evaluation.to(device))
    downstream.check(model)

    setting.status(f"measuring {len(conditions)} span-length conditions on {config.batches} batches")
    objectives = {name: registry.get("span", vocab=vocab, mask_prob=config.mask_prob, **params)
                  for name, params in conditions.items()}
    rows = paired_alignment(model, downstream, objectives, text.train, config.batches, config.batch_size,
                            setting.seed, device)
    figures = measure(rows, setting.seed)
    figures["answer_lengths"] = {str(n): p for n, p in answer_lengths.items()}
    figures["condition_params"] = conditions
    figures["mean_span_words"] = {name: _support.finite(_length_distribution(params).mean)
                                  for name, params in conditions.items()}
    figures["total_variation_from_matched"] = {
        name: total_variation(answer_lengths, _as_dict(_length_distribution(params))) for name, params in conditions.items()
    }
    figures["qa_examples"] = {"evaluation": evaluation.batch_size, "probe_fit": fit.batch_size}
    figures["mlm_loss"] = {"first": losses[0] if losses else None, "last": losses[-1] if losses else None}
    figures["downstream_loss"] = downstream.loss(model)
    figures["parts"] = {f"vs_{name}": figures["difference_from_matched"][name]["cosine"] for name in MISMATCHED}
    figures["effect"] = float(np.mean(list(figures["parts"].values())))
    verdict, reason = seed_verdict(figures)
    plots = []
    if setting.out_dir is not None:
        plots.append(_plot(figures, setting))
    return ExperimentResult(NAME, CLAIM, verdict, reason, figures,
                            _support.settings(config, setting, device, model=_support.model_name(config.model, model_config),
                                              downstream=f"qa on {SQUAD_FILES[1]}", lengths_from=SQUAD_FILES[0]), plots)


# -- the conditions -------------------------------------------------------------------------------


def condition_params(matched: dict[int, float]) -> dict[str, dict[str, Any]]:
    """The ``span`` parameters of each condition (see the module docstring)."""
    return {
        "matched": {"length_distribution": "empirical", "empirical_lengths": lengths.format_lengths(matched)},
        "single_word": {"length_distribution": "empirical", "empirical_lengths": "1:1"},
        "geometric": {"length_distribution": "geometric", "geometric_p": 0.2, "span_lower": 1,
                      "span_upper": MAX_ANSWER_WORDS},
        "long": {"length_distribution": "empirical", "empirical_lengths": "8:1"},
    }


def _length_distribution(params: dict[str, Any]) -> lengths.LengthDistribution:
    if params["length_distribution"] == "empirical":
        return lengths.parse_lengths(params["empirical_lengths"])
    return lengths.geometric_lengths(params["geometric_p"], params["span_lower"], params["span_upper"])


def _as_dict(distribution: lengths.LengthDistribution) -> dict[int, float]:
    return dict(zip(distribution.lengths.tolist(), distribution.probs.tolist()))


def total_variation(p: dict[int, float], q: dict[int, float]) -> float:
    """``½ Σ |p − q|`` of two length distributions."""
    return 0.5 * sum(abs(p.get(n, 0.0) - q.get(n, 0.0)) for n in set(p) | set(q))


# -- the measurement ------------------------------------------------------------------------------


def downstream_gradient(model: torch.nn.Module, downstream: Downstream) -> dict[str, torch.Tensor]:
    """``∇D`` on the shared parameters."""
    shared = detached(shared_parameters(model))
    return downstream.curvature(model, shared, "forward_over_reverse").gradient_and_products([])[0]


def objective_gradient(model: torch.nn.Module, objective: Objective, batch: CorruptedBatch) -> dict[str, torch.Tensor]:
    """The gradient of ``objective``'s mean loss over ``batch`` on the shared parameters."""
    shared = shared_parameters(model)
    _, grads = mean_loss_gradient(model, objective, batch, list(shared.values()))
    return shared_part(shared, grads)


def paired_alignment(model: torch.nn.Module, downstream: Downstream, objectives: dict[str, Objective], corpus,
                     batches: int, batch_size: int, seed: int, device: torch.device) -> dict[str, np.ndarray]:
    """Per condition, ``[batches, 4]``: cosine with ``∇D``, dot, gradient norm and share of the
    maskable tokens masked, on the same rows for every condition (each batch's corruption from a
    generator seeded by the seed and the batch, the same for every condition)."""
    model.eval()
    downstream_grad = downstream_gradient(model, downstream)
    downstream_norm = float(flat_norm(downstream_grad))
    data = stream(seed, "paired_rows")
    out = {name: np.zeros((batches, 4)) for name in objectives}
    for b in range(batches):
        rows = corpus.sample(batch_size, data)
        maskable = int(selection.maskable(rows).sum())
        for name, objective in objectives.items():
            batch = objective.corrupt(rows, torch.Generator().manual_seed(seed * 100_003 + b))
            grad = objective_gradient(model, objective, batch.to(device))
            norm, dot = float(flat_norm(grad)), float(flat_dot(grad, downstream_grad))
            masked = int((batch.labels != IGNORE_INDEX).sum())
            out[name][b] = dot / (norm * downstream_norm), dot, norm, masked / maskable
    return out


def measure(rows: dict[str, np.ndarray], seed: int) -> dict[str, Any]:
    """Means and intervals per condition, and the paired differences from ``matched``."""
    figures: dict[str, Any] = {"batches": int(len(rows["matched"])), "conditions": {}, "difference_from_matched": {}}
    for name, values in rows.items():
        mean, low, high = mean_ci95(values[:, 0])
        figures["conditions"][name] = {
            "cosine": mean, "cosine_ci95": [low, high],
            "dot": float(values[:, 1].mean()), "grad_norm": float(values[:, 2].mean()),
            "masked_share": float(values[:, 3].mean()),
        }
    for name in rows:
        if name == "matched":
            continue
        difference = rows["matched"][:, 0] - rows[name][:, 0]
        mean, low, high = mean_ci95(difference)
        figures["difference_from_matched"][name] = {
            "cosine": mean, "ci95": [low, high],
            "ci95_bootstrap": list(bootstrap_ci95(difference, seed_for(seed, NAME, name))),
            "matched_better_fraction": float(np.mean(difference > 0)),
        }
    return figures


def seed_verdict(figures: dict[str, Any]) -> tuple[str, str]:
    """The verdict from the paired intervals against every mismatched condition."""
    differences = figures["difference_from_matched"]
    sides = {name: _support.verdict_from_interval(*differences[name]["ci95"], 0.0, "above") for name in MISMATCHED}
    if any(side == REFUTED for side in sides.values()):
        verdict = REFUTED
    elif all(side == CONFIRMED for side in sides.values()):
        verdict = CONFIRMED
    else:
        verdict = INCONCLUSIVE
    conditions = figures["conditions"]
    parts = [f"cos(matched) - cos({name}) = {differences[name]['cosine']:+.4f} "
             f"[{differences[name]['ci95'][0]:+.4f}, {differences[name]['ci95'][1]:+.4f}]" for name in differences]
    cosines = ", ".join(f"{name} {c['cosine']:+.4f}" for name, c in conditions.items())
    reason = (f"paired over {figures['batches']} batches (within-seed t-intervals): {'; '.join(parts)} (verdict compares with "
              f"{' and '.join(MISMATCHED)}); mean cosines with grad D: {cosines}")
    return verdict, reason


def _plot(figures: dict[str, Any], setting: Setting) -> str:
    """Mean cosine with ``∇D`` per condition with its interval, and the answer-length distribution."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 4))
    left, right = figure.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    conditions = figures["conditions"]
    names = list(conditions)
    means = np.array([conditions[n]["cosine"] for n in names])
    intervals = np.array([conditions[n]["cosine_ci95"] for n in names])
    colors = ["tab:green" if n == "matched" else "tab:gray" if n == "single_word" else "tab:red" for n in names]
    left.bar(range(len(names)), means, color=colors, alpha=0.7)
    left.errorbar(range(len(names)), means, yerr=[means - intervals[:, 0], intervals[:, 1] - means], fmt="none",
                  ecolor="black", capsize=4)
    left.axhline(0.0, color="black", linewidth=0.8)
    left.set_xticks(range(len(names)))
    left.set_xticklabels([f"{n}\n(mean {figures['mean_span_words'][n]:.1f} w)" for n in names], fontsize=7)
    left.set_ylabel("cosine(grad span loss, grad D_qa)")
    left.set_title("Alignment with qa, paired batches (95% CI)", fontsize=9)
    lengths = {int(k): v for k, v in figures["answer_lengths"].items()}
    right.bar(list(lengths), list(lengths.values()), color="tab:green", alpha=0.7)
    right.set_xlabel("answer length (words)")
    right.set_ylabel("share of qa answers")
    right.set_title("qa answer lengths (= matched)", fontsize=9)
    figure.tight_layout()
    return save_figure(figure, setting.out_dir / f"{NAME}.png")
