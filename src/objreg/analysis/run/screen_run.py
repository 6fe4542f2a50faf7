"""One candidate's short run in the screen: whether it can run on this model at all
(:func:`unrunnable_reason`, analyze's own checks), and its training from the shared start with a
probe at every ``probe_every`` steps (:func:`score_run`), whose records
:mod:`objreg.analysis.run.screen_signals` turns into signals."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import torch

from objreg.analysis.math.functional import named_shared
from objreg.analysis.math.refit import make_downstream
from objreg.analysis.probe.first_order import FirstOrderProbe
from objreg.analysis.run.config import DTYPES, AnalysisConfig
from objreg.analysis.run.loop import Trainer
from objreg.analysis.run.prepare import FIT_CHUNK, Loaded, check_fits, start_model
from objreg.analysis.run.screen_candidates import MAX_STEPS, Budget, Candidate
from objreg.analysis.run.screen_signals import Trajectory, lookahead_drops, signals
from objreg.core.errors import DataError, InvalidParameterError
from objreg.core.registry import Registry


def unrunnable_reason(registry: Registry, candidate: Candidate, config: AnalysisConfig, loaded: Loaded) -> str | None:
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


def score_run(registry: Registry, candidate: Candidate, config: AnalysisConfig, loaded: Loaded,
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
    probe = FirstOrderProbe(model, downstream, shared=list(shared), second_order=second_order)
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
            measured = probe.measure(step, combined)
            value = measured.downstream_loss
            if not math.isfinite(value):
                diverged = (step, f"its D* is {value}")
                break
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
            record = probe.finish(measured)
            score = record["predicted_drop"]
            # A step whose first-order prediction moves D* by more than D* itself at the start is far
            # outside the regime where a first-order term predicts anything.
            if not math.isfinite(score) or (initial > 0 and abs(score) > initial):
                diverged = (step, f"its step's predicted change of D* ({-score:+.4g}) is larger than D* at the start "
                                  f"({initial:.4g}): far outside the first-order regime")
                break
            trajectory.probes.append(record)
            per_token.append(1000.0 * score / max(count, 1))
        step += 1
        on_step(step)
    spent = time.monotonic() - started
    if diverged is not None:  # nothing after it means anything; D* may not even be defined
        return {"steps": step, "probes": len(trajectory.probes), "diverged": diverged, "initial": initial,
                "seconds": spent}
    final = probe.loss()
    outcome = outcome_seconds = None
    if outcome_steps is not None:  # the validity experiment's outcome: the same run, continued unprobed
        continued = time.monotonic()
        for later in range(step, outcome_steps):
            _, batches = trainer.next_batches()
            trainer.accumulate_gradients(later, batches, candidate.weights, keep=False)
            trainer.optimizer.step()
        outcome = probe.loss()
        outcome_seconds = time.monotonic() - continued
        if on_outcome is not None:
            on_outcome(model)
    return {
        "steps": step, "probes": len(trajectory.probes), "diverged": None,
        "scores": [p["predicted_drop"] for p in trajectory.probes], "per_token": per_token,
        "lookahead": lookahead_drops(trajectory, step, final), "signals": signals(trajectory, step, final),
        "tokens_per_step": sum(tokens) / len(tokens), "initial": initial, "final": final,
        "seconds": spent, "outcome": outcome, "outcome_seconds": outcome_seconds,
    }
