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
objectives' gradients it computes itself are taken as the loop's step ran: a forward pre-hook
keeps the random state and the modules' modes of the loop's first training-mode forward since the
last optimizer step, and the gradients replay them (:func:`_replayed`; dropout's masks included),
so the split is of the step the loop took.

Under Adam the split of a step needs the moments each coalition of objectives would have built
from the first step (:mod:`objreg.analysis.math.shapley`): create the probe before the optimizer's
first step, and call :meth:`TransferProbe.track` on every step you do not measure.

:meth:`TransferProbe.attach` does all of that by itself: it hooks the optimizer's step, so the
loop only hands the probe each step's batches (:meth:`TransferProbe.observe`) before
``optimizer.step()``, and measure, track and finish cannot be forgotten or called out of order.
:meth:`TransferProbe.state_dict` and :meth:`TransferProbe.load_state_dict` checkpoint and resume
a probed loop beside the model's and the optimizer's own state.
"""

from __future__ import annotations

import math
import sys
import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from objreg.analysis.math.costs import moments_warning
from objreg.analysis.math.curvature import HVP_METHODS
from objreg.analysis.math.downstream import Downstream
from objreg.analysis.math.functional import ObjectiveFunction, Params, named_shared, requiring_grad
from objreg.analysis.math.optimizers import adam_settings, advance, players, shared_group, stepped
from objreg.analysis.math.per_sample import METHODS as PER_SAMPLE_METHODS
from objreg.analysis.math.refit import RefitDownstream
from objreg.analysis.math.shapley import CoalitionMoments
from objreg.analysis.probe.arguments import (
    Quiet,
    build_downstream,
    check_batches,
    check_choice,
    check_finite_losses,
    check_given_losses,
    check_gradients,
    checked_weights,
    loss_functions,
    loss_label,
    model_device,
    shared_names,
    user_group,
)
from objreg.analysis.probe.attention import check_attention, derivable_attention
from objreg.analysis.probe.engine import Pending, Probe
from objreg.analysis.probe.report import AlignmentReport, summarise
from objreg.analysis.probe.split_check import (
    gradient_cause,
    mismatch_message,
    overridden_step,
    residual_cause,
    steps_cause,
    zero_grad_cause,
)
from objreg.analysis.probe.state import check_state, optimizer_settings, parameter_layout
from objreg.analysis.records import StepRecord
from objreg.core.errors import InvalidParameterError, NonFiniteLossError, ProbeStateError
from objreg.core.handles import Objective, Task

#: A per-sample loss: ``fn(model, batch) -> [B]`` (the model's parameters are swapped for the probe's).
LossFn = Callable[[nn.Module, Any], torch.Tensor]
#: Called by an attached probe with each record it finishes.
RecordCallback = Callable[[StepRecord], None]
#: Bumped when :meth:`TransferProbe.state_dict` changes shape (older states are refused).
STATE_FORMAT = 2


@dataclass
class Measurement:
    """What :meth:`TransferProbe.measure` took before the step; hand it to :meth:`TransferProbe.finish`."""

    pending: Pending
    finished: bool = False
    taken_at: int = 0  # the optimizer steps the probe had seen when it measured
    causes: list[str] = field(default_factory=list)  # what already shows the split is not of the step taken


@dataclass
class Observed:
    """What :meth:`TransferProbe.observe` was handed for the coming step of an attached probe."""

    batches: Mapping[str, Any]
    options: dict[str, Any] = field(default_factory=dict)
    finite: bool = True  # whether the gradients were finite (else the optimizer may skip the step)


def _hooks_of(probe: Any, optimizer: torch.optim.Optimizer, pre: Callable[..., None] | None = None,
              post: Callable[..., None] | None = None) -> list[Any]:
    """The optimizer's step hooks calling ``probe``'s methods ``pre`` and ``post`` through a weak
    reference: the hooks do not keep a probe alive that its user dropped, and they are removed
    when it is collected."""
    this = weakref.ref(probe)

    def calling(method: Callable[..., None]) -> Callable[..., None]:
        def hook(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            alive = this()
            if alive is not None:
                method(alive, optimizer, args, kwargs)
        return hook

    handles = ([optimizer.register_step_pre_hook(calling(pre))] if pre is not None else []) + \
        ([optimizer.register_step_post_hook(calling(post))] if post is not None else [])
    weakref.finalize(probe, _remove_all, list(handles))
    return handles


def _remove_all(handles: list[Any]) -> None:
    for handle in handles:
        handle.remove()


class TransferProbe:
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
        per_sample_method: ``auto`` (as ``objreg analyze``: ghost, then jvp, double backward,
            the per-example loop), or one of them, or ``vmap``
            (:data:`objreg.analysis.math.per_sample.METHODS`).
        hvp_method: ``auto``, ``forward_over_reverse`` or ``double_backward``
            (:data:`objreg.analysis.math.curvature.HVP_METHODS`).
        eval_dtype: The dtype ``D`` itself is evaluated in (a copy of the model); None: the model's.
        seed: Seeds the bootstrap intervals (and the spectrum's start).
        steps: The run's length; with ``spectrum``, the top of ``H_D``'s spectrum is taken on
            steps 0 and ``steps − 1``.
        spectrum: How many top eigenvalues of ``H_D`` to take (0: none).
        batch_coupled: Names of objectives whose example losses depend on other rows.
        whole_batches: Every process is given the whole batch and takes its share of the rows
            (``objreg analyze``); default: each process's own rows, as data-parallel loops do.
        decode: Token ids to text (example attribution of objreg objectives).
        downstream_head: Re-fit the downstream head at every probed point (``D`` becomes ``D*``,
            the evaluation loss of the head fitted to the features the backbone has now): the head
            module, or the names of its parameters (those its output is linear in); None: ``D``
            reads the head as it is (frozen). :mod:`objreg.analysis.math.refit`, docs/probe.md.
        fit_batches: With ``downstream_head``: the examples the head is fitted on, apart from
            ``eval_batches`` (one batch or a list, like ``eval_batches``).
        strict: Raise :class:`~objreg.core.errors.ProbeStateError` where a record would be
            flagged because its split does not describe the step the optimizer took (default:
            flag the record, ``update.decomposition_flagged``, and warn once;
            :mod:`objreg.analysis.probe.split_check`).
        counterfactual_radius: Under Adam, how far from the weights used (a share of their total)
            the record's exact counterfactual points reach (``counterfactual.points``).
        moments_dtype, moments_device: Under Adam, the dtype (None: the parameters'; or
            ``torch.bfloat16``, stochastically rounded) and the device (None: the parameters';
            ``"cpu"``) the coalition moments of the step's split are kept in
            (:class:`~objreg.analysis.math.shapley.CoalitionMoments`; a warning says when they
            would outgrow the optimizer's own state: :mod:`objreg.analysis.math.costs`).

    Raises:
        InvalidParameterError: an argument the probe cannot use (the message names it).
    """

    def __init__(
        self, model: nn.Module, objectives: Mapping[str, LossFn | Objective], downstream: LossFn | Task | Downstream,
        optimizer: torch.optim.Optimizer, *, eval_batches: Any = None, weights: Mapping[str, float] | None = None,
        shared: Sequence[str] | Callable[[str, nn.Parameter], bool] | None = None, per_sample_method: str = "auto",
        hvp_method: str = "auto", eval_dtype: torch.dtype | None = torch.float64, seed: int = 0,
        steps: int | None = None, spectrum: int = 0, batch_coupled: Sequence[str] = (), whole_batches: bool = False,
        decode: Callable[[Sequence[int]], str] | None = None, strict: bool = False,
        counterfactual_radius: float = 0.25,
        downstream_head: nn.Module | Sequence[str] | None = None, fit_batches: Any = None,
        moments_dtype: torch.dtype | None = None, moments_device: torch.device | str | None = None,
    ):
        # DistributedDataParallel's module, torch.compile's original module (the probe's own
        # transforms run the eager module), in any nesting.
        while isinstance(model, nn.parallel.DistributedDataParallel) or isinstance(
                getattr(model, "_orig_mod", None), nn.Module):
            model = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model._orig_mod
        if not isinstance(model, nn.Module):
            raise InvalidParameterError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        check_attention(model)
        while isinstance(getattr(optimizer, "optimizer", None), torch.optim.Optimizer):  # accelerate's wrapper
            optimizer = optimizer.optimizer
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise InvalidParameterError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        losses = loss_functions(objectives, batch_coupled)
        self.weights = checked_weights(weights, list(losses))
        check_choice("per_sample_method", per_sample_method, PER_SAMPLE_METHODS)
        check_choice("hvp_method", hvp_method, HVP_METHODS)
        if eval_dtype is not None and not (isinstance(eval_dtype, torch.dtype) and eval_dtype.is_floating_point):
            raise InvalidParameterError(f"eval_dtype must be a floating torch.dtype or None, got {eval_dtype!r}")
        self.model, self.optimizer = model, optimizer
        group = user_group(model) if not isinstance(downstream, Downstream) else downstream.group
        self.downstream = build_downstream(model, downstream, eval_batches, group, eval_dtype, downstream_head,
                                           fit_batches)
        names = shared_names(model, shared, self.downstream, optimizer,
                             check_reach=not isinstance(downstream, Downstream))
        self.downstream.shared = names
        self.engine = Probe(model, losses, self.downstream, seed=seed, steps=steps if steps is not None else 0,
                            per_sample_method=per_sample_method, hvp_method=hvp_method, spectrum=spectrum,
                            decode=decode, shared=names, local_batches=not whole_batches,
                            counterfactual_radius=counterfactual_radius)
        self._narrow = shared is None  # the default: narrowed to what some objective reaches, on first use
        self._shared_given = None if shared is None else tuple(names)  # a state must measure the same
        settings = adam_settings(optimizer, self.shared_parameters)  # an unsupported optimizer fails here
        self.coalitions = None
        # Under Adam a probe made after the optimizer's first step needs the state_dict of the
        # probe that saw those steps (checked at the first measure or track).
        self._needs_state = False
        if settings is not None:
            self._needs_state = any(optimizer.state.get(p) for p in self.shared_parameters.values())
            self.coalitions = CoalitionMoments(players(list(losses), settings), seed=seed, dtype=moments_dtype,
                                               device=moments_device)
            _warn_of_moments(self.coalitions, self.shared_parameters)
        self.records: list[StepRecord] = []
        self._tracked_at: int | None = None
        self._next_step = 0
        # attach(): the optimizer's hooks, the steps they have seen, and the coming step's batches.
        self._hooks: list[Any] = []
        self._every = 1
        self._on_record: RecordCallback | None = None
        self._steps_seen = 0
        self._observed: Observed | None = None
        self._warned_skip = False
        self._counting: list[Any] = []  # the step counter's hook while detached
        self._attached_measurement: Measurement | None = None
        # Every optimizer step counted (whoever calls it), so a finish that is not one step after
        # its measure is seen; the shared parameters as measured, so changes to them are refused.
        self.strict = bool(strict)
        self._steps_taken = 0
        self._open_measure_at: int | None = None
        self._warned = False
        self._override = overridden_step(optimizer)
        # The default shared set is chosen among the parameters trainable now: one unfrozen later
        # would belong to it, so the probe refuses it rather than leave it out unsaid.
        self._frozen = {n for n, p in model.named_parameters() if not p.requires_grad} if shared is None else set()
        counter = optimizer.register_step_post_hook(_step_counter(weakref.ref(self)))
        weakref.finalize(self, counter.remove)
        # The loop's random state and modules' modes at its first training-mode forward since the
        # last optimizer step: the probe's own gradients replay them (dropout's masks included).
        self._forward: _Forward | None = None
        seen = model.register_forward_pre_hook(_forward_seer(weakref.ref(self)))
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
        self._check_downstream(pending.record["downstream_loss"], f"at step {step}")
        pending.record["weights"] = dict(weights)
        _in_your_weights(pending.record, weights, weights_in_step)
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
        if causes and self.strict:
            raise ProbeStateError(mismatch_message(pending.record["step"], causes))
        with self._quiet():
            record = self.engine.finish(pending)
        self._check_diverged(record["downstream_loss_after"], record["step"])
        if causes:
            record["update"] = _flagged(record["update"])
            if not self._warned:
                self._warned = True
                warnings.warn(mismatch_message(record["step"], causes), UserWarning, stacklevel=3)
        self.records.append(record)
        return record

    # -- attached to the optimizer -----------------------------------------------------------------

    def attach(self, optimizer: torch.optim.Optimizer | None = None, *, every: int = 1,
               on_record: RecordCallback | None = None) -> TransferProbe:
        """Hook the optimizer's step, so the probe measures every ``every``-th step (and the first;
        the last too when ``steps`` was given) and tracks the others by itself; the loop calls
        :meth:`observe` with each step's batches before ``optimizer.step()``. ``on_record`` is
        called with each finished record (write it, log it). Returns the probe.

        Args:
            optimizer: The probe's optimizer (optional: the probe already holds it; a different
                one is refused).
            every: Measure every this many optimizer steps.
            on_record: Called with each record as it is finished.

        Raises:
            InvalidParameterError: another optimizer, a bad ``every``, or an uncallable ``on_record``.
            ProbeStateError: the probe is already attached.
        """
        if optimizer is not None:
            while isinstance(getattr(optimizer, "optimizer", None), torch.optim.Optimizer):
                optimizer = optimizer.optimizer
            if optimizer is not self.optimizer:
                raise InvalidParameterError("attach() takes the optimizer the probe was made with (or none)")
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise InvalidParameterError(f"every must be a positive integer, got {every!r}")
        if on_record is not None and not callable(on_record):
            raise InvalidParameterError(f"on_record must be callable, got {type(on_record).__name__}")
        if self._hooks:
            raise ProbeStateError("the probe is already attached; detach() it first")
        self._every, self._on_record = every, on_record
        for handle in self._counting:
            handle.remove()
        self._counting = []
        self._hooks = _hooks_of(self, self.optimizer, pre=TransferProbe._before_step, post=TransferProbe._after_step)
        return self

    def detach(self) -> None:
        """Remove the optimizer's hooks (a step's batches handed over but not stepped are dropped).
        The probe goes on counting the optimizer's steps, so records after a new :meth:`attach`
        carry the optimizer's step numbers."""
        for handle in self._hooks:
            handle.remove()
        if self._hooks:
            self._counting = _hooks_of(self, self.optimizer, post=TransferProbe._count_step)
        self._hooks, self._observed, self._attached_measurement = [], None, None

    def _count_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._steps_seen += 1

    def observe(self, batches: Mapping[str, Any], *, weights: Mapping[str, float] | None = None,
                gradients: Mapping[str, Params] | None = None, losses: Mapping[str, float] | None = None,
                tokens: Mapping[str, Any] | None = None) -> None:
        """Hand an attached probe the coming step's batches (after the backward, before
        ``optimizer.step()``); the other arguments are :meth:`measure`'s.

        Raises:
            ProbeStateError: the probe is not attached, or this step's batches were already handed over.
            InvalidParameterError: batches that do not name every objective.
        """
        if not self._hooks:
            raise ProbeStateError("observe() feeds an attached probe: call attach() first (or use measure/finish)")
        if self._observed is not None:
            if self._observed.finite:
                raise ProbeStateError("observe() was called twice before optimizer.step(), and the gradients of the "
                                      "first were finite (no skipped step): hand over each step's batches once "
                                      "(gradient accumulation over several micro-batches is not supported), and "
                                      "step the optimizer the probe is attached to (not another optimizer than the "
                                      "one the probe is attached to, made since)")
            # The optimizer never stepped on the last batches: their gradients were not finite, a step
            # a GradScaler skips. The probe skips it too.
            if not self._warned_skip:
                self._warned_skip = True
                warnings.warn(f"optimizer step {self._steps_seen} was skipped (its gradients were not finite, as a "
                              f"GradScaler skips such a step): the probe skips it too (warned once)",
                              UserWarning, stacklevel=2)
            self._observed = None
        check_batches("batches", batches, self.engine.objectives)
        options = {"weights": weights, "gradients": gradients, "losses": losses, "tokens": tokens}
        grads = [p.grad for p in self.shared_parameters.values() if p.grad is not None]
        finite = not grads or bool(torch.stack([torch.isfinite(g).all() for g in grads]).all())
        self._observed = Observed(batches, {k: v for k, v in options.items() if v is not None}, finite)

    def _due(self, step: int) -> bool:
        return step % self._every == 0 or (self.engine.steps > 0 and step == self.engine.steps - 1)

    def _before_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        observed, self._observed = self._observed, None
        step = self._steps_seen
        if not self._due(step) and self.coalitions is None:
            return  # plain SGD between probes: nothing to keep
        if observed is None:
            raise ProbeStateError(f"optimizer step {step}: the attached probe was handed no batches; call "
                                  f"probe.observe(batches) after the backward and before optimizer.step()")
        if self._due(step):
            self._attached_measurement = self._measure(observed.batches, step=step, **observed.options)
        else:
            self._track_checked(observed.batches, observed.options.get("weights"), observed.options.get("gradients"))

    def _after_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._steps_seen += 1
        measurement, self._attached_measurement = self._attached_measurement, None
        if measurement is not None:
            record = self._finish(measurement)
            if self._on_record is not None:
                self._on_record(record)

    def _refuse_if_attached(self, call: str) -> None:
        if self._hooks:
            raise ProbeStateError(f"{call}() is not called on an attached probe: it measures, tracks and finishes "
                                  f"by itself; hand it each step's batches with observe() (or detach() it)")

    def _refuse_without_state(self) -> None:
        if self._needs_state:
            raise ProbeStateError("create the TransferProbe before the optimizer's first step (under Adam the split "
                                  "of a step needs every step's gradients from the first), or load the state_dict "
                                  "of the probe that saw those steps")

    # -- checkpoints -------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Everything the probe keeps across steps, as tensors and plain data (``torch.save`` it
        beside the model's and the optimizer's state; it loads with ``weights_only=True``): the
        records, the measured parameters' names, the Adam coalition moments, the example scores,
        the methods chosen and the step counters."""
        engine = self.engine
        return {
            "format": STATE_FORMAT,
            "objectives": list(engine.objectives),
            "shared": list(engine.shared),
            "parameters": parameter_layout(self.shared_parameters),
            "optimizer": self._optimizer_settings(),
            "records": list(self.records),
            "next_step": self._next_step,
            "steps_seen": self._steps_seen,
            "tracked_at": self._tracked_at,
            "coalitions": self.coalitions.state_dict() if self.coalitions is not None else None,
            "attribution": engine.attribution.state_dict(),
            "hvp_method": engine.hvp_method,
            "update_rule": engine.update_rule,
            "methods_used": sorted(engine.methods_used),
            "downstream_resolution": engine.resolution,
            "downstream": self.downstream.state_dict() if isinstance(self.downstream, RefitDownstream) else None,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from the :meth:`state_dict` of a probe made with the same objectives and
        optimizer kind (load the model's and the optimizer's state too).

        Raises:
            InvalidParameterError: a state of another format, other objectives, parameters this
                model lacks, or another optimizer kind (Adam's moments with SGD or back).
            ProbeStateError: a step's measurement is in flight.
        """
        if self._observed is not None or self._attached_measurement is not None:
            raise ProbeStateError("load_state_dict() between observe() and optimizer.step(): load it before the step")
        refit = isinstance(self.downstream, RefitDownstream)
        # Everything checked before anything changes (objreg.analysis.probe.state).
        check_state(state, fmt=STATE_FORMAT, objectives=list(self.engine.objectives), model=self.model,
                    shared_given=self._shared_given, optimizer=self._optimizer_settings(),
                    adam=self.coalitions is not None, refit_head=self.downstream.head if refit else None)
        if refit:
            self.downstream.check_state(state["downstream"], self.model)
        if self.coalitions is not None:
            try:
                self.coalitions.load_state_dict(state["coalitions"])
            except (KeyError, ValueError) as e:
                raise InvalidParameterError(f"the state's Adam coalition moments do not fit this probe: {e}") from None
        engine = self.engine
        engine.shared = self.downstream.shared = tuple(state["shared"])
        self._narrow = False
        self._remember_shared()
        self.records = list(state["records"])
        self._next_step, self._steps_seen = int(state["next_step"]), int(state["steps_seen"])
        self._tracked_at = None if state["tracked_at"] is None else int(state["tracked_at"])
        engine.attribution.load_state_dict(state["attribution"])
        engine.hvp_method, engine.update_rule = state["hvp_method"], state["update_rule"]
        engine.methods_used = set(state["methods_used"])
        engine.resolution = state.get("downstream_resolution")  # measured at the first probe
        if state["downstream"] is not None:
            self.downstream.load_state_dict(state["downstream"])
        self._needs_state = False

    def report(self, downstream: str = "downstream", config: Mapping[str, Any] | None = None) -> AlignmentReport:
        """:attr:`records` as an ``objreg.AlignmentReport`` (its summary as ``objreg analyze`` makes
        it; ``summary.weights_by_step`` lists the measured steps' weights)."""
        if not self.records:
            raise ProbeStateError("report() summarises the finished records and there are none yet: measure() and "
                                  "finish() a step first (or attach() the probe and train)")
        names = list(self.engine.objectives)
        summary = summarise(names, self.records, weights_by_step=[r["weights"] for r in self.records],
                            update_rule=self.engine.update_rule)
        config = {**(config or {}), "per_sample_method": ",".join(sorted(self.engine.methods_used)),
                  "hvp_method": self.engine.hvp_method}
        return AlignmentReport(pretrain=names, downstream=downstream, config=config, steps=list(self.records),
                               summary=summary)

    # -- internals -------------------------------------------------------------------------------

    def _optimizer_settings(self) -> dict[str, Any]:
        return optimizer_settings(self.optimizer, shared_group(self.optimizer, self.shared_parameters))

    def _remember_shared(self) -> None:
        self._shared_ids = {n: id(p) for n, p in self.shared_parameters.items()}

    def _check_shared_unchanged(self) -> None:
        """The shared parameters must still be the ones the probe measures: present, trainable and
        the same tensors (the optimizer holds those)."""
        now = dict(self.model.named_parameters())
        for name, ident in self._shared_ids.items():
            p = now.get(name)
            change = ("was removed from the model" if p is None else
                      "was replaced by another tensor (the optimizer still holds the old one)" if id(p) != ident else
                      "was frozen (requires_grad=False)" if not p.requires_grad else None)
            if change is not None:
                raise ProbeStateError(f"shared parameter {name!r} {change} after the probe was made: the probe "
                                      f"measures a fixed set of parameters; make a new TransferProbe for the new set")
        unfrozen = sorted(n for n in self._frozen if n in now and now[n].requires_grad)
        if unfrozen:
            raise ProbeStateError(
                f"parameter {unfrozen[0]!r} was unfrozen after the probe was made, and the default shared set was "
                f"chosen among the parameters trainable then; make a new TransferProbe, or pass shared= the "
                f"parameters to measure")

    def _check_downstream(self, value: float, when: str) -> None:
        if not math.isfinite(value):
            raise InvalidParameterError(
                f"{loss_label('downstream', self.downstream.task)} is not finite {when} (D = {value}): a "
                f"diverged model, or a loss that returns NaN or inf")

    def _check_diverged(self, value: float, step: int) -> None:
        """``D`` after a step: non-finite where the step diverged (or the loss returns NaN there)."""
        if not math.isfinite(value):
            shared = self.shared_parameters
            gradient = next((n for n, p in shared.items()
                             if p.grad is not None and not bool(torch.isfinite(p.grad).all())), None)
            weight = next((n for n, p in shared.items() if not bool(torch.isfinite(p).all())), None)
            if gradient is not None:  # the step wrote the gradient's NaN into the weights: no step size would help
                cause = (f"the step's gradient of {gradient!r} was not finite (a NaN or inf in the backward: a log of "
                         f"0, a division by zero, an overflow), so the step made the weights NaN or infinite; find "
                         f"where the backward breaks (torch.autograd.detect_anomaly), the learning rate is not the "
                         f"cause")
            elif weight is not None:
                cause = (f"the step made {weight!r} infinite or NaN from a finite gradient: the step diverged; try a "
                         f"smaller learning rate (--lr) or float64 (--dtype float64)")
            else:
                cause = ("the weights are finite, so the loss returns NaN or inf there (a log of 0?), or the step "
                         "diverged; try a smaller learning rate (--lr) or float64 (--dtype float64)")
            raise NonFiniteLossError(
                f"{loss_label('downstream', self.downstream.task)} is not finite after step {step} (D = {value}): "
                f"{cause}")

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
        process's rows), and the weights as the optimizer's ``.grad`` holds them: ``c α_k`` where
        the loop rescaled the gradient by ``c`` (gradient clipping)."""
        if self._narrow:
            self._narrow_to_reached(batches)
        group = self.downstream.group
        gradients, losses = {}, {}
        with _replayed(self._forward, self.model):
            for name, objective in self.engine.objectives.items():
                function = ObjectiveFunction(self.model, objective, batches[name], shared=self.engine.shared)
                leaves = requiring_grad({n: p.detach() for n, p in self.shared_parameters.items()})
                with torch.enable_grad():
                    values = function(leaves)
                    label = loss_label(name, objective)
                    check_finite_losses(label, values, f"at step {self._next_step}")
                    if not values.requires_grad:
                        raise InvalidParameterError(f"{label} does not depend on the shared parameters (computed "
                                                    f"under torch.no_grad(), or detached?): it has no gradient to "
                                                    f"measure")
                    total = values.sum()
                    grads = torch.autograd.grad(total, list(leaves.values()), allow_unused=True)
                grads = [torch.zeros_like(t) if g is None else g for t, g in zip(leaves.values(), grads)]
                count = torch.tensor(float(function.batch_size), dtype=total.dtype, device=total.device)
                total, grads, count = group.all_reduce_sum((total.detach(), grads, count))
                gradients[name] = {n: g / count for n, g in zip(leaves, grads)}
                losses[name] = float(total / count)
        return gradients, losses, self._as_stepped(weights, gradients)

    def _as_stepped(self, weights: Mapping[str, float], gradients: Mapping[str, Params]) -> dict[str, float]:
        shared = self.shared_parameters
        if not stepped(shared):
            raise ProbeStateError("measure() reads the step's gradient: call it after the backward and before "
                                  "optimizer.step() (no shared parameter has a .grad)")
        mix = {n: sum(weights[k] * gradients[k][n] for k in gradients) for n in shared}
        names = stepped(shared)
        norm = float(sum((mix[n] * mix[n]).sum() for n in names))
        scale = float(sum((shared[n].grad * mix[n]).sum() for n in names)) / norm if norm > 0 else 1.0
        if not math.isfinite(scale):
            scale = 1.0
        return {k: scale * w for k, w in weights.items()}

    def _narrow_to_reached(self, batches: Mapping[str, Any]) -> None:
        """Keep the default shared parameters some objective reaches (once, on the first batches)."""
        self._narrow = False
        reached: set[str] = set()
        leaves = requiring_grad({n: p.detach() for n, p in self.shared_parameters.items()})
        for name, objective in self.engine.objectives.items():
            function = ObjectiveFunction(self.model, objective, batches[name], shared=self.engine.shared)
            with torch.enable_grad():
                values = function(leaves)
                if not values.requires_grad:
                    continue  # reaches none of them (and is refused as it is measured)
                grads = torch.autograd.grad(values.sum(), list(leaves.values()), allow_unused=True)
            reached |= {n for n, g in zip(leaves, grads) if g is not None}
        names = tuple(n for n in self.engine.shared if n in reached)
        if not names:
            raise InvalidParameterError("no trainable parameter is reached by both the downstream loss and an objective")
        self.engine.shared = self.downstream.shared = names
        self._remember_shared()


#: The code of torch's wrapper around every optimizer class's ``step`` (it runs the step hooks).
_STEP_WRAPPER = torch.optim.Optimizer.profile_hook_step(lambda *args, **kwargs: None).__code__


def _step_counter(probe: weakref.ref) -> Callable[..., None]:
    """An optimizer step post-hook counting the steps for the probe (while it lives). A subclass's
    ``step`` that calls ``super().step()`` runs the hooks twice, once per wrapped ``step``: only the
    outermost call is a step, the one no other wrapper of this optimizer encloses."""

    def count(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        frame, calls = sys._getframe(1), 0
        while frame is not None:
            if frame.f_code is _STEP_WRAPPER and frame.f_locals.get("self") is optimizer:
                calls += 1
            frame = frame.f_back
        alive = probe()
        if alive is not None and calls <= 1:
            alive._steps_taken += 1
            alive._forward = None

    return count


@dataclass
class _Forward:
    """What the loop's first training-mode forward since the last optimizer step ran with."""

    cpu: torch.Tensor
    cuda: list[torch.Tensor]
    modes: list[tuple[nn.Module, bool]]


