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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, TypedDict

import torch

from objreg.analysis.math.functional import flat_dot, flat_norm, named_shared
from objreg.analysis.math.refit import make_downstream
from objreg.analysis.probe.arguments import Quiet
from objreg.analysis.probe.attention import derivable_attention
from objreg.analysis.run.config import DTYPES, AnalysisConfig
from objreg.analysis.run.loop import Trainer
from objreg.analysis.run.prepare import FIT_CHUNK, Loaded, check_fits, load, start_model
from objreg.analysis.run.screen_setting import NOT_VALIDATED
from objreg.analysis.run.screen_setting import line as validity_for
from objreg.analysis.run.screen_signals import Probe, Trajectory, interval, lookahead_drops, signals
from objreg.analysis.run.validation import check_providers
from objreg.core.errors import DataError, InvalidParameterError
from objreg.core.registry import Registry
from objreg.toolkit.cache import cache_dir
from objreg.toolkit.randomness import stream

#: Steps per candidate when no budget is given (docs/performance.md: 8 candidates on the default
#: model in a few minutes on two CPU cores).
DEFAULT_BUDGET = 8
#: The most steps a budget may give, and a time budget may run (it stops at its time first unless
#: steps are very cheap).
MAX_STEPS = 10_000
#: The longest time budget per candidate: a day.
MAX_SECONDS = 86_400
#: What the screen sets itself, so a caller may not.
OWN_SETTINGS = ("pretrain", "weights", "schedule", "steps", "probe_every", "downstream_head", "spectrum",
                "attribution_top", "head_warmup_steps")
#: The result of the experiment that validates the screen, shipped as package data: a copy of
#: docs/experiments/results/screen-validity.json, which objreg.experiments.docs writes together.
VALIDITY_RESULT = resources.files("objreg") / "data" / "screen-validity.json"


@dataclass(frozen=True)
class Candidate:
    """One candidate: its ``label`` as given, its objectives with their parameters (as strings,
    validated by the plugins), and their weights (equal, summing to 1)."""

    label: str
    objectives: tuple[str, ...]
    params: Mapping[str, Mapping[str, str]]

    @property
    def weights(self) -> dict[str, float]:
        return dict.fromkeys(self.objectives, 1.0 / len(self.objectives))


@dataclass(frozen=True)
class Budget:
    """Steps per candidate, or seconds per candidate (then steps run until the time is spent)."""

    steps: int | None = None
    seconds: float | None = None

    def __str__(self) -> str:
        return f"{self.steps} steps" if self.steps is not None else f"{self.seconds:g}s"


def parse_budget(budget: int | str | Budget) -> Budget:
    """``12`` or ``"12"``: steps; ``"90s"``: seconds per candidate.

    Raises:
        InvalidParameterError: anything else, or a budget that is not positive.
    """
    if isinstance(budget, Budget):
        return budget
    if isinstance(budget, bool):
        raise InvalidParameterError(f"budget must be a number of steps or seconds like 90s, got {budget!r}")
    if isinstance(budget, int):
        if budget < 2:
            raise InvalidParameterError(f"budget must be at least 2 steps (an interval needs two probes), got {budget}")
        if budget > MAX_STEPS:
            raise InvalidParameterError(f"budget must be at most {MAX_STEPS} steps per candidate (a screen is a short "
                                        f"run; analyze trains longer), got {budget}")
        return Budget(steps=budget)
    text = str(budget).strip()
    try:
        if text.endswith("s"):
            seconds = float(text[:-1])
            if not math.isfinite(seconds) or seconds <= 0:
                raise ValueError
            if seconds > MAX_SECONDS:
                raise InvalidParameterError(f"budget must be at most {MAX_SECONDS}s per candidate (a screen is a short "
                                            f"run; analyze trains longer), got {budget!r}")
            return Budget(seconds=seconds)
        return parse_budget(int(text))
    except InvalidParameterError:  # a ValueError too, but already the message to give
        raise
    except ValueError:
        raise InvalidParameterError(
            f"budget must be a number of steps (at least 2, e.g. 12) or of seconds per candidate (e.g. 90s), "
            f"got {budget!r}") from None


