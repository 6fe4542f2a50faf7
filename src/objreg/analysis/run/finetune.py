"""``objreg finetune``: what a (continued) pre-trained backbone delivers on a task, measured the way
the field measures it: fine-tune backbone and task head on training rows, read the task's metric
on held-out rows.

For every seed and every fold (``folds``-fold cross-validation over the data, rows that share text
kept in one fold; or one split: train on ``downstream_data``, evaluate on ``eval_data``), a fresh
copy of the model gets the task's heads (drawn from the seed) and is trained end to end (:class:`Schedule`: AdamW, a constant learning
rate, batch order from the seed's ``finetune`` stream), then scored on the held-out rows by the
task's metric (``objreg_task_metrics``: accuracy for classification, exact match and F1 for
``qa``). Beside it, on the same splits, the **linear probe** of ``objreg analyze``: the task head's
linear part re-fitted on the frozen backbone's features of the training rows (Newton, ``λ = 1/n``,
:func:`objreg.analysis.math.head_fit.fit_head`), its held-out loss ``D*`` and its metric.

The interval of each metric is a Student-t interval over seeds (each seed's metric pooled over its
held-out rows); with one seed over folds, and with one seed and one split over rows (which
describes that one fine-tune's test set only). The same seed gives the same numbers.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from objreg.analysis.math.head_fit import HeadProblem, default_l2, fit_head
from objreg.analysis.math.stats import mean_ci95
from objreg.analysis.parallel.devices import resolve_device
from objreg.analysis.run.prepare import build_model
from objreg.analysis.run.trained import resolve
from objreg.analysis.run.unseen import check_unseen, corpus_sentences, row_tokens
from objreg.core.errors import DataError, InvalidParameterError
from objreg.core.handles import Task
from objreg.core.registry import Registry
from objreg.core.types import CorruptedBatch
from objreg.toolkit.cache import cache_dir
from objreg.toolkit.overlap import text_groups
from objreg.toolkit.randomness import stream, stream_seed
from objreg.toolkit.tokenizer import TokenizedCorpus

#: Every row of a task file is read (the task's ``limit``).
ALL_ROWS = 10**9
#: Rows per forward pass when scoring and when computing the probe's features.
CHUNK = 64

#: Called with (finished optimizer steps, all steps, what runs now).
Progress = Callable[[int, int, str], None]


@dataclass(frozen=True)
class Schedule:
    """The fine-tune's fixed schedule: ``epochs`` passes over the training rows in batches of
    ``batch_size`` (shuffled each epoch), AdamW at a constant ``lr`` with ``weight_decay``."""

    epochs: int = 3
    lr: float = 1e-4
    batch_size: int = 16
    weight_decay: float = 0.01

    def __post_init__(self):
        if not (isinstance(self.epochs, int) and self.epochs >= 1):
            raise InvalidParameterError(f"fine-tune epochs must be an integer >= 1, got {self.epochs!r}")
        if not (isinstance(self.batch_size, int) and self.batch_size >= 1):
            raise InvalidParameterError(f"fine-tune batch_size must be an integer >= 1, got {self.batch_size!r}")
        if not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise InvalidParameterError(f"fine-tune lr must be a finite number > 0, got {self.lr!r}")
        if not (isinstance(self.weight_decay, (int, float)) and 0 <= self.weight_decay < math.inf):
            raise InvalidParameterError(f"fine-tune weight_decay must be a finite number >= 0, got {self.weight_decay!r}")

    def steps(self, rows: int) -> int:
        """Optimizer steps on ``rows`` training rows."""
        return self.epochs * math.ceil(rows / self.batch_size)


def cross_validation_folds(n: int, folds: int, seed: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The ``folds`` folds of ``n`` rows (a permutation from ``seed``): each fold's held-out row
    indices and the ``[n]`` bool mask of the rows it trains on."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    for fold in order.chunk(folds):
        train = torch.ones(n, dtype=torch.bool)
        train[fold] = False
        yield fold, train


def grouped_folds(groups: Sequence[int], folds: int, seed: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """:func:`cross_validation_folds` over groups of rows (``groups``: a group id per row, from 0):
    every row of a group is held out in the same fold, so no fold trains on text it is scored on."""
    group_of = torch.tensor(list(groups), dtype=torch.long)
    for held_groups, _ in cross_validation_folds(int(group_of.max()) + 1, folds, seed):
        held = torch.isin(group_of, held_groups)
        yield held.nonzero().squeeze(1), ~held


def train_rows(parameters: Sequence[nn.Parameter], loss_of: Callable[[torch.Tensor], torch.Tensor],
               rows: torch.Tensor, schedule: Schedule, generator: torch.Generator,
               on_step: Callable[[], None] = lambda: None) -> list[float]:
    """Minimise ``loss_of(part)`` (a mean loss of the row indices ``part``) over ``rows`` with
    ``schedule`` (order from ``generator``); returns each step's loss."""
    optimizer = torch.optim.AdamW(parameters, lr=schedule.lr, weight_decay=schedule.weight_decay)
    losses = []
    for _ in range(schedule.epochs):
        for part in rows[torch.randperm(len(rows), generator=generator)].split(schedule.batch_size):
            loss = loss_of(part)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
            on_step()
    return losses


