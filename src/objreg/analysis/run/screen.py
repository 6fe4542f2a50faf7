"""``screen``: which pre-training objective for a downstream task, from short runs off one start.

Every candidate (an objective, an objective with parameters ``mlm:mask_prob=0.4``, or an
equal-weight mixture ``mlm+sop``) trains alone for a short budget from the same start: the same
backbone (drawn from the run seed before any objective head), the same downstream head (its own
random stream, as :mod:`objreg.analysis.run.prepare` draws it), the same data stream, and
analyze's optimizer and learning rate. At every probed step the screen takes the first-order
prediction of the step's effect on ``D*`` (the re-fitted head's downstream loss,
:mod:`objreg.analysis.math.refit`):

    score_t = −∇D*(θ_t) · Δθ_t            (the predicted drop of D* from step t)

and reports its mean over the probes with a batch-means interval
(:mod:`objreg.analysis.math.batch_means`: the steps of one run are correlated), also per 1,000
input tokens of the step's batches (the corrupted rows' non-padding tokens the backbone reads).
Candidates are ranked by the mean; a candidate whose interval overlaps the interval of the best
of its group is tied with it (``=`` in the rank).

Beside the score, every signal of :mod:`objreg.analysis.run.screen_signals` by name (the actual
drop of ``D*`` per step, the trajectory's first- and, with ``second_order``, second-order sums,
the raw and preconditioned alignments, a training-speed integral) and the baselines a user could
compute without the analyzer (the training gradient's norm, the candidate's own loss decrease, a
seeded random order); and the actual change of ``D*`` over the short run.

Candidates are checked in two passes before any training: names and parameters (each plugin's
own parameter schema) fail the call at once; whether a valid candidate can run on this model
(an objective's sequence length, a causal objective on an encoder-decoder, a missing special
token) is decided by analyze's own checks, and one that cannot is listed with the reason.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, TypedDict

import torch

from objreg.analysis.run.config import AnalysisConfig
from objreg.analysis.run.prepare import load
from objreg.analysis.run.screen_candidates import (
    DEFAULT_BUDGET,
    Budget,
    Candidate,
    parse_budget,
    parse_candidates,
)
from objreg.analysis.run.screen_run import score_run, unrunnable_reason
from objreg.analysis.run.screen_setting import NOT_VALIDATED
from objreg.analysis.run.screen_setting import line as validity_for
from objreg.analysis.run.screen_signals import interval
from objreg.analysis.run.validation import check_providers
from objreg.core.errors import InvalidParameterError
from objreg.core.registry import Registry
from objreg.toolkit.cache import cache_dir
from objreg.toolkit.randomness import stream

#: What the screen sets itself, so a caller may not.
OWN_SETTINGS = ("pretrain", "weights", "schedule", "steps", "probe_every", "downstream_head", "spectrum",
                "attribution_top", "head_warmup_steps")
#: The result of the experiment that validates the screen, shipped as package data: a copy of
#: docs/experiments/results/screen-validity.json, which objreg.experiments.docs writes together.
VALIDITY_RESULT = resources.files("objreg") / "data" / "screen-validity.json"


class Interval(TypedDict):
    mean: float
    low: float
    high: float


class ScreenEntry(TypedDict):
    """One candidate's result. ``runnable`` False: ``reason`` says why, the numbers are None."""

    candidate: str
    objectives: list[str]
    params: dict[str, dict[str, str]]
    runnable: bool
    reason: str | None
    rank: int | None
    tied: bool
    score: Interval | None
    score_per_1k_tokens: Interval | None
    steps: int
    probes: int
    tokens_per_step: float | None
    initial_downstream_loss: float | None
    final_downstream_loss: float | None
    actual_improvement: float | None
    lookahead: Interval | None  # the actual drop of D* per step over each probe interval, batch-means interval
    signals: dict[str, float] | None  # every signal by name, higher predicts more transfer (screen_signals)
    random_rank: int | None
    seconds: float
    diverged_at: int | None  # the step at which the run diverged (then not ranked; ``reason`` says how)


@dataclass
class ScreenReport:
    """What :func:`screen` returns: the candidates in rank order (unrunnable ones last), the
    settings, the validity line, and the wall time."""

    downstream: str
    budget: str
    config: dict[str, Any]
    candidates: list[ScreenEntry]
    validity: str
    seconds: float
    stopped: bool = False  # stopped by the caller (Ctrl-C): later candidates listed as not run

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, allow_nan=True)

    def ranked(self) -> list[ScreenEntry]:
        return [c for c in self.candidates if c["runnable"]]


