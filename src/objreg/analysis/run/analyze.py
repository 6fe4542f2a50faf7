"""``analyze``: everything from names to a report.

Settings are checked before any heavy work, everything is loaded and the downstream head fitted
(:mod:`objreg.analysis.run.prepare`), the trainer runs with probes (:mod:`objreg.analysis.run.loop`),
and a writer records the run directory as it goes (:mod:`objreg.analysis.probe.writer`).

Started by ``torchrun`` (several processes), every process runs this with the same arguments and
takes its share of the per-example work (:mod:`objreg.analysis.parallel.launch`); each returns the same
report, and the main process (rank 0) alone writes the output files.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from objreg.analysis.math.mixture import counterfactual
from objreg.analysis.parallel.group import Group
from objreg.analysis.parallel.launch import check_same_settings, from_environment
from objreg.analysis.probe.report import AlignmentReport
from objreg.analysis.probe.writer import RunWriter
from objreg.analysis.records import StepRecord
from objreg.analysis.run.adaptive import adaptive_summary
from objreg.analysis.run.config import AnalysisConfig
from objreg.analysis.run.contract import check_contracts
from objreg.analysis.run.failures import resource_errors
from objreg.analysis.run.fingerprint import absolute_paths, check_resumable, check_same_config, write_fingerprint
from objreg.analysis.run.loop import StepCallback, Trainer
from objreg.analysis.run.naming import option, speaks_keywords
from objreg.analysis.run.overfit import memorising_head
from objreg.analysis.run.prepare import check, prepare
from objreg.analysis.run.resume import load_checkpoint, remove_checkpoint, restore, resumed_config, save_checkpoint
from objreg.analysis.run.run_inputs import RunInputs
from objreg.analysis.run.rundir import claim
from objreg.analysis.run.schedules import adaptive_rule
from objreg.analysis.run.trained import can_save, save_backbone
from objreg.analysis.run.validation import check_call, check_providers, fields_of
from objreg.core.errors import InvalidParameterError
from objreg.core.registry import Registry
from objreg.toolkit.cache import cache_dir

#: Makes the writer of a run directory (called on the main process only).
WriterFactory = Callable[[Path], RunWriter]


@speaks_keywords
def analyze(
    pretrain: Sequence[str] | str | None = None,
    downstream: str | None = None,
    *,
    registry: Registry | None = None,
    out_dir: str | Path | None = None,
    resume: str | Path | None = None,
    checkpoint_every: int = 1,
    on_step: StepCallback | None = None,
    on_status: Callable[[str], None] | None = None,
    cache: Path | None = None,
    writer: WriterFactory = RunWriter,
    **settings: Any,
) -> AlignmentReport:
    """Train on the weighted mix of ``pretrain`` objectives and measure, at every probe, how each
    objective's gradient aligns with the ``downstream`` task's gradient.

    Args:
        pretrain: Objective names, as a list or a comma-separated string (``"mlm,sop"``).
        downstream: Task name (default ``qa``).
        registry: Plugins to use (default: built-ins and installed plugins).
        out_dir: Where to write ``config.json`` (at the start), ``steps.jsonl`` (one line per
            finished probe), ``checkpoint.pt`` (after every ``checkpoint_every``-th finished step
            and the last, removed at the end), and at the end ``report.json``, ``report.csv`` and
            the PNG plots; on a Hugging Face model (continued pre-training), ``model/``, the trained
            backbone as a model directory (:mod:`objreg.analysis.run.trained`).
        resume: A run directory written with ``out_dir`` whose run was interrupted: continue it
            from its last finished step with the settings in its ``config.json`` (give no
            ``pretrain``, ``downstream``, ``out_dir`` or settings with it). The result equals
            that of an uninterrupted run.
        checkpoint_every: With ``out_dir`` (or ``resume``), write the checkpoint after every this
            many steps (and the last) rather than after each: an interrupted run then resumes from
            up to ``checkpoint_every − 1`` steps earlier (and recomputes them, to the same result).
            It changes no number of the run, so it may be given beside ``resume``.
        on_step: Called after every training step with ``(step, probe record or None)``.
        on_status: Called with a short line as each loading stage starts.
        cache: Cache directory for the default corpus and tokenizer.
        writer: Makes the writer of ``out_dir`` (default :class:`RunWriter`).
        **settings: Any field of :class:`objreg.analysis.run.config.AnalysisConfig` (``steps``,
            ``lr``, ``optimizer``, ``weights``, ``batch_size``, ``seq_len``, ``seed``, ...).

    Returns:
        The :class:`AlignmentReport`.

    Inside a ``torchrun`` launch of several processes (or a process group the caller initialised)
    the work is shared between the processes and every one returns the same report; only the
    main process writes ``out_dir`` (see docs/distributed.md).

    Raises:
        InvalidParameterError: ``resume`` given with other run settings, or naming a finished run.
        DataError: ``resume`` names a directory without a readable config or checkpoint.

    Warns:
        UserWarning: a third-party objective fails one of the plugin contract's cheap checks
            (:mod:`objreg.analysis.run.contract`).
    """
    check_call(pretrain=pretrain, downstream=downstream, registry=registry, out_dir=out_dir, resume=resume,
               checkpoint_every=checkpoint_every, on_step=on_step, on_status=on_status, cache=cache, writer=writer, settings=settings,
               fields=fields_of(AnalysisConfig))
    if resume is None and out_dir is None and checkpoint_every != 1:
        raise InvalidParameterError("--checkpoint-every is for a run with --out DIR, where its checkpoints go (none "
                                    "is written without it): give --out DIR too, or no --checkpoint-every")
    if resume is not None:
        given = [*(["pretrain"] if pretrain is not None else []), *(["downstream"] if downstream is not None else []),
                 *(["out_dir"] if out_dir is not None else []), *settings]
        config = resumed_config(Path(resume), given)
        out_dir = resume
    else:
        if isinstance(pretrain, str):
            pretrain = [p.strip() for p in pretrain.split(",") if p.strip()]
        config = AnalysisConfig(pretrain=tuple(pretrain or ()), downstream=downstream or "qa", **settings)
    registry = registry or Registry.load()
    if resume is None:
        config = absolute_paths(config, registry)  # the same files when resumed from elsewhere
    check(config, registry)
    check_providers(config, registry)
    if resume is None:
        check_contracts(config.pretrain, config.objective_params, registry, on_status or (lambda _: None))
    group = from_environment(config.device)
    check_same_settings(group, _settings_of(config, out_dir, resume, checkpoint_every))
    with resource_errors(out_dir, registry.pm):
        return _run(config, registry, group, out_dir, resume, on_step, on_status or (lambda _: None), cache, writer,
                    checkpoint_every)


def _run(
    config: AnalysisConfig, registry: Registry, group: Group, out_dir: str | Path | None, resume: str | Path | None,
    on_step: StepCallback | None, status: Callable[[str], None], cache: Path | None, make_writer: WriterFactory,
    checkpoint_every: int = 1,
) -> AlignmentReport:
    """The run with its directory claimed: locked by the main process for the run's life
    (:mod:`~objreg.analysis.run.rundir`) and, resumed, checked against the fingerprint of the run that
    started there (:mod:`~objreg.analysis.run.fingerprint`)."""
    claimed = None
    if out_dir is not None:
        claimed = group.on_main(lambda: claim(out_dir, resume=resume is not None,
                                              option="--out" if resume is None else "--resume"))
        if resume is not None:
            group.agree(lambda: check_resumable(Path(resume), registry))
    try:
        report = _run_claimed(config, registry, group, out_dir, resume, on_step, status, cache, make_writer,
                              checkpoint_every)
        if claimed is not None:
            claimed.release(finished=True)  # a finished run leaves no lock file behind
        return report
    finally:
        if claimed is not None:
            claimed.release()


def _run_claimed(
    config: AnalysisConfig, registry: Registry, group: Group, out_dir: str | Path | None, resume: str | Path | None,
    on_step: StepCallback | None, status: Callable[[str], None], cache: Path | None, make_writer: WriterFactory,
    checkpoint_every: int = 1,
) -> AlignmentReport:
    """:func:`analyze` once its settings are checked and the processes are connected. Every
    process runs this; the main one alone touches ``out_dir``, and an error it meets there is
    raised on every process (:meth:`Group.on_main`), so none is left waiting."""
    state: dict[str, Any] = {}
    if resume is not None:
        # Every process reads the checkpoint (the directory must be shared); before anything heavy.
        state, finished = group.agree(lambda: load_checkpoint(Path(resume)))
    writing = out_dir is not None
    # Made first, so an unwritable directory fails before anything is loaded; None off the main process.
    writer = group.on_main(lambda: make_writer(Path(out_dir))) if writing else None
    inputs = RunInputs.resumed(Path(resume)) if resume is not None else RunInputs(
        Path(out_dir) if writing else None, keep=group.is_main)
    trainer, report_config = prepare(config, inputs.registry(registry), cache or cache_dir(), status, group=group)
    if resume is not None:
        check_same_config(Path(resume), report_config)
        restore(trainer, state, Path(resume))
        # Lines past the checkpoint belong to the step in flight when the run stopped: drop them.
        group.on_main(lambda: writer.rewrite_steps(finished))
        status(f"resuming at step {trainer.next_step} of {config.steps}")
    elif writing:
        group.on_main(lambda: (write_fingerprint(Path(out_dir), config, report_config, inputs, registry),
                               writer.write_config(report_config), writer.start_steps()))

    def record_step(step: int, record: StepRecord | None) -> None:
        if step == 0 and record is not None and group.is_main:
            _warn_if_overfitted(report_config, record)
        due = (step + 1) % checkpoint_every == 0 or step + 1 == config.steps
        if writing:

            def write() -> None:
                if record is not None:
                    writer.append_step(record)
                if due:
                    save_checkpoint(Path(out_dir), trainer.state_dict())

            group.on_main(write)
        if on_step is not None:
            try:
                on_step(step, record)
            except BaseException:
                # A run stopped between two checkpoints (Ctrl-C stops after the step in flight)
                # keeps every finished step. One process only: another may not be stopping.
                if writing and not due and not group.distributed:
                    save_checkpoint(Path(out_dir), trainer.state_dict())
                raise

    status("training with probes")
    trainer.run(record_step)
    report = build_report(config, report_config, trainer)
    if writing:
        if can_save(trainer.model):
            status("saving the trained model")
            group.on_main(lambda: save_backbone(trainer.model, Path(out_dir)))
        status("writing the report")
        group.on_main(lambda: (writer.write_report(report), remove_checkpoint(Path(out_dir))))
    return report


#: Settings whose command-line option is not ``--`` and the name with dashes.
_OPTIONS = {"out_dir": "--out", "objective_params": "--param"}


def _settings_of(config: AnalysisConfig, out_dir: str | Path | None, resume: str | Path | None,
                 checkpoint_every: int = 1) -> dict[str, str]:
    """What every process of a run must agree on, each setting named as the library and the
    command line call it, with its value as a string (a callable by its name, not its address)."""
    given = {**config.to_dict(), "out_dir": out_dir and os.path.abspath(out_dir),
             "resume": resume and os.path.abspath(resume), "checkpoint_every": checkpoint_every}

    def plain(value: Any) -> str:
        return getattr(value, "__qualname__", None) or type(value).__name__

    return {f"{name} ({_OPTIONS.get(name, '--' + name.replace('_', '-'))})":
            "not given" if value is None else json.dumps(value, sort_keys=True, default=plain)
            for name, value in given.items()}


def _warn_if_overfitted(report_config: dict[str, Any], record: StepRecord) -> None:
    names = {name: option(name) for name in ("head_fit_size", "head_warmup_steps")}
    message = memorising_head(report_config, record, names)
    if message is not None:
        warnings.warn(message, stacklevel=2)


def build_report(config: AnalysisConfig, report_config: dict[str, Any], trainer: Trainer) -> AlignmentReport:
    """The report of a finished run: the probe's, with the run's own parts added (the mixture's
    counterfactual, an adaptive schedule's summary)."""
    report = trainer.probe.report(config.downstream, report_config, weights_by_step=trainer.weights_by_step,
                                  attribution_top=config.attribution_top)
    summary = report.summary
    summary["counterfactual"] = counterfactual(report.steps, list(config.pretrain), config.optimizer, config.lr,
                                               radius=config.trust_radius, low=config.min_weight,
                                               high=config.max_weight)
    rule = adaptive_rule(config.schedule)
    if rule is not None:
        summary["adaptive"] = adaptive_summary(rule, list(config.pretrain), trainer.weights_by_step,
                                               summary["counterfactual"])
    return report