@dataclass
class FineTuneReport:
    """What :func:`finetune` measured. ``to_dict()`` is what ``--json`` prints.

    Attributes:
        model: What was fine-tuned (a model name or directory; a run's ``model/``).
        downstream: The task; ``metrics`` its metric names, the headline first.
        summary: Per metric (and the held-out ``loss``; the probe's ``d_star``), for the fine-tune
            and the probe: ``mean``, ``ci95``, ``interval_over`` (``seeds``, ``folds`` or ``rows``)
            and ``values``, what the interval is over (empty over rows: they are the predictions).
        units: One entry per (seed, fold): rows trained on and held out, the fine-tune's
            metrics and loss, the training loss at its first and last step, the probe's.
        predictions: Per held-out row and unit: ``seed``, ``fold``, ``row`` (index in the
            evaluation data), the fine-tune's ``loss`` and metric scores.
        setting: The schedule, folds, seeds, sequence length, data paths, device.
        pretraining: For a run directory, its objectives, corpus and steps; else None.
        timing: ``wall_s`` and ``cpu_s`` of the whole call.
    """

    model: str
    downstream: str
    metrics: list[str]
    summary: dict[str, Any]
    units: list[dict[str, Any]]
    predictions: list[dict[str, Any]] = field(repr=False)
    setting: dict[str, Any]
    pretraining: dict[str, Any] | None
    timing: dict[str, float]

    def to_dict(self, predictions: bool = False) -> dict[str, Any]:
        data = asdict(self)
        if not predictions:
            del data["predictions"]
        return data


