"""``analyze``: everything from names to a report.

Names are checked before any heavy work (an unknown objective fails in milliseconds), then the
corpus, tokenizer, downstream set and model are loaded through the registry, the downstream head
is fitted as a linear probe, and the trainer runs with probes.

Started by ``torchrun`` (several processes), every process runs this with the same arguments and
takes its share of the per-example work (:mod:`objreg.analysis.distributed`); each returns the
same report, and the main process (rank 0) alone writes the output files.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from objreg.analysis.checkpoint import load_checkpoint, remove_checkpoint, save_checkpoint
from objreg.analysis.config import AnalysisConfig
from objreg.analysis.distributed import Group, check_batch, from_environment
from objreg.analysis.downstream import Downstream
from objreg.analysis.functional import count_parameters, shared_parameters
from objreg.analysis.report import AlignmentReport, RunWriter, summarise
from objreg.analysis.trainer import StepCallback, Trainer, fit_downstream_head
from objreg.core import masking
from objreg.core.cache import cache_dir
from objreg.core.errors import DataError, InvalidParameterError
from objreg.core.registry import Registry, merge_heads
from objreg.core.tokenizer import TokenizedCorpus
from objreg.core.types import CorruptedBatch


def analyze(
    pretrain: Sequence[str] | str | None = None,
    downstream: str | None = None,
    *,
    registry: Registry | None = None,
    out_dir: str | Path | None = None,
    resume: str | Path | None = None,
    on_step: StepCallback | None = None,
    on_status: Callable[[str], None] | None = None,
    cache: Path | None = None,
    **settings: Any,
) -> AlignmentReport:
    """Train on the weighted mix of ``pretrain`` objectives and measure, at every probe, how each
    objective's gradient aligns with the ``downstream`` task's gradient.

    Args:
        pretrain: Objective names, as a list or a comma-separated string (``"mlm,sop"``).
        downstream: Task name (default ``qa``).
        registry: Plugins to use (default: built-ins and installed plugins).
        out_dir: Where to write ``config.json`` (at the start), ``steps.jsonl`` (one line per
            finished probe), ``checkpoint.pt`` (after every finished step, removed at the end), and
            at the end ``report.json``, ``report.csv`` and the PNG plots.
        resume: A run directory written with ``out_dir`` whose run was interrupted: continue it
            from its last finished step with the settings in its ``config.json`` (give no
            ``pretrain``, ``downstream``, ``out_dir`` or settings with it). The result equals
            that of an uninterrupted run.
        on_step: Called after every training step with ``(step, probe record or None)``.
        on_status: Called with a short line as each loading stage starts.
        cache: Cache directory for the default corpus and tokenizer.
        **settings: Any field of :class:`objreg.analysis.config.AnalysisConfig` (``steps``,
            ``lr``, ``optimizer``, ``weights``, ``batch_size``, ``seq_len``, ``seed``, ...).

    Returns:
        The :class:`AlignmentReport`.

    Inside a ``torchrun`` launch of several processes (or a process group the caller initialised)
    the work is shared between the processes and every one returns the same report; only the
    main process writes ``out_dir`` (see docs/distributed.md).

    Raises:
        InvalidParameterError: ``resume`` given with other run settings, or naming a finished run.
        DataError: ``resume`` names a directory without a readable config or checkpoint.
    """
    if resume is not None:
        if pretrain is not None or downstream is not None or out_dir is not None or settings:
            given = [*(["pretrain"] if pretrain is not None else []), *(["downstream"] if downstream is not None else []),
                     *(["out_dir"] if out_dir is not None else []), *settings]
            raise InvalidParameterError(
                f"resume takes its settings from the run's config.json; drop {', '.join(given)}"
            )
        config = _resumed_config(Path(resume))
        out_dir = resume
    else:
        if isinstance(pretrain, str):
            pretrain = [p.strip() for p in pretrain.split(",") if p.strip()]
        config = AnalysisConfig(pretrain=tuple(pretrain or ()), downstream=downstream or "qa", **settings)
    registry = registry or Registry.load()
    check(config, registry)
    group = from_environment(config.device)
    return _run(config, registry, group, out_dir, resume, on_step, on_status, cache)


def _run(
    config: AnalysisConfig, registry: Registry, group: Group, out_dir: str | Path | None, resume: str | Path | None,
    on_step: StepCallback | None, on_status: Callable[[str], None] | None, cache: Path | None,
) -> AlignmentReport:
    """:func:`analyze` once its settings are checked and the processes are connected. Every
    process runs this; the main one alone touches ``out_dir``, and an error it meets there is
    raised on every process (:meth:`Group.on_main`), so none is left waiting."""
    records: list[dict[str, Any]] = []
    state: dict[str, Any] = {}
    if resume is not None:
        # Every process reads the checkpoint (the directory must be shared); before anything heavy.
        state, records = group.agree(lambda: load_checkpoint(Path(resume)))
    status = on_status or (lambda _message: None)
    writing = out_dir is not None
    writer = group.on_main(lambda: RunWriter(out_dir)) if writing else None
    trainer, report_config = prepare(config, registry, cache or cache_dir(), status, group=group)
    if resume is not None:
        try:
            trainer.load_state_dict(state)
        except (KeyError, RuntimeError, ValueError, TypeError) as e:
            raise DataError(f"cannot resume {str(resume)!r}: its checkpoint does not fit the run in its "
                            f"config.json ({type(e).__name__})") from None
        # Lines past the checkpoint belong to the step in flight when the run stopped: drop them.
        group.on_main(lambda: writer.rewrite_steps(records))
        status(f"resuming at step {trainer.next_step} of {config.steps}")
    elif writing:
        group.on_main(lambda: (writer.write_config(report_config), writer.start_steps()))

    def record_step(step: int, record: dict[str, Any] | None) -> None:
        if record is not None:
            records.append(record)
        if writing:

            def write() -> None:
                if record is not None:
                    writer.append_step(record)
                save_checkpoint(writer.out_dir, trainer.state_dict(), records)

            group.on_main(write)
        if on_step is not None:
            on_step(step, record)

    status("training with probes")
    trainer.run(record_step)
    report = build_report(config, report_config, trainer, records)
    if writing:
        status("writing the report")

        def write_report() -> None:
            writer.write_report(report)
            remove_checkpoint(writer.out_dir)

        group.on_main(write_report)
    return report


def _resumed_config(run_dir: Path) -> AnalysisConfig:
    """The settings of the interrupted run in ``run_dir``."""
    if (run_dir / "report.json").is_file():
        raise InvalidParameterError(f"the run in {str(run_dir)!r} already finished (it has report.json): nothing to resume")
    try:
        saved = json.loads((run_dir / "config.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(f"cannot resume {str(run_dir)!r}: it has no config.json (not a run directory of --out)") from None
    except (OSError, ValueError) as e:
        raise DataError(f"cannot resume {str(run_dir)!r}: config.json is unreadable ({e})") from None
    fields = {f.name for f in dataclasses.fields(AnalysisConfig)}
    if not isinstance(saved, dict) or "pretrain" not in saved:
        raise DataError(f"cannot resume {str(run_dir)!r}: config.json is not an objreg run config")
    return AnalysisConfig(**{k: v for k, v in saved.items() if k in fields})


def check(config: AnalysisConfig, registry: Registry) -> torch.device:
    """Fail on a bad device, name or parameter in milliseconds, before anything heavy is loaded;
    returns the device."""
    device = config.resolved_device()
    registry.get_task(config.downstream, **config.objective_params.get(config.downstream, {}))
    for name in config.pretrain:
        _check_fits(registry.get(name, **config.objective_params.get(name, {})).info, config)
    return device


def prepare(
    config: AnalysisConfig, registry: Registry, cache: Path, status: Callable[[str], None] = lambda _: None,
    group: Group | None = None,
) -> tuple[Trainer, dict[str, Any]]:
    """Load everything ``config`` names and build the trainer; returns it with the report's
    ``config`` section. Names are checked before anything heavy is loaded. ``group``: the
    processes sharing the work (default: this one alone); each runs ``prepare`` alike."""
    group = group if group is not None else Group()
    device = check(config, registry)
    if group.device is not None:  # several processes: each on its own device (cuda:LOCAL_RANK)
        device = group.device
    check_batch(config.batch_size, group)
    task = registry.get_task(config.downstream, **config.objective_params.get(config.downstream, {}))

    status(f"loading corpus {config.corpus!r}")
    corpus = registry.load_corpus(config.corpus, cache)
    status(f"loading tokenizer for model {config.model!r}")
    tokenizer = registry.load_tokenizer(config.model, corpus, cache)
    pretrain_corpus, heldout = corpus.split()
    if config.char_noise > 0:
        # Pre-training text only (the held-out set defines D), from its own seeded stream.
        noise = torch.Generator().manual_seed(config.seed * 7919 + 3)
        pretrain_corpus = masking.noisy_corpus(pretrain_corpus, config.char_noise, noise)
    tokenized = TokenizedCorpus(tokenizer, pretrain_corpus, config.seq_len)
    # The corpus vocabulary carries token counts (the inverse_frequency masking policy).
    objectives = {
        name: registry.get(name, vocab=tokenized.vocab, **config.objective_params.get(name, {}))
        for name in config.pretrain
    }

    status(f"loading downstream data for {config.downstream!r}")
    fit_size = config.head_fit_size if config.head_warmup_steps else 0
    data = task.task_data(
        config.downstream_data, heldout.documents, tokenizer, config.seq_len, config.eval_size + fit_size
    )
    eval_batch, fit_batch = _split_evaluation(data, config.eval_size, with_fit=fit_size > 0)

    status(f"building model {config.model!r}")
    heads = merge_heads([o.info for o in objectives.values()] + [task.info])
    model_generator = torch.Generator().manual_seed(config.seed)
    model = registry.load_model(config.model, tokenizer.vocab, heads, {}, model_generator)
    model.to(device=device, dtype=config.torch_dtype)

    # Each process encodes its share of the fit rows; the head's gradient is summed at every step.
    warmup = fit_downstream_head(model, task, fit_batch.to(device), config.head_warmup_steps, group=group)
    # The main process's parameters everywhere, so rounding differences between machines cannot
    # start the processes apart (as DistributedDataParallel does).
    group.sync_([*model.parameters(), *model.buffers()])
    downstream_set = Downstream(task, eval_batch.to(device), group=group)
    downstream_set.check(model)
    trainer = Trainer(
        model, objectives, config.weights, tokenized, downstream_set,
        optimizer=config.optimizer, lr=config.lr, batch_size=config.batch_size, seed=config.seed,
        device=device, steps=config.steps, probe_every=config.probe_every, schedules=config.schedule,
        per_sample_method=config.per_sample_method, hvp_method=config.hvp_method, spectrum=config.spectrum,
        decode=tokenizer.decode,
    )
    shared = shared_parameters(model)
    report_config = {
        **config.to_dict(),
        "device": str(device),
        "world_size": group.world_size,
        "backend": group.backend,
        "shared_parameters": count_parameters(shared),
        "model_parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": tokenizer.vocab.size,
        "corpus_description": corpus.description,
        "pretrain_chunks": len(tokenized),
        "downstream_examples": eval_batch.batch_size,
        "downstream_evaluation": {
            "chunks": len(downstream_set.chunks), "length_sorted_and_trimmed": downstream_set.compact,
            "tokens": downstream_set.tokens, "padded_tokens": eval_batch.input_ids.numel(),
        },
        "head_warmup": {"examples": fit_batch.batch_size, "loss_before": warmup[0] if warmup else None,
                        "loss_after": warmup[-1] if warmup else None},
        "objective_params": {n: dict(o.params) for n, o in objectives.items()},
        "optimizer_hyperparameters": {
            k: list(v) if isinstance(v, tuple) else v
            for k, v in trainer.optimizer.param_groups[0].items()
            if k in ("lr", "betas", "eps", "weight_decay")
        },
    }
    return trainer, report_config


def build_report(
    config: AnalysisConfig, report_config: dict[str, Any], trainer: Trainer, records: list[dict[str, Any]]
) -> AlignmentReport:
    """The report of a finished run."""
    report_config = {
        **report_config,
        "per_sample_method": ",".join(sorted(trainer.methods_used)),
        "hvp_method": trainer.hvp_method,
    }
    summary = summarise(
        list(config.pretrain), records, seed=config.seed,
        weights_by_step=trainer.weights_by_step, update_rule=trainer.update_rule,
        attribution=trainer.attribution_report(config.attribution_top) if config.attribution_top else None,
    )
    return AlignmentReport(
        pretrain=list(config.pretrain), downstream=config.downstream, config=report_config, steps=records,
        summary=summary,
    )


def _split_evaluation(data: CorruptedBatch, eval_size: int, with_fit: bool) -> tuple[CorruptedBatch, CorruptedBatch]:
    """Evenly spaced rows define D; the rest fit the downstream head. Disjoint, so the probe is
    not fitted on the examples it is evaluated on. With a fit split, at most half goes to D."""
    total = data.batch_size
    if with_fit and total < 2:
        raise DataError(f"the downstream set has {total} example(s); fitting its head needs at least 2")
    size = min(eval_size, total // 2 if with_fit else total)
    chosen = torch.linspace(0, total - 1, size).round().long()
    rest = torch.ones(total, dtype=torch.bool)
    rest[chosen] = False
    return data.select(chosen), data.select(torch.nonzero(rest).flatten())


def _check_fits(info: Any, config: AnalysisConfig) -> None:
    if config.seq_len < info.min_seq_len:
        raise InvalidParameterError(
            f"--seq-len {config.seq_len} is too short for {info.name!r}, which needs at least {info.min_seq_len} tokens"
        )