def parse_candidates(candidates: str | Sequence[str], registry: Registry) -> list[Candidate]:
    """Candidates from ``"mlm,mlm:mask_prob=0.4,mlm+sop"`` (or a list of such entries), each
    objective and parameter checked against its plugin.

    Grammar: candidates separated by ``,``; a mixture's objectives by ``+``; an objective's
    parameters follow it after ``:``, each ``NAME=VALUE``, several separated by ``:``.

    Raises:
        InvalidParameterError: no candidate, a malformed entry, an unknown objective or parameter,
            a bad parameter value, an objective repeated within a mixture, or a candidate repeated.
    """
    if isinstance(candidates, str):
        entries = candidates.split(",")
    elif isinstance(candidates, Sequence):
        entries = list(candidates)
        wrong = [e for e in entries if not isinstance(e, str)]
        if wrong:
            wrong = wrong[0]
            raise InvalidParameterError(f"every candidate must be a string like 'mlm', 'mlm:mask_prob=0.4' or "
                                        f"'mlm+sop'; got {wrong!r} ({type(wrong).__name__})")
    else:
        raise InvalidParameterError(f"candidates must be a comma-separated string or a list of strings, got "
                                    f"{type(candidates).__name__}")
    entries = [e.strip() for e in entries if e.strip()]
    if not entries:
        raise InvalidParameterError("no candidate given: name at least one, e.g. --candidates mlm,clm,sop")
    parsed: list[Candidate] = []
    seen: dict[frozenset, str] = {}  # what each candidate trains on, after its plugins' parsing → its label
    for entry in entries:
        objectives: list[str] = []
        params: dict[str, dict[str, str]] = {}
        resolved: dict[str, str] = {}
        for part in entry.split("+"):
            name, *assignments = [p.strip() for p in part.split(":")]
            if not name:
                raise InvalidParameterError(f"malformed candidate {entry!r}: expected OBJECTIVE[:PARAM=VALUE...]"
                                            f"[+OBJECTIVE...], e.g. mlm:mask_prob=0.4 or mlm+sop")
            if name in objectives:
                raise InvalidParameterError(f"candidate {entry!r} names {name!r} twice")
            given: dict[str, str] = {}
            for assignment in assignments:
                key, sep, value = assignment.partition("=")
                if not sep or not key.strip() or not value.strip():
                    raise InvalidParameterError(f"malformed parameter {assignment!r} in candidate {entry!r}: "
                                                f"expected NAME=VALUE, e.g. mlm:mask_prob=0.4")
                if key.strip() in given:
                    raise InvalidParameterError(f"candidate {entry!r} gives {name}'s parameter {key.strip()!r} twice")
                given[key.strip()] = value.strip()
            # Unknown names, unknown parameters and bad values, in the plugin's words; its parsed
            # parameters (defaults filled in) tell two spellings of one candidate apart.
            resolved[name] = repr(sorted(registry.get(name, **given).params.items()))
            objectives.append(name)
            if given:
                params[name] = given
        label = "+".join(o + "".join(f":{k}={v}" for k, v in params.get(o, {}).items()) for o in objectives)
        if any(c.label == label for c in parsed):
            raise InvalidParameterError(f"candidate {label!r} is given twice")
        same = frozenset(resolved.items())  # a mixture's order and a parameter's spelling aside
        if same in seen:
            raise InvalidParameterError(f"candidates {seen[same]!r} and {label!r} are the same objective(s) with the "
                                        f"same parameters (defaults included): screen each once")
        seen[same] = label
        parsed.append(Candidate(label, tuple(objectives), params))
    return parsed


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


def _reason(registry: Registry, candidate: Candidate, config: AnalysisConfig, loaded: Loaded) -> str | None:
    """Why ``candidate`` cannot run here (analyze's own checks), or None."""
    try:
        for name in candidate.objectives:
            objective = registry.get(name, vocab=loaded.tokenized.vocab, **candidate.params.get(name, {}))
            check_fits(objective.info, config)
            objective.check_architecture(loaded.architecture)
            # A missing special token or an objective the corpus cannot feed fails on its first batch.
            sample = loaded.tokenized.sample(2, torch.Generator().manual_seed(0),
                                             min_sentences=objective.info.min_sentences, what=name)
            if not objective.prepares:
                objective.corrupt(sample, torch.Generator().manual_seed(0))
    except (InvalidParameterError, DataError) as error:
        return str(error)
    return None


