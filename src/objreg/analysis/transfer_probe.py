"""``TransferProbe``: what ``objreg analyze`` measures at a step, for any model and training loop.

Between the loop's backward and its ``optimizer.step()``, :meth:`TransferProbe.measure` takes
each objective's gradient (its own, or the loop's), the per-example dots with the downstream
gradient, ``S`` through Hessian-vector products of ``D``, and the split of the step the optimizer
is about to take; after the step, :meth:`TransferProbe.finish` reads ``Δθ`` off the parameters,
evaluates ``D`` again and returns the record, in the schema of ``objreg analyze``'s ``steps[]``
(docs/analysis.md). ``objreg analyze`` itself probes through this class
(:class:`~objreg.analysis.loop.Trainer`); the measurements are :class:`~objreg.analysis.probe.Probe`'s.

The probe leaves the training trajectory alone: it runs in ``eval()`` mode (each module's mode is
restored), restores the global random generators, never touches ``.grad`` or the optimizer's
state, and differentiates copies of the parameters (``torch.func.functional_call``).

Under Adam the split of a step needs the moments each coalition of objectives would have built
from the first step (:mod:`objreg.analysis.shapley`): create the probe before the optimizer's
first step, and call :meth:`TransferProbe.track` on every step you do not measure.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from objreg.analysis.downstream import Downstream
from objreg.analysis.functional import CallableLoss, ObjectiveFunction, Params, named_shared, requiring_grad
from objreg.analysis.group import Group, ProcessGroup
from objreg.analysis.optimizers import adam_settings, advance, players, stepped
from objreg.analysis.probe import Pending, Probe
from objreg.analysis.shapley import CoalitionMoments
from objreg.core.errors import InvalidParameterError, ProbeStateError
from objreg.core.handles import Objective, Task

#: A per-sample loss: ``fn(model, batch) -> [B]`` (the model's parameters are swapped for the probe's).
LossFn = Callable[[nn.Module, Any], torch.Tensor]
PER_SAMPLE_METHODS = ("auto", "ghost", "jvp", "double_backward", "loop")
HVP_METHODS = ("auto", "forward_over_reverse", "double_backward")


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
            the per-example loop), or one of them.
        hvp_method: ``auto``, ``forward_over_reverse`` or ``double_backward``.
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
        losses = _objectives(objectives, batch_coupled)
        self.weights = _weights(weights, list(losses))
        _choice("per_sample_method", per_sample_method, PER_SAMPLE_METHODS)
        _choice("hvp_method", hvp_method, HVP_METHODS)
        if eval_dtype is not None and not (isinstance(eval_dtype, torch.dtype) and eval_dtype.is_floating_point):
            raise InvalidParameterError(f"eval_dtype must be a floating torch.dtype or None, got {eval_dtype!r}")
        self.model, self.optimizer = model, optimizer
        group = _group(model) if not isinstance(downstream, Downstream) else downstream.group
        self.downstream = _downstream(model, downstream, eval_batches, group, eval_dtype)
        names = _shared_names(model, shared, self.downstream)
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
        _same_keys("batches", batches, self.engine.objectives)
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

    def report(self, downstream: str = "downstream", config: Mapping[str, Any] | None = None) -> Any:
        """:attr:`records` as an ``objreg.AlignmentReport`` (its summary as ``objreg analyze`` makes it)."""
        from objreg.analysis.report import AlignmentReport, summarise

        names = list(self.engine.objectives)
        summary = summarise(names, self.records, weights_by_step=[r["weights"] for r in self.records],
                            update_rule=self.engine.update_rule)
        config = {**(config or {}), "per_sample_method": ",".join(sorted(self.engine.methods_used)),
                  "hvp_method": self.engine.hvp_method}
        return AlignmentReport(pretrain=names, downstream=downstream, config=config, steps=list(self.records),
                               summary=summary)

    # -- internals -------------------------------------------------------------------------------

    def _weights_of(self, weights: Mapping[str, float] | None) -> dict[str, float]:
        return self.weights if weights is None else _weights(weights, list(self.engine.objectives))

    def _quiet(self) -> _Quiet:
        return _Quiet(self.model)

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
            _same_keys("batches", batches, self.engine.objectives)
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


class _Quiet:
    """The model in ``eval()`` mode and the global random generators saved, restored on exit."""

    def __init__(self, model: nn.Module):
        self.model = model

    def __enter__(self) -> None:
        self.modes = [(m, m.training) for m in self.model.modules()]
        self.model.eval()
        self.devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
        self.rng = torch.random.fork_rng(devices=self.devices)
        self.rng.__enter__()

    def __exit__(self, *exc: object) -> None:
        self.rng.__exit__(*exc)
        for module, training in self.modes:
            module.training = training


def _choice(what: str, value: str, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise InvalidParameterError(f"{what} must be one of {', '.join(allowed)}, got {value!r}")


def _same_keys(what: str, given: Mapping[str, Any], objectives: Mapping[str, Any]) -> None:
    if not isinstance(given, Mapping) or set(given) != set(objectives):
        keys = sorted(given) if isinstance(given, Mapping) else type(given).__name__
        raise InvalidParameterError(f"{what} must map every objective ({', '.join(objectives)}) to its batch, "
                                    f"got {keys}")


def _objectives(objectives: Mapping[str, Any], batch_coupled: Sequence[str]) -> dict[str, Objective | CallableLoss]:
    if not isinstance(objectives, Mapping) or not objectives:
        raise InvalidParameterError("objectives must be a non-empty mapping of name to per-sample loss fn(model, batch)")
    unknown = set(batch_coupled) - set(objectives)
    if unknown:
        raise InvalidParameterError(f"batch_coupled names {sorted(unknown)}, which are not objectives")
    out: dict[str, Objective | CallableLoss] = {}
    for name, value in objectives.items():
        if isinstance(value, Objective):
            out[name] = value
        elif callable(value):
            out[name] = CallableLoss(str(name), value, batch_coupled=name in batch_coupled)
        else:
            raise InvalidParameterError(f"objective {name!r} must be a per-sample loss fn(model, batch) -> [B] or an "
                                        f"objreg Objective, got {type(value).__name__}")
    return out


def _weights(weights: Mapping[str, float] | None, names: list[str]) -> dict[str, float]:
    if weights is None:
        return {n: 1.0 for n in names}
    if not isinstance(weights, Mapping) or set(weights) != set(names):
        raise InvalidParameterError(f"weights must give one weight per objective ({', '.join(names)}), got "
                                    f"{sorted(weights) if isinstance(weights, Mapping) else weights!r}")
    out = {n: float(weights[n]) for n in names}
    bad = [n for n, w in out.items() if not math.isfinite(w)]
    if bad:
        raise InvalidParameterError(f"weights must be finite numbers; {', '.join(bad)} is not")
    return out


def _group(model: nn.Module) -> Group:
    """The user's default process group where one is running (the probe's collectives ride it)."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        like = next(model.parameters(), None)
        return ProcessGroup(dist.get_rank(), dist.get_world_size(), dist.get_backend(),
                            like.device if like is not None else None)
    return Group()