def rank_with_ties(entries: Sequence[ScreenEntry]) -> None:
    """Set ``rank`` and ``tied`` on runnable entries, in place: by mean score, best first; a
    candidate whose interval overlaps that of its group's first joins the group and shares its
    rank (competition ranking: the next group's rank counts every candidate above it). A score or
    interval that is not a finite number cannot be ordered: that entry is not ranked and says so
    (each run's own divergence checks name the step first; this is the last guard)."""
    for entry in entries:
        if entry["runnable"] and not all(math.isfinite(entry["score"][k]) for k in ("mean", "low", "high")):
            entry["runnable"], entry["rank"], entry["tied"] = False, None, False
            entry["reason"] = "diverged: its score or its interval is not a finite number"
    order = sorted((e for e in entries if e["runnable"]), key=lambda e: -e["score"]["mean"])
    leader: ScreenEntry | None = None
    for position, entry in enumerate(order, start=1):
        if leader is not None and entry["score"]["high"] >= leader["score"]["low"]:
            entry["rank"], entry["tied"], leader["tied"] = leader["rank"], True, True
        else:
            leader = entry
            entry["rank"], entry["tied"] = position, False


def validity_line(config: AnalysisConfig, budget: Budget, path: Path = VALIDITY_RESULT, probe_every: int = 1) -> str:
    """One line: what experiment ``screen-validity`` measured in this setting (model, corpus, task and
    its data, rows and sets, optimizer, learning rate and budget), or that it is not validated for it
    (:mod:`objreg.analysis.run.screen_setting`)."""
    try:
        result = json.loads(path.read_text())
    except (OSError, ValueError):
        return f"{NOT_VALIDATED} (no committed result of experiment screen-validity)"
    return validity_for(result, config, str(budget), probe_every)


def screen(
    candidates: str | Sequence[str],
    downstream: str | None = None,
    *,
    budget: int | str | Budget | None = None,
    probe_every: int = 1,
    registry: Registry | None = None,
    cache: Path | None = None,
    on_status: Callable[[str], None] | None = None,
    on_step: Callable[[str, int, int | None], None] | None = None,
    on_plan: Callable[[int, int | None], None] | None = None,
    outcome_steps: int | None = None,
    on_outcome: Callable[[str, torch.nn.Module], None] | None = None,
    second_order: bool = False,
    stop: Callable[[], bool] | None = None,
    **settings: Any,
) -> ScreenReport:
    """Screen ``candidates`` for ``downstream`` (module docstring).

    Args:
        candidates: ``"mlm,mlm:mask_prob=0.4,mlm+sop"`` or a list of such entries.
        downstream: The task (default ``qa``).
        budget: Steps per candidate (an int, or ``"12"``), or seconds (``"90s"``); None:
            :data:`DEFAULT_BUDGET` steps.
        probe_every: Probe every this many steps (each probe re-fits the head and takes ``∇D*``).
        on_status: Called with a short line as each loading stage starts.
        on_step: Called after every step with ``(candidate, steps done, steps of its budget or None)``.
        on_plan: Called once the candidates are checked, with how many will run and the steps of
            each (None under a time budget).
        outcome_steps: For the validity experiment: after the budget, train each candidate on,
            unprobed, to this many steps in all, and report ``D*`` there (``outcome_downstream_loss``).
        on_outcome: With ``outcome_steps``: called with ``(candidate, model)`` after each outcome run
            (the validity experiment saves the backbone to fine-tune it).
        second_order: Also take ``½ Δθᵀ∇²D*Δθ`` at every probe, for the signal
            ``second_order_sum``: one Hessian-vector product of ``D*`` per probe, which costs
            about 1.6× a probed step's time on the default model (NaN without it).
        stop: Asked before each candidate: True stops the screen there (the report then holds the
            candidates that finished, the others listed as not run, ``stopped`` True). A
            ``KeyboardInterrupt`` inside a candidate's run carries that report as ``screen_report``.
        **settings: analyze's settings of the model, corpus, data and device
            (:class:`~objreg.analysis.run.config.AnalysisConfig` fields but those the screen sets).

    Raises:
        InvalidParameterError: a bad candidate, budget or setting; no candidate can run.
    """
    started = time.monotonic()
    status = on_status or (lambda _: None)
    given = sorted(set(settings) & set(OWN_SETTINGS))
    if given:
        raise InvalidParameterError(f"the screen sets {', '.join(given)} itself; give the model, corpus, data, "
                                    f"device and optimizer settings only")
    if isinstance(probe_every, bool) or not isinstance(probe_every, int) or probe_every < 1:
        raise InvalidParameterError(f"probe_every must be a positive integer, got {probe_every!r}")
    budget = parse_budget(DEFAULT_BUDGET if budget is None else budget)
    if budget.steps is not None and budget.steps <= probe_every:
        raise InvalidParameterError(
            f"a budget of {budget.steps} steps probed every {probe_every} step(s) gives one probe per candidate; a "
            f"rank needs at least two (an interval): probe more often than every {budget.steps} steps, or give a "
            f"budget of more than {probe_every} steps")
    if outcome_steps is not None and (budget.steps is None or outcome_steps < budget.steps):
        raise InvalidParameterError(f"outcome_steps must be at least the budget's steps, got {outcome_steps!r}")
    registry = registry or Registry.load()
    parsed = parse_candidates(candidates, registry)
    base = AnalysisConfig(pretrain=(parsed[0].objectives[0],), downstream=downstream or "qa", **settings)
    check_providers(base, registry)
    device = base.resolved_device()
    loaded = load(base, registry, cache or cache_dir(), base.head_fit_size, status)
    reasons = {c.label: unrunnable_reason(registry, c, base, loaded) for c in parsed}
    if all(reasons.values()):
        raise InvalidParameterError("no candidate can run here: " + "; ".join(f"{k}: {v}" for k, v in reasons.items()))
    if on_plan is not None:
        on_plan(sum(r is None for r in reasons.values()), budget.steps)
    entries = [_entry(candidate, reasons[candidate.label]) for candidate in parsed]
    start: dict[str, Any] = {}
    stopped = False

    def report() -> ScreenReport:
        """The report of the candidates that finished (the others listed with their reason)."""
        ordered = sorted(entries, key=lambda e: (not e["runnable"], e["rank"] or 0,
                                                 -e["score"]["mean"] if e["score"] else 0.0))
        config_dict = {k: v for k, v in base.to_dict().items() if k not in OWN_SETTINGS}
        config_dict.update(device=str(device), probe_every=probe_every)
        return ScreenReport(base.downstream, str(budget), config_dict, ordered,
                            validity_line(base, budget, probe_every=probe_every), time.monotonic() - started, stopped)

    def rank() -> None:
        runnable = [e for e in entries if e["runnable"]]
        order = torch.randperm(len(runnable), generator=stream(base.seed, "screen_random_order")).tolist()
        for entry, position in zip(runnable, order):
            entry["random_rank"] = position + 1
            if entry["signals"] is not None:
                entry["signals"]["random"] = -float(position + 1)
        rank_with_ties(entries)

    current: ScreenEntry | None = None
    try:
        for candidate, entry in zip(parsed, entries):
            if not entry["runnable"]:
                continue
            if stop is not None and stop():
                stopped = True
                entry.update({"runnable": False, "reason": STOPPED_BEFORE})
                continue
            current = entry
            status(f"screening {candidate.label}")

            def report_step(done: int, label: str = candidate.label) -> None:
                if on_step is not None:
                    on_step(label, done, budget.steps)

            def outcome_model(model: torch.nn.Module, label: str = candidate.label) -> None:
                if on_outcome is not None:
                    on_outcome(label, model)

            run = score_run(registry, candidate, base, loaded, budget, probe_every, device, report_step, start,
                             outcome_steps, second_order, outcome_model)
            _fill(entry, run)
            current = None
        rank()
        return report()
    except KeyboardInterrupt as interrupt:
        # Stopped at once: the candidates that finished are kept, handed over on the exception.
        stopped = True
        for entry in entries:
            if entry is current:
                entry.update({"runnable": False, "reason": STOPPED_DURING})
            elif entry["runnable"] and entry["score"] is None:
                entry.update({"runnable": False, "reason": STOPPED_BEFORE})
        rank()
        interrupt.screen_report = report()  # type: ignore[attr-defined]
        raise