def _score_run(registry: Registry, candidate: Candidate, config: AnalysisConfig, loaded: Loaded,
               budget: Budget, probe_every: int, device: torch.device,
               on_step: Callable[[int], None], start: dict[str, Any], outcome_steps: int | None = None,
               second_order: bool = False, on_outcome: Callable[[torch.nn.Module], None] | None = None
               ) -> dict[str, Any]:
    """Train ``candidate`` alone from the shared start and probe it (module docstring).

    ``start``: the re-fitted head at the shared start (``RefitDownstream.state_dict``), filled by
    the first candidate's first probe; every later candidate's first solve starts from it, so the
    shared start's head is solved from zero once rather than once per candidate. ``second_order``:
    also ``½ Δθᵀ∇²D*Δθ`` at each probe (:mod:`objreg.analysis.run.screen_signals`).
    ``on_outcome``: called with the model after the outcome run (the validity experiment saves it)."""
    objectives = {n: registry.get(n, vocab=loaded.tokenized.vocab, **candidate.params.get(n, {}))
                  for n in candidate.objectives}
    model, head = start_model(registry, config, loaded, objectives, device, refit=True)
    evaluation_dtype = DTYPES[config.eval_dtype] if config.eval_dtype != "model" else None
    downstream = make_downstream(loaded.task, loaded.eval_batch.to(device), head=head,
                                 fit=loaded.fit_batch.to(device), evaluation_dtype=evaluation_dtype,
                                 fit_chunk_size=FIT_CHUNK)
    downstream.check(model)
    if start:
        downstream.load_state_dict(start)
    steps = budget.steps if budget.steps is not None else MAX_STEPS
    trainer = Trainer(model, objectives, candidate.weights, loaded.tokenized, downstream, optimizer=config.optimizer,
                      lr=config.lr, batch_size=config.batch_size, seed=config.seed, device=device, steps=steps)
    shared = named_shared(model, None)
    trajectory = Trajectory()
    per_token: list[float] = []
    tokens: list[int] = []
    started = time.monotonic()
    initial = None
    previous = None  # D* at the previous probe
    diverged: tuple[int, str] | None = None
    step = 0
    while step < steps:
        # A time budget runs on to its second probe at least: a rank needs an interval.
        if budget.seconds is not None and len(trajectory.probes) >= 2 and time.monotonic() - started >= budget.seconds:
            break
        probed = step % probe_every == 0
        _, batches = trainer.next_batches()
        weights = candidate.weights
        step_losses, gradients = trainer.accumulate_gradients(step, batches, weights, keep=True)
        loss = sum(weights[n] * v for n, v in step_losses.items())
        if not math.isfinite(loss):
            diverged = (step, f"its training loss is {loss}")
            break
        trajectory.losses.append(loss)
        combined = {p: sum(weights[n] * gradients[n][p] for n in gradients) for p in shared}
        count = sum(int((~b.is_padding).sum()) for b in batches.values())
        tokens.append(count)
        if probed:
            before = {n: p.detach().clone() for n, p in shared.items()}
            with Quiet(model), derivable_attention():
                value = downstream.loss(model)
                if not math.isfinite(value):
                    diverged = (step, f"its D* is {value}")
                    break
                curvature = downstream.curvature(model, before)
                if not second_order:
                    gradient, _ = curvature.gradient_and_products([])
            if not start:
                start.update(downstream.state_dict())
            initial = value if initial is None else initial
            if previous is not None and initial > 0 and abs(value - previous) > initial:
                diverged = (step, f"D* went from {previous:.4g} to {value:.4g} in {probe_every} step(s), a change "
                                  f"larger than D* at the start ({initial:.4g})")
                break
            previous = value
        trainer.optimizer.step()
        if not all(bool(torch.isfinite(p).all()) for p in shared.values()):
            diverged = (step, "its weights became infinite or NaN")
            break
        if probed:
            delta = {n: p.detach() - before[n] for n, p in shared.items()}
            second = None
            if second_order:  # ∇D* and ∇²D*Δθ at θ_t (the curvature object holds θ_t), one call
                with Quiet(model), derivable_attention():
                    gradient, (product,) = curvature.gradient_and_products([delta])
                second = 0.5 * float(flat_dot(delta, product))
            score = -float(flat_dot(gradient, delta))
            # A step whose first-order prediction moves D* by more than D* itself at the start is far
            # outside the regime where a first-order term predicts anything.
            if not math.isfinite(score) or (initial > 0 and abs(score) > initial):
                diverged = (step, f"its step's predicted change of D* ({-score:+.4g}) is larger than D* at the start "
                                  f"({initial:.4g}): far outside the first-order regime")
                break
            trajectory.probes.append(Probe(
                step=step, dstar=value, predicted_drop=score, curvature=second,
                alignment=float(flat_dot(gradient, combined)), dstar_gradient_norm=float(flat_norm(gradient)),
                gradient_norm=float(flat_norm(combined)), step_norm=float(flat_norm(delta))))
            per_token.append(1000.0 * score / max(count, 1))
        step += 1
        on_step(step)
    spent = time.monotonic() - started
    if diverged is not None:  # nothing after it means anything; D* may not even be defined
        return {"steps": step, "probes": len(trajectory.probes), "diverged": diverged, "initial": initial,
                "seconds": spent}
    with Quiet(model):
        final = downstream.loss(model)
    outcome = outcome_seconds = None
    if outcome_steps is not None:  # the validity experiment's outcome: the same run, continued unprobed
        continued = time.monotonic()
        for later in range(step, outcome_steps):
            _, batches = trainer.next_batches()
            trainer.accumulate_gradients(later, batches, candidate.weights, keep=False)
            trainer.optimizer.step()
        with Quiet(model):
            outcome = downstream.loss(model)
        outcome_seconds = time.monotonic() - continued
        if on_outcome is not None:
            on_outcome(model)
    return {
        "steps": step, "probes": len(trajectory.probes), "diverged": None,
        "scores": [p.predicted_drop for p in trajectory.probes], "per_token": per_token,
        "lookahead": lookahead_drops(trajectory, step, final), "signals": signals(trajectory, step, final),
        "tokens_per_step": sum(tokens) / len(tokens), "initial": initial, "final": final,
        "seconds": spent, "outcome": outcome, "outcome_seconds": outcome_seconds,
    }


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
    reasons = {c.label: _reason(registry, c, base, loaded) for c in parsed}
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

            run = _score_run(registry, candidate, base, loaded, budget, probe_every, device, report_step, start,
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
