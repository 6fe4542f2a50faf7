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
state, and differentiates copies of the parameters (``torch.func.functional_call``).

Under Adam the split of a step needs the moments each coalition of objectives would have built
from the first step (:mod:`objreg.analysis.math.shapley`): create the probe before the optimizer's
first step, and call :meth:`TransferProbe.track` on every step you do not measure.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from objreg.analysis.math.curvature import HVP_METHODS
from objreg.analysis.math.downstream import Downstream
from objreg.analysis.math.functional import ObjectiveFunction, Params, named_shared, requiring_grad
from objreg.analysis.math.optimizers import adam_settings, advance, players, stepped
from objreg.analysis.math.per_sample import METHODS as PER_SAMPLE_METHODS
from objreg.analysis.math.shapley import CoalitionMoments
from objreg.analysis.probe.arguments import (
    Quiet,
    build_downstream,
    check_batches,
    check_choice,
    checked_weights,
    loss_functions,
    shared_names,
    user_group,
)
from objreg.analysis.probe.engine import Pending, Probe
from objreg.analysis.probe.report import AlignmentReport, summarise
from objreg.core.errors import InvalidParameterError, ProbeStateError
from objreg.core.handles import Objective, Task

#: A per-sample loss: ``fn(model, batch) -> [B]`` (the model's parameters are swapped for the probe's).
LossFn = Callable[[nn.Module, Any], torch.Tensor]


@dataclass
class Measurement:
    """What :meth:`TransferProbe.measure` took before the step; hand it to :meth:`TransferProbe.finish`."""

    pending: Pending
    finished: bool = False


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

    Raises:
        InvalidParameterError: an argument the probe cannot use (the message names it).
    """

    def __init__(
        self, model: nn.Module, objectives: Mapping[str, LossFn | Objective], downstream: LossFn | Task | Downstream,
        optimizer: torch.optim.Optimizer, *, eval_batches: Any = None, weights: Mapping[str, float] | None = None,
        shared: Sequence[str] | Callable[[str, nn.Parameter], bool] | None = None, per_sample_method: str = "auto",
        hvp_method: str = "auto", eval_dtype: torch.dtype | None = torch.float64, seed: int = 0,
        steps: int | None = None, spectrum: int = 0, batch_coupled: Sequence[str] = (), whole_batches: bool = False,
        decode: Callable[[Sequence[int]], str] | None = None,
    ):
        if isinstance(model, nn.parallel.DistributedDataParallel):
            model = model.module
        if not isinstance(model, nn.Module):
            raise InvalidParameterError(f"model must be a torch.nn.Module, got {type(model).__name__}")
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
        self.downstream = build_downstream(model, downstream, eval_batches, group, eval_dtype)
        names = shared_names(model, shared, self.downstream)
        self.downstream.shared = names
        self.engine = Probe(model, losses, self.downstream, seed=seed, steps=steps if steps is not None else 0,
                            per_sample_method=per_sample_method, hvp_method=hvp_method, spectrum=spectrum,
                            decode=decode, shared=names, local_batches=not whole_batches)
        self._narrow = shared is None  # the default: narrowed to what some objective reaches, on first use
        settings = adam_settings(optimizer, self.shared_parameters)  # an unsupported optimizer fails here
        self.coalitions = None
        if settings is not None:
            if any(optimizer.state.get(p) for p in self.shared_parameters.values()):
                raise ProbeStateError("create the TransferProbe before the optimizer's first step: under Adam the "
                                      "split of a step needs every step's gradients from the first")
            self.coalitions = CoalitionMoments(players(list(losses), settings), seed=seed)
        self.records: list[dict[str, Any]] = []
        self._tracked_at: int | None = None
        self._next_step = 0

    @property
    def shared_parameters(self) -> dict[str, nn.Parameter]:
        """The parameters measured on, by name."""
        return named_shared(self.model, self.engine.shared)

    def track(self, batches: Mapping[str, Any] | None = None, *, weights: Mapping[str, float] | None = None,
              gradients: Mapping[str, Params] | None = None) -> None:
        """Under Adam, take this step's gradients into the coalition moments (call it between the
        backward and ``optimizer.step()`` on every step you do not :meth:`measure`); nothing under SGD."""
        if self.coalitions is None:
            return
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
        weights = self._weights_of(weights)
        check_batches("batches", batches, self.engine.objectives)
        step = self._next_step if step is None else step
        with self._quiet():
            if gradients is None:
                gradients, losses, weights_in_step = self._gradients(batches, weights)
            else:
                weights_in_step = weights
            if self.coalitions is not None and self._tracked_at != self._optimizer_steps():
                self._track(batches, weights_in_step, gradients)
            pending = self.engine.measure(step, dict(weights_in_step), self.optimizer, tokens, dict(batches),
                                          dict(losses or {}), dict(gradients), self.coalitions)
        pending.record["weights"] = dict(weights)
        self._next_step = step + 1
        return Measurement(pending)

    def finish(self, measurement: Measurement) -> dict[str, Any]:
        """After ``optimizer.step()``: the step's record (``objreg analyze``'s ``steps[]`` schema),
        also appended to :attr:`records`."""
        if not isinstance(measurement, Measurement) or measurement.finished:
            raise ProbeStateError("finish() takes the Measurement of one measure() call, once, after optimizer.step()")
        measurement.finished = True
        with self._quiet():
            record = self.engine.finish(measurement.pending)
        self.records.append(record)
        return record

    def report(self, downstream: str = "downstream", config: Mapping[str, Any] | None = None) -> AlignmentReport:
        """:attr:`records` as an ``objreg.AlignmentReport`` (its summary as ``objreg analyze`` makes
        it; ``summary.weights_by_step`` lists the measured steps' weights)."""
        names = list(self.engine.objectives)
        summary = summarise(names, self.records, weights_by_step=[r["weights"] for r in self.records],
                            update_rule=self.engine.update_rule)
        config = {**(config or {}), "per_sample_method": ",".join(sorted(self.engine.methods_used)),
                  "hvp_method": self.engine.hvp_method}
        return AlignmentReport(pretrain=names, downstream=downstream, config=config, steps=list(self.records),
                               summary=summary)

    # -- internals -------------------------------------------------------------------------------

    def _weights_of(self, weights: Mapping[str, float] | None) -> dict[str, float]:
        return self.weights if weights is None else checked_weights(weights, list(self.engine.objectives))

    def _quiet(self) -> Quiet:
        return Quiet(self.model)

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
            check_batches("batches", batches, self.engine.objectives)
            gradients, _, weights = self._gradients(batches, weights)
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
        for name, objective in self.engine.objectives.items():
            function = ObjectiveFunction(self.model, objective, batches[name], shared=self.engine.shared)
            leaves = requiring_grad({n: p.detach() for n, p in self.shared_parameters.items()})
            with torch.enable_grad():
                total = function(leaves).sum()
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
                grads = torch.autograd.grad(function(leaves).sum(), list(leaves.values()), allow_unused=True)
            reached |= {n for n, g in zip(leaves, grads) if g is not None}
        names = tuple(n for n in self.engine.shared if n in reached)
        if not names:
            raise InvalidParameterError("no trainable parameter is reached by both the downstream loss and an objective")
        self.engine.shared = self.downstream.shared = names
