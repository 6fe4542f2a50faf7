"""The setting of experiment screen-validity (:mod:`objreg.experiments.screen_validity`): its sizes
(:class:`Config`: :data:`FULL` and :data:`QUICK`), its tasks, its candidates (the objectives, their
variants and drawn mixtures), their slices into parts, and one part's run (:func:`run_part`): a
task, a seed and a slice of the candidates, each screened, continued to its outcome and fine-tuned.
"""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from objreg import Registry
from objreg.analysis.run.config import AnalysisConfig
from objreg.analysis.run.finetune import Schedule, finetune
from objreg.analysis.run.screen import screen
from objreg.analysis.run.screen_setting import describe
from objreg.analysis.run.trained import save_backbone
from objreg.experiments import _support
from objreg.toolkit.randomness import stream, stream_seed
from objreg.toolkit.splits import split_classification_file

TASKS = {"sst2": "glue/SST-2/dev.tsv", "rte": "glue/RTE/dev.tsv"}


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
    """The objectives, their variants and the drawn mixtures, in that order
    (:mod:`objreg.experiments.screen_validity`'s docstring)."""
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
    its outcomes and the seconds each stage took (:mod:`objreg.experiments.screen_validity`'s
    docstring)."""
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
