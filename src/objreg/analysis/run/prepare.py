"""Everything a run needs before its first step, loaded through the registry: the corpus, the
tokenizer, the objectives, the downstream data, the model with its fitted downstream head, and
the trainer; plus the report's ``config`` section, which records what was loaded. Two steps
``objreg screen`` shares: :func:`load` (task, corpus, tokenizer, downstream sets) and
:func:`start_model` (the model with its heads, the re-fitted head drawn anew).

Names and parameters are checked first (:func:`check`), so an unknown objective fails in
milliseconds, before anything heavy is loaded.

The downstream head is fitted on examples apart from those that define ``D``
(:func:`downstream_sets`). For a set the task builds from the held-out documents (no
``downstream_data``), the split is by **document**: evaluation documents are evenly spaced over
the held-out ones, the fit set is built from the others, and a fit document that repeats a
sentence of an evaluation document is left out, so no evaluation text is seen while fitting (a
row split put default evaluation questions verbatim into fit contexts, since the cloze set's
neighbouring questions share their context sentences: docs/analysis.md counts them). A task's
own file (``downstream_data``) is split by rows: which of its rows share a source is the task's
to know.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from objreg.analysis.math.functional import count_parameters, shared_parameters
from objreg.analysis.math.refit import make_downstream
from objreg.analysis.parallel.group import Group
from objreg.analysis.parallel.launch import check_batch
from objreg.analysis.run.adaptive import adaptive_rule_of
from objreg.analysis.run.config import DTYPES, AnalysisConfig
from objreg.analysis.run.headfit import fit_downstream_head
from objreg.analysis.run.loop import Trainer
from objreg.analysis.run.unseen import check_unseen, corpus_sentences
from objreg.core.errors import DataError, InvalidParameterError
from objreg.core.handles import Task
from objreg.core.heads import build_heads
from objreg.core.registry import Registry, merge_heads
from objreg.core.types import CorruptedBatch, HeadSpec, Vocabulary
from objreg.toolkit.noise import noisy_corpus
from objreg.toolkit.randomness import stream
from objreg.toolkit.tokenizer import TokenizedCorpus, Tokenizer

#: Rows per chunk of a re-fitted head's fit set: the fit's work on the head runs per chunk, so
#: fewer, larger chunks cost less overhead (docs/performance.md); each still bounds the memory
#: of one pass through the backbone.
FIT_CHUNK = 32
#: ... and at most this many token positions (rows times the chunk's longest row): the fit set's
#: long rows go in smaller chunks, so its backbone passes compute less padding.
FIT_CHUNK_TOKENS = 1536


def check(config: AnalysisConfig, registry: Registry) -> torch.device:
    """Fail on a bad device, name or parameter in milliseconds, before anything heavy is loaded;
    returns the device."""
    device = config.resolved_device()
    registry.get_task(config.downstream, **config.objective_params.get(config.downstream, {}))
    for name in config.pretrain:
        check_fits(registry.get(name, **config.objective_params.get(name, {})).info, config)
    return device


def fit_chunk(rows: int, processes: int) -> int:
    """Rows per chunk of the re-fitted head's fit set: FIT_CHUNK, or fewer so that every process
    holds at least one chunk (each runs the fit's collectives on its own share)."""
    return max(1, min(FIT_CHUNK, rows // processes))


def prepare(
    config: AnalysisConfig, registry: Registry, cache: Path, status: Callable[[str], None] = lambda _: None,
    group: Group | None = None,
) -> tuple[Trainer, dict[str, Any]]:
    """Load everything ``config`` names and build the trainer; returns it with the report's
    ``config`` section. ``group``: the processes sharing the work (default: this one alone);
    each runs ``prepare`` alike."""
    group = group if group is not None else Group()
    device = check(config, registry)
    if group.device is not None:  # several processes: each on its own device (cuda:LOCAL_RANK)
        device = group.device
    check_batch(config.batch_size, group)
    refit = config.downstream_head == "refit"
    loaded = load(config, registry, cache, config.head_fit_size if refit or config.head_warmup_steps else 0, status)
    task, corpus, tokenizer, tokenized = loaded.task, loaded.corpus, loaded.tokenizer, loaded.tokenized
    eval_batch, fit_batch, split = loaded.eval_batch, loaded.fit_batch, loaded.split
    # The corpus vocabulary carries token counts (the inverse_frequency masking policy).
    objectives = {
        name: registry.get(name, vocab=tokenized.vocab, **config.objective_params.get(name, {}))
        for name in config.pretrain
    }
    for objective in objectives.values():  # a causal objective on an encoder-decoder, before loading it
        objective.check_architecture(loaded.architecture)
    if config.downstream_data is not None:
        check_unseen(eval_batch, tokenizer.vocab, corpus_sentences(tokenized),
                     f"--downstream-data {config.downstream_data}", config.corpus)

    if refit and fit_batch.batch_size < group.world_size:
        raise InvalidParameterError(
            f"head_fit_size gives {fit_batch.batch_size} fit examples for {group.world_size} processes: the "
            f"re-fitted head needs at least one per process; use head_fit_size ≥ {group.world_size}")
    status(f"building model {config.model!r}")
    model, head = start_model(registry, config, loaded, objectives, device, refit)

    warmup: list[float] = []
    if refit:
        status(f"the downstream head is re-fitted at every probe, on {fit_batch.batch_size:,} examples")
    else:
        if config.head_warmup_steps and fit_batch.batch_size:
            status(f"fitting the downstream head ({config.head_warmup_steps} steps on {fit_batch.batch_size:,} "
                   f"examples)")
        # Each process encodes its share of the fit rows; the head's gradient is summed at every step.
        warmup = fit_downstream_head(model, task, fit_batch.to(device), config.head_warmup_steps, group=group)
    # The main process's parameters everywhere, so rounding differences between machines cannot
    # start the processes apart (as DistributedDataParallel does).
    group.sync_([*model.parameters(), *model.buffers()])
    evaluation_dtype = DTYPES[config.eval_dtype] if config.eval_dtype != "model" else None
    downstream = make_downstream(task, eval_batch.to(device), head=head, fit=fit_batch.to(device) if refit else None,
                                 group=group, evaluation_dtype=evaluation_dtype,
                                 fit_chunk_size=fit_chunk(fit_batch.batch_size, group.world_size),
                                 fit_chunk_tokens=FIT_CHUNK_TOKENS)
    downstream.check(model)
    trainer = Trainer(
        model, objectives, config.weights, tokenized, downstream,
        optimizer=config.optimizer, lr=config.lr, batch_size=config.batch_size, seed=config.seed,
        device=device, steps=config.steps, probe_every=config.probe_every, schedules=config.schedule,
        probe_settings=config.probe_settings(), decode=tokenizer.decode, adaptive=adaptive_rule_of(config),
    )
    report_config = {
        **config.to_dict(),
        "device": str(device),
        "world_size": group.world_size,
        "backend": group.backend,
        "shared_parameters": count_parameters(shared_parameters(model)),
        "model_parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": tokenizer.vocab.size,
        "corpus_description": corpus.description,
        "pretrain_chunks": len(tokenized),
        "downstream_examples": eval_batch.batch_size,
        "downstream_evaluation": {
            "chunks": len(downstream.chunks), "length_sorted_and_trimmed": downstream.compact,
            "tokens": downstream.tokens, "padded_tokens": eval_batch.input_ids.numel(),
        },
        **({"downstream_fit": {"examples": fit_batch.batch_size, "l2": downstream.l2, "parameters": list(head),
                               **split}} if refit else
           {"head_warmup": {"examples": fit_batch.batch_size, "loss_before": warmup[0] if warmup else None,
                            "loss_after": warmup[-1] if warmup else None, **split}}),
        "objective_params": {n: dict(o.params) for n, o in objectives.items()},
        "architecture": loaded.architecture,
        "objective_attention": {n: o.info.pattern for n, o in objectives.items()},
        "optimizer_hyperparameters": {
            k: list(v) if isinstance(v, tuple) else v
            for k, v in trainer.optimizer.param_groups[0].items()
            if k in ("lr", "betas", "eps", "weight_decay")
        },
    }
    return trainer, report_config


@dataclass
class Loaded:
    """What a run loads before it builds a model (:func:`load`): the downstream task, the corpus,
    its tokenizer and tokenized pre-training text, and the task's evaluation and fit sets with its
    heads and how they were split. ``objreg screen`` loads it once for all its candidates."""

    task: Task
    corpus: Any
    tokenizer: Tokenizer
    tokenized: TokenizedCorpus
    eval_batch: CorruptedBatch
    fit_batch: CorruptedBatch
    task_heads: tuple[HeadSpec, ...]
    split: dict[str, Any]

    @property
    def architecture(self) -> str:
        return getattr(self.tokenizer, "architecture", "encoder")


def load(config: AnalysisConfig, registry: Registry, cache: Path, fit_size: int,
         status: Callable[[str], None] = lambda _: None) -> Loaded:
    """Load the task, the corpus, the tokenizer and the downstream sets (``fit_size``: the head-fit
    examples wanted, 0 for none); ``status`` is called as each stage starts."""
    task = registry.get_task(config.downstream, **config.objective_params.get(config.downstream, {}))
    status(f"loading corpus {config.corpus!r}")
    corpus = registry.load_corpus(config.corpus, cache)
    status(f"loading tokenizer for model {config.model!r}")
    tokenizer = registry.load_tokenizer(config.model, corpus, cache)
    pretrain_corpus, heldout = corpus.split()
    if config.char_noise > 0:
        # Pre-training text only (the held-out set defines D), from its own seeded stream.
        pretrain_corpus = noisy_corpus(pretrain_corpus, config.char_noise, stream(config.seed, "char_noise"))
    tokenized = TokenizedCorpus(tokenizer, pretrain_corpus, config.seq_len)
    status(f"loading downstream data for {config.downstream!r}")
    eval_batch, fit_batch, task_heads, split = downstream_sets(task, config, heldout.documents, tokenizer, fit_size)
    return Loaded(task, corpus, tokenizer, tokenized, eval_batch, fit_batch, task_heads, split)


def start_model(registry: Registry, config: AnalysisConfig, loaded: Loaded, objectives: Mapping[str, Any],
                device: torch.device, refit: bool) -> tuple[nn.Module, tuple[str, ...]]:
    """The model a run starts from, with the heads of ``objectives`` and of the task, on ``device``
    in the run's dtype; and, with ``refit``, the names of the re-fitted head's parameters (the
    task's heads drawn anew: :func:`redraw_downstream_heads`), else none."""
    owners = {**{n: o.info.heads for n, o in objectives.items()}, loaded.task.name: loaded.task_heads}
    model = build_model(registry, config.model, loaded.tokenizer.vocab, owners, config.seed)
    head = redraw_downstream_heads(registry, model, loaded.task_heads, config.seed) if refit else ()
    model.to(device=device, dtype=config.torch_dtype)
    return model, head


def build_model(
    registry: Registry, model: str, vocab: Vocabulary, owners: Mapping[str, Sequence[HeadSpec]], seed: int,
    config: Mapping[str, Any] | None = None,
) -> nn.Module:
    """The model ``model`` with the heads of ``owners`` (objective or task name → its heads), every
    weight drawn from a generator seeded by ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    return registry.load_model(model, vocab, merge_heads(owners), dict(config or {}), generator)


def redraw_downstream_heads(registry: Registry, model: nn.Module, specs: Sequence[HeadSpec], seed: int
                            ) -> tuple[str, ...]:
    """Draw the task's heads anew from their own random stream, so every objective set starts from
    the same downstream head (the objectives' heads draw from the model's generator before it),
    and return the names of the parameters a re-fit solves for (their head kind's ``linear`` ones).

    Raises:
        InvalidParameterError: a head kind that declares no linear parameters (it cannot be re-fitted).
    """
    kinds = registry.head_kinds()
    for spec in specs:
        if kinds[spec.kind].linear is None:
            raise InvalidParameterError(
                f"the downstream head {spec.name!r} is of kind {spec.kind!r}, which declares no parameters its "
                f"output is linear in, so it cannot be re-fitted: use --downstream-head frozen"
            )
    drawn = build_heads(list(specs), model.backbone, kinds, stream(seed, "downstream_head"))
    for name, head in drawn.items():
        model.heads[name] = head
    return tuple(f"heads.{spec.name}.{p}" for spec in specs for p in kinds[spec.kind].linear)


def downstream_sets(
    task: Task, config: AnalysisConfig, documents: Sequence[Sequence[str]], tokenizer: Tokenizer, fit_size: int,
) -> tuple[CorruptedBatch, CorruptedBatch, tuple[HeadSpec, ...], dict[str, Any]]:
    """The evaluation set defining ``D``, the head-fit set, the task's heads, and how they were
    split (``{"split": "documents" | "rows", ...}``; module docstring)."""
    def build(docs: Sequence[Sequence[str]], limit: int) -> tuple[CorruptedBatch, tuple[HeadSpec, ...]]:
        return task.task_data(config.downstream_data, docs, tokenizer, config.seq_len, limit)

    if fit_size > 0 and config.downstream_data is None and len(documents) >= 2:
        evaluation, fit, dropped = split_documents(documents, lambda docs: build(docs, config.eval_size)[0].batch_size,
                                                   config.eval_size)
        eval_batch, eval_heads = build(evaluation, config.eval_size)
        fit_batch, fit_heads = build(fit, fit_size) if fit else (None, None)
        if fit_batch is not None and fit_batch.batch_size >= 1 and fit_heads == eval_heads:
            return eval_batch, fit_batch, eval_heads, {
                "split": "documents", "evaluation_documents": len(evaluation), "fit_documents": len(fit),
                "fit_documents_dropped_for_shared_sentences": dropped,
            }
    data, heads = build(documents, config.eval_size + fit_size)
    eval_batch, fit_batch = split_evaluation(data, config.eval_size, with_fit=fit_size > 0)
    return eval_batch, fit_batch, heads, {"split": "rows"}


def split_documents(
    documents: Sequence[Sequence[str]], rows_of: Callable[[Sequence[Sequence[str]]], int], eval_size: int,
) -> tuple[list[Sequence[str]], list[Sequence[str]], int]:
    """Evaluation documents evenly spaced over ``documents``, as few as give ``eval_size`` rows
    (``rows_of(docs)``: how many the task builds from them; starting at ``eval_size`` documents
    and doubling, at most half of them), and the fit documents: the rest, less those that repeat
    a sentence of an evaluation document. Returns both and how many were left out for that."""
    total = len(documents)
    count = min(eval_size, total // 2)
    while True:
        chosen = set(torch.linspace(0, total - 1, count).round().long().tolist())
        evaluation = [documents[i] for i in sorted(chosen)]
        if count >= total // 2 or _rows(rows_of, evaluation) >= eval_size:
            break
        count = min(2 * count, total // 2)
    seen = {sentence.strip() for doc in evaluation for sentence in doc}
    rest = [documents[i] for i in range(total) if i not in chosen]
    fit = [doc for doc in rest if not any(sentence.strip() in seen for sentence in doc)]
    return evaluation, fit, len(rest) - len(fit)


def _rows(rows_of: Callable[[Sequence[Sequence[str]]], int], documents: Sequence[Sequence[str]]) -> int:
    try:
        return rows_of(documents)
    except DataError:  # too few documents for the task to build a set from
        return 0


def split_evaluation(data: CorruptedBatch, eval_size: int, with_fit: bool) -> tuple[CorruptedBatch, CorruptedBatch]:
    """Evenly spaced rows define D; the rest fit the downstream head. Disjoint, so the probe is
    not fitted on the examples it is evaluated on. With a fit split, at most half goes to D.

    Raises:
        DataError: a fit split asked of fewer than two examples.
    """
    total = data.batch_size
    if with_fit and total < 2:
        raise DataError(f"the downstream set has {total} example(s); fitting its head needs at least 2")
    size = min(eval_size, total // 2 if with_fit else total)
    chosen = torch.linspace(0, total - 1, size).round().long()
    rest = torch.ones(total, dtype=torch.bool)
    rest[chosen] = False
    return data.select(chosen), data.select(torch.nonzero(rest).flatten())


def check_fits(info: Any, config: AnalysisConfig) -> None:
    """Refuse an objective (its ``info``) whose shortest sequence is longer than the run's."""
    if config.seq_len < info.min_seq_len:
        raise InvalidParameterError(
            f"--seq-len {config.seq_len} is too short for {info.name!r}, which needs at least {info.min_seq_len} tokens"
        )