def _forward_seer(probe: weakref.ref) -> Callable[..., None]:
    """A forward pre-hook keeping, for the probe (while it lives), the random state and the
    modules' modes of the loop's first training-mode forward after each optimizer step."""

    def see(module: nn.Module, args: Any) -> None:
        alive = probe()
        if alive is not None and alive._forward is None and module.training:
            cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else []
            alive._forward = _Forward(torch.get_rng_state(), cuda, [(m, m.training) for m in module.modules()])

    return see


@contextmanager
def _replayed(forward: _Forward | None, model: nn.Module) -> Iterator[None]:
    """The objectives' forwards as the loop ran them: its modules' modes, its random state at its
    first forward (the objectives drawing in turn, in their order, as the loop's did), the fused
    attention kernels allowed again, the model's buffers (batch norm's running statistics) kept.
    Nothing where the loop ran no training-mode forward (the probe's ``eval()`` mode stands)."""
    if forward is None:
        yield
        return
    current = [(m, m.training) for m in model.modules()]
    buffers = [b.clone() for b in model.buffers()]
    for module, training in forward.modes:
        module.training = training
    torch.set_rng_state(forward.cpu)
    if forward.cuda:
        torch.cuda.set_rng_state_all(forward.cuda)
    try:
        with sdpa_kernel([b for b in SDPBackend.__members__.values() if b != SDPBackend.ERROR]):
            yield
    finally:
        for module, training in current:
            module.training = training
        with torch.no_grad():
            for kept, buffer in zip(buffers, model.buffers()):
                buffer.copy_(kept)