def finetune(
    model: str = "default", downstream: str = "classification", downstream_data: str | None = None, *,
    eval_data: str | None = None, folds: int = 5, seeds: int = 1, seed: int = 0, schedule: Schedule = Schedule(),
    seq_len: int = 128, params: dict[str, Any] | None = None, device: str = "auto", registry: Registry | None = None,
    cache: Path | None = None, on_progress: Progress | None = None, on_status: Callable[[str], None] | None = None,
) -> FineTuneReport:
    """Fine-tune ``model`` on ``downstream`` and report the task metric on held-out rows (module
    docstring).

    Args:
        model: A model name, a Hugging Face model directory, or an ``objreg analyze --out`` run
            directory of continued pre-training (its ``model/``; its pre-training text is checked
            against the evaluation rows).
        downstream: The task (one that implements ``objreg_task_metrics``).
        downstream_data: The task's data file (every row is read).
        eval_data: Held-out rows in a file of their own: train on all of ``downstream_data``,
            evaluate on these (``folds`` is then unused).
        folds: Cross-validation folds over ``downstream_data`` (without ``eval_data``).
        seeds: How many seeds, from ``seed`` on: each draws its own folds, heads and batch order.
        schedule: Epochs, learning rate, batch size, weight decay.
        seq_len: Longest row in tokens.
        params: The task's parameters.
        device: ``auto``, ``cpu`` or ``cuda[:N]``.
        on_progress: Called after every optimizer step (finished, all, what runs).
        on_status: Called with a short line as each stage starts.

    Raises:
        InvalidParameterError: a setting out of range, a task without a metric, more folds than rows.
        DataError: a missing or malformed data file or model, a run directory without a trained
            model, evaluation rows inside the run's pre-training text.
    """
    started, cpu_started = time.perf_counter(), time.process_time()
    status = on_status or (lambda _line: None)
    registry = registry or Registry.load()
    cache = cache or cache_dir()
    _check_counts(folds=folds, seeds=seeds, seed=seed, seq_len=seq_len)
    if downstream_data is None:
        raise InvalidParameterError("fine-tuning needs the task's data: give downstream_data (--downstream-data)")
    task = registry.get_task(downstream, **(params or {}))
    task.require_metrics()
    source = resolve(model)
    status(f"loading the tokenizer of {source.model!r}")
    tokenizer = registry.load_tokenizer(source.model, _tokenizer_corpus(registry, source.model, cache), cache)
    status(f"loading {downstream} data")
    data = task.task_data(downstream_data, (), tokenizer, seq_len, ALL_ROWS)
    evaluation = task.task_data(eval_data, (), tokenizer, seq_len, ALL_ROWS) if eval_data is not None else None
    if evaluation is not None and evaluation.heads != data.heads:
        raise DataError(f"{eval_data} and {downstream_data} give the task different heads ({evaluation.heads} and "
                        f"{data.heads}): the evaluation rows need the training rows' label set")
    rows = data.batch.batch_size
    groups = text_groups(row_tokens(data.batch, tokenizer.vocab)) if evaluation is None else []
    if evaluation is None and not 2 <= folds <= max(groups) + 1:
        raise InvalidParameterError(f"fine-tune folds (--folds) must lie in [2, {max(groups) + 1}] (the groups of "
                                    f"rows of {downstream_data} that share no text), got {folds}")
    if source.run is not None:
        status("checking that no evaluation row was pre-trained on")
        corpus = registry.load_corpus(source.run["corpus"], cache)
        pretrained = TokenizedCorpus(tokenizer, corpus.split()[0], int(source.run["seq_len"]))
        held_out = evaluation.batch if evaluation is not None else data.batch
        shown = f"--eval-data {eval_data}" if evaluation is not None else f"--downstream-data {downstream_data}"
        check_unseen(held_out, tokenizer.vocab, corpus_sentences(pretrained), shown, source.run["corpus"])
    run_device = resolve_device(device)
    splits = list(_splits(rows, groups, folds, seeds, seed, evaluation is not None))
    total = sum(schedule.steps(int(train.sum())) for _, _, _, train in splits)
    units, predictions = [], []
    kinds = registry.head_kinds()
    linear = tuple(f"heads.{spec.name}.{p}" for spec in data.heads for p in (kinds[spec.kind].linear or ()))
    counter = _StepCounter(total, on_progress)
    for unit_seed, fold, held, train in splits:
        counter.label = f"seed {unit_seed}" + (f", fold {fold + 1}/{folds}" if evaluation is None else "")
        train_batch = data.batch.select(train.nonzero().squeeze(1))
        test_batch = evaluation.batch if evaluation is not None else data.batch.select(held)
        net = build_model(registry, source.model, tokenizer.vocab, {task.name: data.heads}, unit_seed).to(run_device)
        status(f"{counter.label}: the linear probe")
        probe = _probe(net, task, train_batch, test_batch, linear) if linear else None
        status(f"{counter.label}: fine-tuning on {train_batch.batch_size:,} rows, scoring {test_batch.batch_size:,}")
        losses = _fine_tune(net, task, train_batch, schedule, stream(unit_seed, "finetune"), run_device, counter)
        scores = _scores(net, task, test_batch, run_device)
        units.append({"seed": unit_seed, "fold": fold, "train_rows": train_batch.batch_size,
                      "heldout_rows": test_batch.batch_size,
                      "finetune": {name: float(v.mean()) for name, v in scores.items()},
                      "train_loss": {"first": losses[0], "last": losses[-1], "steps": len(losses)},
                      "probe": probe})
        index = held.tolist() if evaluation is None else list(range(test_batch.batch_size))
        for i, row in enumerate(index):
            predictions.append({"seed": unit_seed, "fold": fold, "row": row,
                                **{name: float(v[i]) for name, v in scores.items()}})
    metrics = [name for name in units[0]["finetune"] if name != "loss"]
    return FineTuneReport(
        model=source.model, downstream=downstream, metrics=metrics,
        summary=_summary(units, metrics, evaluation is None, predictions),
        units=units, predictions=predictions,
        setting={**asdict(schedule), "folds": None if evaluation is not None else folds, "seeds": seeds, "seed": seed,
                 "seq_len": seq_len, "downstream_data": downstream_data, "eval_data": eval_data,
                 "params": dict(task.params), "device": str(run_device), "dropout": 0.0},
        pretraining=None if source.run is None else {
            key: source.run.get(key) for key in ("pretrain", "weights", "corpus", "steps", "lr", "optimizer",
                                                 "batch_size", "seq_len", "seed", "model")},
        timing={"wall_s": time.perf_counter() - started, "cpu_s": time.process_time() - cpu_started},
    )


class _StepCounter:
    """Counts optimizer steps over every unit and reports each to ``on_progress``."""

    def __init__(self, total: int, on_progress: Progress | None):
        self.total, self.on_progress = total, on_progress
        self.done, self.label = 0, ""

    def __call__(self) -> None:
        self.done += 1
        if self.on_progress is not None:
            self.on_progress(self.done, self.total, self.label)


def _fine_tune(net: nn.Module, task: Task, rows: CorruptedBatch, schedule: Schedule, generator: torch.Generator,
               device: torch.device, on_step: Callable[[], None]) -> list[float]:
    """Train ``net`` (backbone and heads) on every row of ``rows``; returns each step's loss."""
    net.train()
    losses = train_rows(list(net.parameters()), lambda part: task.losses(net, rows.select(part).to(device)).mean(),
                        torch.arange(rows.batch_size), schedule, generator, on_step)
    net.eval()
    return losses


