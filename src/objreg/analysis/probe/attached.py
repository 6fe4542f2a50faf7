"""A :class:`~objreg.analysis.probe.transfer_probe.TransferProbe` attached to its optimizer
(:meth:`Attached.attach`): the optimizer's step hooks measure, track and finish by themselves, so
the loop only hands the probe each step's batches (:meth:`Attached.observe`) before
``optimizer.step()``, and no call can be forgotten or made out of order.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from objreg.analysis.math.functional import Params
from objreg.analysis.probe.arguments import check_batches, inner_optimizer
from objreg.analysis.probe.optimizer_hooks import optimizer_hooks
from objreg.analysis.records import StepRecord
from objreg.core.errors import InvalidParameterError, ProbeStateError

#: Called by an attached probe with each record it finishes.
RecordCallback = Callable[[StepRecord], None]


@dataclass
class Observed:
    """What :meth:`Attached.observe` was handed for the coming step of an attached probe."""

    batches: Mapping[str, Any]
    options: dict[str, Any] = field(default_factory=dict)
    finite: bool = True  # whether the gradients were finite (else the optimizer may skip the step)


class Attached:
    """:class:`~objreg.analysis.probe.transfer_probe.TransferProbe`'s methods for being attached
    to its optimizer (a mixin: the probe's ``_measure``, ``_finish`` and ``_track_checked`` do the
    work; this part decides which the step calls)."""

    def _start_detached(self) -> None:
        """The state attach() keeps: the optimizer's hooks, the steps they have seen, and the coming step's batches."""
        self._hooks: list[Any] = []
        self._every = 1
        self._on_record: RecordCallback | None = None
        self._steps_seen = 0
        self._observed: Observed | None = None
        self._warned_skip = False
        self._counting: list[Any] = []  # the step counter's hook while detached
        self._attached_measurement: Any = None  # the Measurement of the coming step, where it is due

    def attach(self, optimizer: torch.optim.Optimizer | None = None, *, every: int = 1,
               on_record: RecordCallback | None = None) -> Attached:
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
            if inner_optimizer(optimizer) is not self.optimizer:
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
        self._hooks = optimizer_hooks(self, self.optimizer, pre=Attached._before_step, post=Attached._after_step)
        return self

    def detach(self) -> None:
        """Remove the optimizer's hooks (a step's batches handed over but not stepped are dropped).
        The probe goes on counting the optimizer's steps, so records after a new :meth:`attach`
        carry the optimizer's step numbers."""
        for handle in self._hooks:
            handle.remove()
        if self._hooks:
            self._counting = optimizer_hooks(self, self.optimizer, post=Attached._count_step)
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