def _warn_of_moments(coalitions: CoalitionMoments, shared: Mapping[str, nn.Parameter]) -> None:
    """Warn where the coalition moments would outgrow the optimizer's own state (:mod:`~objreg.analysis.math.costs`)."""
    like = next(iter(shared.values()))
    message = moments_warning(sum(p.numel() for p in shared.values()), len(coalitions.players), like.dtype,
                              coalitions.dtype, coalitions.device is not None and coalitions.device != like.device)
    if message is not None:
        warnings.warn(message, UserWarning, stacklevel=3)


def _flagged(update: Any) -> Any:
    """``update`` with ``decomposition_flagged`` after ``decomposition_residual`` (the schema's order)."""
    out = {}
    for key, value in update.items():
        out[key] = value
        if key == "decomposition_residual":
            out["decomposition_flagged"] = True
    return out


def _in_your_weights(record: StepRecord, weights: Mapping[str, float], stepped: Mapping[str, float]) -> None:
    """The counterfactual's weight vectors in the loop's own weights: the split used ``c·α``
    where the loop rescaled its gradient (clipping), and so did the stencil."""
    if "counterfactual" not in record:
        return
    scale = next((weights[k] / stepped[k] for k in weights if stepped[k]), 1.0)
    if scale != 1.0:
        for point in [*record["counterfactual"]["points"], *record["counterfactual"]["grid"]]:
            point["weights"] = {k: scale * w for k, w in point["weights"].items()}