def _downstream(model: nn.Module, downstream: Any, eval_batches: Any, group: Group,
                eval_dtype: torch.dtype | None) -> Downstream:
    if isinstance(downstream, Downstream):
        return downstream
    if eval_batches is None:
        raise InvalidParameterError("eval_batches is required: the fixed evaluation set that defines D")
    if isinstance(downstream, Task):
        built = Downstream(downstream, eval_batches, group=group, evaluation_dtype=eval_dtype)
        built.check(model)
        return built
    if not callable(downstream):
        raise InvalidParameterError(f"downstream must be a per-sample loss fn(model, batch) -> [B] or an objreg Task, "
                                    f"got {type(downstream).__name__}")
    batches = list(eval_batches) if isinstance(eval_batches, (list, tuple)) else [eval_batches]
    if not batches:
        raise InvalidParameterError("eval_batches is empty: D needs at least one example")
    return Downstream.of_batches(CallableLoss("downstream", downstream), batches, group=group,
                                 evaluation_dtype=eval_dtype)


def _shared_names(model: nn.Module, shared: Any, downstream: Downstream) -> tuple[str, ...]:
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    if shared is None:
        names = _reached_by(model, downstream, trainable)
    elif callable(shared):
        names = tuple(n for n, p in trainable.items() if shared(n, p))
    elif isinstance(shared, (str, bytes)) or not isinstance(shared, Sequence | set | frozenset):
        raise InvalidParameterError(f"shared must be a list of parameter names or a filter fn(name, param), got "
                                    f"{type(shared).__name__}")
    else:
        unknown = [n for n in shared if n not in trainable]
        if unknown:
            raise InvalidParameterError(f"shared names {len(unknown)} parameters the model has no trainable "
                                        f"parameter called: {', '.join(map(repr, unknown[:5]))}")
        names = tuple(n for n in trainable if n in set(shared))
    if not names:
        raise InvalidParameterError("no shared parameters: the filter selects none, or D reaches no trainable parameter")
    return names


def _reached_by(model: nn.Module, downstream: Downstream, trainable: dict[str, nn.Parameter]) -> tuple[str, ...]:
    """The trainable parameters ``D``'s first chunk reaches."""
    function = ObjectiveFunction(model, downstream.task, downstream.chunks[0], shared=list(trainable))
    leaves = requiring_grad({n: p.detach() for n, p in trainable.items()})
    with _Quiet(model), torch.enable_grad():
        grads = torch.autograd.grad(function(leaves).sum(), list(leaves.values()), allow_unused=True)
    return tuple(n for n, g in zip(leaves, grads) if g is not None)