def _check_counts(**values: int) -> None:
    lows = {"folds": 2, "seeds": 1, "seed": 0, "seq_len": 8}
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < lows[name]:
            raise InvalidParameterError(f"fine-tune {name} (--{name.replace('_', '-')}) must be an integer >= "
                                        f"{lows[name]}, got {value!r}")


def _tokenizer_corpus(registry: Registry, model: str, cache: Path):
    """The corpus a tokenizer provider is given: a model directory brings its own tokenizer, the
    built-in model the default corpus's."""
    if (Path(model).expanduser() / "config.json").is_file() or model.startswith("random-init:"):
        return None
    return registry.load_corpus("default", cache)


def _splits(rows: int, groups: Sequence[int], folds: int, seeds: int, seed: int, one_split: bool
            ) -> Iterator[tuple[int, int, torch.Tensor, torch.Tensor]]:
    """(seed, fold, held-out row indices, training-row mask) of every unit."""
    for unit_seed in range(seed, seed + seeds):
        if one_split:
            yield unit_seed, 0, torch.arange(0), torch.ones(rows, dtype=torch.bool)
            continue
        for fold, (held, train) in enumerate(grouped_folds(groups, folds, stream_seed(unit_seed, "finetune_split"))):
            yield unit_seed, fold, held, train


def _scores(net: nn.Module, task: Task, batch: CorruptedBatch, device: torch.device) -> dict[str, torch.Tensor]:
    """Per-row metric scores and loss of ``net`` on ``batch``, in chunks."""
    parts: dict[str, list[torch.Tensor]] = {}
    with torch.no_grad():
        for start in range(0, batch.batch_size, CHUNK):
            rows = batch.select(slice(start, start + CHUNK)).to(device)
            for name, value in task.metrics(net, rows, with_loss=True).items():
                parts.setdefault(name, []).append(value.cpu())
    return {name: torch.cat(values) for name, values in parts.items()}


def _probe(net: nn.Module, task: Task, train: CorruptedBatch, test: CorruptedBatch,
           linear: Sequence[str]) -> dict[str, float]:
    """The linear probe on the frozen backbone (module docstring): ``D*`` and the metrics."""
    frozen = copy.deepcopy(net).double().eval().requires_grad_(False)
    device = next(frozen.parameters()).device
    chunks = [train.select(slice(s, s + CHUNK)).to(device) for s in range(0, train.batch_size, CHUNK)]
    params = dict(frozen.named_parameters())
    start = {name: params[name].detach() for name in linear}
    fitted = fit_head(HeadProblem(frozen, task, chunks, linear), start, train.batch_size, default_l2(train.batch_size))
    with torch.no_grad():
        for name, value in fitted.head.items():
            params[name].copy_(value)
    scores = _scores(frozen, task, test, device)
    return {"d_star": float(scores.pop("loss").double().mean()), **{n: float(v.mean()) for n, v in scores.items()},
            "fit_loss": fitted.fit_loss}


def _interval(values: Sequence[float], over: str) -> dict[str, Any]:
    mean, low, high = mean_ci95(values)
    return {"mean": mean, "ci95": [low, high], "interval_over": over, "values": [float(v) for v in values]}


def _summary(units: list[dict[str, Any]], metrics: list[str], folded: bool,
             predictions: list[dict[str, Any]]) -> dict[str, Any]:
    """Per metric and for the probe: the mean and its interval (module docstring)."""
    seeds = sorted({u["seed"] for u in units})

    def per_seed(read: Callable[[dict[str, Any]], float]) -> list[float]:
        # A seed's figure pools its held-out rows: folds weighted by their rows.
        out = []
        for s in seeds:
            mine = [u for u in units if u["seed"] == s]
            out.append(sum(read(u) * u["heldout_rows"] for u in mine) / sum(u["heldout_rows"] for u in mine))
        return out

    def summarise(read: Callable[[dict[str, Any]], float], row_key: str | None) -> dict[str, Any]:
        if len(seeds) > 1:
            return _interval(per_seed(read), "seeds")
        if folded:
            return {**_interval([read(u) for u in units], "folds"), "mean": per_seed(read)[0]}
        if row_key is not None:  # the rows' own values are the predictions
            return {**_interval([p[row_key] for p in predictions], "rows"), "values": []}
        value = read(units[0])
        return {"mean": value, "ci95": [value, value], "interval_over": "none", "values": [value]}

    summary: dict[str, Any] = {"finetune": {}, "probe": {}}
    for name in [*metrics, "loss"]:
        summary["finetune"][name] = summarise(lambda u, n=name: u["finetune"][n], name)
    if units[0]["probe"] is not None:
        for name in [*metrics, "d_star"]:
            summary["probe"][name] = summarise(lambda u, n=name: u["probe"][n], None)
    return summary
