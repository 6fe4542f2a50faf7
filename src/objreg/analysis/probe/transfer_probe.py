"""``TransferProbe``: what ``objreg analyze`` measures at a step, for any model and training loop.

Between the loop's backward and its ``optimizer.step()``, :meth:`TransferProbe.measure` takes
each objective's gradient (its own, or the loop's), the per-example dots with the downstream
gradient, ``S`` through Hessian-vector products of ``D``, and the split of the step the optimizer
is about to take; after the step, :meth:`TransferProbe.finish` reads ``Δθ`` off the parameters,
evaluates ``D`` again and returns the record, in the schema of ``objreg analyze``'s ``steps[]``
(docs/analysis.md). ``objreg analyze`` itself probes through this class
(:class:`~objreg.analysis.run.loop.Trainer`); the measurements are :class:`~objreg.analysis.probe.engine.Probe`'s.

The probe leaves the training trajectory alone: it runs in ``eval()`` mode (each module's mode is
restored), restores the global random generators, never touches ``.grad`` or the optimizer's
state, and differentiates copies of the parameters (``torch.func.functional_call``). The
objectives' gradients it computes itself (:mod:`.objective_gradients`) replay the loop's first
training-mode forward since the last optimizer step (:mod:`.replay`; dropout's masks included),
so the split is of the step the loop took.

Under Adam the split of a step needs the moments each coalition of objectives would have built
from the first step (:mod:`objreg.analysis.math.shapley`): create the probe before the optimizer's
first step, and call :meth:`TransferProbe.track` on every step you do not measure, or
:meth:`~.attached.Attached.attach` the probe to the optimizer, which does all of that by itself.
Checkpoints: :mod:`.checkpoint`.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from objreg.analysis.math.costs import warn_of_moments
from objreg.analysis.math.downstream import Downstream
from objreg.analysis.math.functional import Params, named_shared
from objreg.analysis.math.optimizers import adam_settings, advance, players
from objreg.analysis.math.shapley import CoalitionMoments
from objreg.analysis.probe.arguments import (
    Quiet,
    build_downstream,
    check_batches,
    check_given_losses,
    check_gradients,
    checked_weights,
    inner_optimizer,
    loss_functions,
    model_device,
    shared_names,
    unwrapped_model,
    user_group,
)
from objreg.analysis.probe.attached import Attached
from objreg.analysis.probe.attention import check_attention, derivable_attention
from objreg.analysis.probe.checkpoint import Checkpointed
from objreg.analysis.probe.clipping import in_loop_weights, loop_weights
from objreg.analysis.probe.engine import Pending, Probe
from objreg.analysis.probe.objective_gradients import objective_gradients, reached
from objreg.analysis.probe.optimizer_hooks import step_counter
from objreg.analysis.probe.replay import LoopForward, forward_seer, replayed
from objreg.analysis.probe.report import AlignmentReport, summarise
from objreg.analysis.probe.settings import ProbeSettings
from objreg.analysis.probe.split_check import (
    flagged,
    gradient_cause,
    mismatch_message,
    overridden_step,
    residual_cause,
    steps_cause,
    zero_grad_cause,
)
from objreg.analysis.probe.step_checks import check_finite_downstream, check_not_diverged, check_shared_unchanged
from objreg.analysis.records import StepRecord
from objreg.core.errors import InvalidParameterError, ProbeStateError
from objreg.core.handles import Objective, Task

#: A per-sample loss: ``fn(model, batch) -> [B]`` (the model's parameters are swapped for the probe's).
LossFn = Callable[[nn.Module, Any], torch.Tensor]


@dataclass
class Measurement:
    """What :meth:`TransferProbe.measure` took before the step; hand it to :meth:`TransferProbe.finish`."""

    pending: Pending
    finished: bool = False
    taken_at: int = 0  # the optimizer steps the probe had seen when it measured
    causes: list[str] = field(default_factory=list)  # what already shows the split is not of the step taken


class TransferProbe(Attached, Checkpointed):
    """Probes a training step: how each objective's gradient meets the downstream loss ``D``, to
    first and second order, and what the step the optimizer takes does to ``D``.

    Args:
        model: The trained module (a ``DistributedDataParallel`` wrapper is unwrapped).
        objectives: Name → per-sample loss ``fn(model, batch) -> [B]``, or an objreg
            ``Objective`` (its batches are then ``CorruptedBatch``).
        downstream: ``fn(model, batch) -> [B]``, the downstream per-sample loss (or an objreg ``Task``).
        optimizer: The loop's ``torch.optim.SGD`` (plain), ``Adam`` or ``AdamW`` (a wrapper with
            ``.optimizer``, as ``accelerate`` makes, is unwrapped).
        eval_batches: The fixed evaluation set defining ``D``: one batch or a list of batches
            (each evaluated as one chunk). Every process passes the whole set.
        weights: The loop's objective weights ``α_k`` (its loss is ``Σ_k α_k mean(ℓ_k)``; default 1).
        shared: The parameters measured on: a list of names, or a filter ``(name, parameter) ->
            bool``. Default: every trainable parameter both ``D`` and some objective reach.
        per_sample_method, hvp_method, eval_dtype, seed, spectrum, strict, counterfactual_radius,
        moments_dtype, moments_device: How the probe computes: the fields of
            :class:`~objreg.analysis.probe.settings.ProbeSettings` (kept as ``probe.settings``),
            which documents and checks them.
        steps: The run's length; with ``spectrum``, the top of ``H_D``'s spectrum is taken on
            steps 0 and ``steps − 1``.
        batch_coupled: Names of objectives whose example losses depend on other rows.
        whole_batches: Every process is given the whole batch and takes its share of the rows
            (``objreg analyze``); default: each process's own rows, as data-parallel loops do.
        decode: Token ids to text (example attribution of objreg objectives).
        refit_head: Re-fit the downstream head at every probed point (``D`` becomes ``D*``,
            the evaluation loss of the head fitted to the features the backbone has now): the head
            module, or the names of its parameters (those its output is linear in); None: ``D``
            reads the head as it is (frozen). :mod:`objreg.analysis.math.refit`, docs/probe.md.
        fit_batches: With ``refit_head``: the examples the head is fitted on, apart from
            ``eval_batches`` (one batch or a list, like ``eval_batches``).

    Raises:
        InvalidParameterError: an argument the probe cannot use (the message names it).
    """

    mode = "full"  # objreg.make_probe's name for it

    def __init__(
        self, model: nn.Module, objectives: Mapping[str, LossFn | Objective], downstream: LossFn | Task | Downstream,
        optimizer: torch.optim.Optimizer, *, eval_batches: Any = None, weights: Mapping[str, float] | None = None,
        shared: Sequence[str] | Callable[[str, nn.Parameter], bool] | None = None, per_sample_method: str = "auto",
        hvp_method: str = "auto", eval_dtype: torch.dtype | None = torch.float64, seed: int = 0,
        steps: int | None = None, spectrum: int = 0, batch_coupled: Sequence[str] = (), whole_batches: bool = False,
        decode: Callable[[Sequence[int]], str] | None = None, strict: bool = False,
        counterfactual_radius: float = 0.25,
        refit_head: nn.Module | Sequence[str] | None = None, fit_batches: Any = None,
        moments_dtype: torch.dtype | None = None, moments_device: torch.device | str | None = None,
    ):
        model = unwrapped_model(model)
        check_attention(model)
        optimizer = inner_optimizer(optimizer)
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise InvalidParameterError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        losses = loss_functions(objectives, batch_coupled)
        self.weights = checked_weights(weights, list(losses))
        self.settings = settings = ProbeSettings(
            per_sample_method=per_sample_method, hvp_method=hvp_method, eval_dtype=eval_dtype, seed=seed,
            spectrum=spectrum, counterfactual_radius=counterfactual_radius, strict=strict,
            moments_dtype=moments_dtype, moments_device=moments_device)
        self.model, self.optimizer = model, optimizer
        group = user_group(model) if not isinstance(downstream, Downstream) else downstream.group
        self.downstream = build_downstream(model, downstream, eval_batches, group, settings.eval_dtype,
                                           refit_head, fit_batches)
        names = shared_names(model, shared, self.downstream, optimizer,
                             check_reach=not isinstance(downstream, Downstream))
        self.downstream.shared = names
        self.engine = Probe(model, losses, self.downstream, seed=settings.seed, steps=steps if steps is not None else 0,
                            per_sample_method=settings.per_sample_method, hvp_method=settings.hvp_method,
                            spectrum=settings.spectrum, decode=decode, shared=names, local_batches=not whole_batches,
                            counterfactual_radius=settings.counterfactual_radius)
        self._narrow = shared is None  # the default: narrowed to what some objective reaches, on first use
        self._shared_given = None if shared is None else tuple(names)  # a state must measure the same
        adam = adam_settings(optimizer, self.shared_parameters)  # an unsupported optimizer fails here
        self.coalitions = None
        # Under Adam a probe made after the optimizer's first step needs the state_dict of the
        # probe that saw those steps (checked at the first measure or track).
        self._needs_state = False
        if adam is not None:
            self._needs_state = any(optimizer.state.get(p) for p in self.shared_parameters.values())
            self.coalitions = CoalitionMoments(players(list(losses), adam), seed=settings.seed,
                                               dtype=settings.moments_dtype, device=settings.moments_device)
            warn_of_moments(self.coalitions, self.shared_parameters)
        self.records: list[StepRecord] = []
        self._tracked_at: int | None = None
        self._next_step = 0
        self._start_detached()
        # Every optimizer step counted (whoever calls it), so a finish that is not one step after
        # its measure is seen; the shared parameters as measured, so changes to them are refused.
        self._steps_taken = 0
        self._open_measure_at: int | None = None
        self._warned = False
        self._override = overridden_step(optimizer)
        # The default shared set is chosen among the parameters trainable now: one unfrozen later
        # would belong to it, so the probe refuses it rather than leave it out unsaid.
        self._frozen = {n for n, p in model.named_parameters() if not p.requires_grad} if shared is None else set()
        counter = optimizer.register_step_post_hook(step_counter(weakref.ref(self)))
        weakref.finalize(self, counter.remove)
        # The loop's random state and modules' modes at its first training-mode forward since the
        # last optimizer step: the probe's own gradients replay them (dropout's masks included).
        self._forward: LoopForward | None = None
        seen = model.register_forward_pre_hook(forward_seer(weakref.ref(self)))
        weakref.finalize(self, seen.remove)
        self._remember_shared()

    @property
    def shared_parameters(self) -> dict[str, nn.Parameter]:
        """The parameters measured on, by name."""
        return named_shared(self.model, self.engine.shared)

    def track(self, batches: Mapping[str, Any] | None = None, *, weights: Mapping[str, float] | None = None,
              gradients: Mapping[str, Params] | None = None) -> None:
        """Under Adam, take this step's gradients into the coalition moments (call it between the
        backward and ``optimizer.step()`` on every step you do not :meth:`measure`); nothing under SGD."""
        self._refuse_if_attached("track")
        self._track_checked(batches, weights, gradients)

    def _track_checked(self, batches: Mapping[str, Any] | None, weights: Mapping[str, float] | None,
                       gradients: Mapping[str, Params] | None) -> None:
        if self.coalitions is None:
            return
        self._refuse_without_state()
        self._check_shared_unchanged()
        with self._quiet():
            self._track(batches, self._weights_of(weights), gradients)

    def measure(self, batches: Mapping[str, Any], *, step: int | None = None,
                weights: Mapping[str, float] | None = None, gradients: Mapping[str, Params] | None = None,
                losses: Mapping[str, float] | None = None, tokens: Mapping[str, Any] | None = None) -> Measurement:
        """Measure before ``optimizer.step()`` (after the backward: ``.grad`` holds the step's gradient).

        Args:
            batches: Each objective's batch of this step (this process's rows).
            step: The step's index in the record (default: one after the last measured).
            weights: This step's ``α_k`` (default: the constructor's).
            gradients, losses: Each objective's mean-loss gradient on the shared parameters and its
                loss, where the loop has them (default: the probe computes them in ``eval()`` mode).
            tokens: The uncorrupted token batches of objreg objectives (example attribution).
        """
        self._refuse_if_attached("measure")
        return self._measure(batches, step=step, weights=weights, gradients=gradients, losses=losses, tokens=tokens)

    def _measure(self, batches: Mapping[str, Any], *, step: int | None = None,
                 weights: Mapping[str, float] | None = None, gradients: Mapping[str, Params] | None = None,
                 losses: Mapping[str, float] | None = None, tokens: Mapping[str, Any] | None = None) -> Measurement:
        if self.coalitions is not None:
            self._refuse_without_state()
        weights = self._weights_of(weights)
        check_batches("batches", batches, self.engine.objectives, model_device(self.model))
        self._check_shared_unchanged()
        if self._open_measure_at == self._steps_taken:
            raise ProbeStateError("measure() was called twice before optimizer.step(): measure each step once, "
                                  "then finish() it after the step")
        step = self._next_step if step is None else step
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise InvalidParameterError(f"step must be an integer ≥ 0 (the step's index in the record), got {step!r}")
        with self._quiet():
            if self._narrow:
                self._narrow_to_reached(batches)
            if gradients is None:
                gradients, losses, weights_in_step = self._gradients(batches, weights)
            else:
                gradients = check_gradients(gradients, self.engine.objectives, self.shared_parameters)
                weights_in_step = weights
            if losses is not None:
                losses = check_given_losses(losses, self.engine.objectives)
            grads = {n: p.grad for n, p in self.shared_parameters.items() if p.grad is not None}
            causes = [c for c in (zero_grad_cause(list(grads.values()), gradients),
                                  gradient_cause(grads, gradients, weights)) if c is not None]
            if self.coalitions is not None and self._tracked_at != self._optimizer_steps():
                self._track(batches, weights_in_step, gradients)
            pending = self.engine.measure(step, dict(weights_in_step), self.optimizer, tokens, dict(batches),
                                          dict(losses or {}), dict(gradients), self.coalitions)
        check_finite_downstream(pending.record["downstream_loss"], f"at step {step}", self.downstream.task)
        pending.record["weights"] = dict(weights)
        in_loop_weights(pending.record, weights, weights_in_step)
        self._next_step = step + 1
        self._open_measure_at = self._steps_taken
        return Measurement(pending, taken_at=self._steps_taken, causes=causes)

    def finish(self, measurement: Measurement) -> StepRecord:
        """After ``optimizer.step()``: the step's record (``objreg analyze``'s ``steps[]`` schema),
        also appended to :attr:`records`."""
        self._refuse_if_attached("finish")
        return self._finish(measurement)

    def _finish(self, measurement: Measurement) -> StepRecord:
        if not isinstance(measurement, Measurement) or measurement.finished:
            raise ProbeStateError("finish() takes the Measurement of one measure() call, once, after optimizer.step()")
        measurement.finished = True
        self._open_measure_at = None
        pending = measurement.pending
        after = {n: p.detach() for n, p in named_shared(self.model, self.engine.shared).items()}
        causes = [*measurement.causes, *(c for c in (steps_cause(self._steps_taken - measurement.taken_at),
                                                     residual_cause(pending.before, after, pending.parts))
                                         if c is not None)]
        if causes and self._override is not None:
            causes.append(self._override)  # a likely reason, said only where the step did not match
        if causes and self.settings.strict:
            raise ProbeStateError(mismatch_message(pending.record["step"], causes))
        with self._quiet():
            record = self.engine.finish(pending)
        check_not_diverged(record["downstream_loss_after"], record["step"], self.shared_parameters, self.downstream.task)
        if causes:
            record["update"] = flagged(record["update"])
            if not self._warned:
                self._warned = True
                warnings.warn(mismatch_message(record["step"], causes), UserWarning, stacklevel=3)
        self.records.append(record)
        return record

    def report(self, downstream: str = "downstream", config: Mapping[str, Any] | None = None, *,
               weights_by_step: Sequence[Mapping[str, float]] | None = None, attribution_top: int = 0
               ) -> AlignmentReport:
        """:attr:`records` as an ``objreg.AlignmentReport`` (its summary as ``objreg analyze`` makes
        it, less the run's own parts: the mixture's counterfactual and an adaptive schedule's).

        Args:
            downstream: The downstream task's name, as the report names it.
            config: What the report's ``config`` holds (the probe adds its methods).
            weights_by_step: Every step's weights, for ``summary.weights_by_step`` (default: the
                measured steps').
            attribution_top: With N > 0, ``summary.attribution`` lists each objective's N
                highest- and lowest-scoring examples (objreg objectives with ``decode``).
        """
        if not self.records:
            raise ProbeStateError("report() summarises the finished records and there are none yet: measure() and "
                                  "finish() a step first (or attach() the probe and train)")
        names = list(self.engine.objectives)
        by_step = weights_by_step if weights_by_step is not None else [r["weights"] for r in self.records]
        summary = summarise(names, self.records, weights_by_step=[dict(w) for w in by_step],
                            update_rule=self.engine.update_rule,
                            attribution=self.engine.attribution_report(attribution_top) if attribution_top else None)
        config = {**(config or {}), "per_sample_method": ",".join(sorted(self.engine.methods_used)),
                  "hvp_method": self.engine.hvp_method}
        return AlignmentReport(pretrain=names, downstream=downstream, config=config, steps=list(self.records),
                               summary=summary)

    # -- internals -------------------------------------------------------------------------------

    def _check_shared_unchanged(self) -> None:
        check_shared_unchanged(self.model, self._shared_ids, self._frozen)

    def _remember_shared(self) -> None:
        self._shared_ids = {n: id(p) for n, p in self.shared_parameters.items()}

    def _weights_of(self, weights: Mapping[str, float] | None) -> dict[str, float]:
        return self.weights if weights is None else checked_weights(weights, list(self.engine.objectives))

    @contextmanager
    def _quiet(self) -> Iterator[None]:
        """The model in ``eval()`` mode, the random generators restored after, attention differentiable."""
        with Quiet(self.model), derivable_attention():
            yield

    def _optimizer_steps(self) -> int:
        """The optimizer's step count on the shared parameters (0 before its first step)."""
        for p in self.shared_parameters.values():
            state = self.optimizer.state.get(p)
            if state and "step" in state:
                return int(float(state["step"]))
        return 0

    def _track(self, batches: Mapping[str, Any] | None, weights: Mapping[str, float],
               gradients: Mapping[str, Params] | None) -> None:
        taken = self._optimizer_steps()
        shared = self.shared_parameters
        name, tracked = next(iter(self.coalitions.steps.items()), (None, 0))
        state = self.optimizer.state.get(shared[name]) if name is not None else None
        if name is not None and state and "step" in state:
            taken = int(float(state["step"]))
        if tracked != taken:
            raise ProbeStateError(f"the optimizer took {taken} steps but the probe saw {tracked}: under Adam call "
                                  f"track() (or measure()) on every step, before optimizer.step()")
        if gradients is None:
            if batches is None:
                raise InvalidParameterError("track() needs this step's batches (or its gradients)")
            check_batches("batches", batches, self.engine.objectives, model_device(self.model))
            gradients, _, weights = self._gradients(batches, weights)
        else:
            gradients = check_gradients(gradients, self.engine.objectives, shared)
        advance(self.coalitions, self.optimizer, shared, weights, gradients)
        self._tracked_at = self._optimizer_steps()

    def _gradients(self, batches: Mapping[str, Any], weights: Mapping[str, float]
                   ) -> tuple[dict[str, Params], dict[str, float], dict[str, float]]:
        """Each objective's mean loss and its gradient on the shared parameters (over every
        process's rows, the loop's forward replayed), and the weights as the optimizer's ``.grad``
        holds them (:func:`~objreg.analysis.probe.clipping.loop_weights`)."""
        if self._narrow:
            self._narrow_to_reached(batches)
        with replayed(self._forward, self.model):
            gradients, losses = objective_gradients(self.model, self.engine.objectives, batches, self.engine.shared,
                                                    self.downstream.group, self._next_step)
        return gradients, losses, loop_weights(weights, gradients, self.shared_parameters)

    def _narrow_to_reached(self, batches: Mapping[str, Any]) -> None:
        """Keep the default shared parameters some objective reaches (once, on the first batches)."""
        self._narrow = False
        self.engine.shared = self.downstream.shared = reached(self.model, self.engine.objectives, batches,
                                                             self.engine.shared)
        self._remember_shared()