#: Why a candidate was not run when the screen was stopped (Ctrl-C, SIGTERM).
STOPPED_BEFORE = "stopped before its turn"
STOPPED_DURING = "stopped while it trained (its run was abandoned)"


def _entry(candidate: Candidate, reason: str | None) -> ScreenEntry:
    return {
        "candidate": candidate.label, "objectives": list(candidate.objectives),
        "params": {k: dict(v) for k, v in candidate.params.items()}, "runnable": reason is None,
        "reason": reason, "rank": None, "tied": False, "score": None,
        "score_per_1k_tokens": None, "steps": 0, "probes": 0, "tokens_per_step": None,
        "initial_downstream_loss": None, "final_downstream_loss": None, "actual_improvement": None,
        "lookahead": None, "signals": None, "random_rank": None, "seconds": 0.0, "diverged_at": None,
    }


def _fill(entry: ScreenEntry, run: dict[str, Any]) -> None:
    """``entry`` with what its run gave (a diverged run: where, and not ranked)."""
    if run["diverged"] is not None:
        at, how = run["diverged"]
        entry.update({"runnable": False, "reason": f"diverged at step {at}: {how}", "diverged_at": at,
                      "steps": run["steps"], "probes": run["probes"], "initial_downstream_loss": run["initial"],
                      "seconds": run["seconds"]})
        return
    entry.update({
        "score": interval(run["scores"]), "score_per_1k_tokens": interval(run["per_token"]),
        "steps": run["steps"], "probes": run["probes"], "tokens_per_step": run["tokens_per_step"],
        "initial_downstream_loss": run["initial"], "final_downstream_loss": run["final"],
        "actual_improvement": run["initial"] - run["final"], "lookahead": interval(run["lookahead"]),
        "signals": run["signals"], "seconds": run["seconds"],
    })
    if run["outcome"] is not None:
        entry["outcome_downstream_loss"] = run["outcome"]  # type: ignore[typeddict-unknown-key]
        entry["outcome_seconds"] = run["outcome_seconds"]  # type: ignore[typeddict-unknown-key]
