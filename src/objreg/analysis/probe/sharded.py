"""The probe on a model sharded with FSDP2 (``torch.distributed.fsdp.fully_shard``), each process
passing its own rows as a ``DistributedSampler`` deals them: :class:`ShardedProbe` gives the records
of :class:`~objreg.analysis.probe.transfer_probe.TransferProbe` in one process on the concatenated
batch, because it *is* a ``TransferProbe``, run on a gathered, plain view of the model.

FSDP2's parameters are ``DTensor`` shards, gathered into full tensors only inside the model's own
forward, and ``torch.func`` cannot differentiate through that: ``functional_call`` on the sharded
model fails in FSDP's pre-forward hook (``'Tensor' object has no attribute '_local_tensor'``), and
``torch.func.grad`` over it in FSDP's parameter code. So the probe measures on

- a *twin* of the model, made once: every module again of its own class (FSDP2's ``FSDP<Class>``
  dropped), without FSDP's hooks and state, with the model's buffers and plain parameters that
  hold the full tensors (``DTensor.full_tensor()``: one all-gather per parameter);
- a *shadow* of the loop's optimizer over the twin's parameters: its class and settings, and its
  state (Adam's moments and step count) gathered in full.

At each :meth:`ShardedProbe.measure` (and :meth:`~ShardedProbe.track`) the twin's parameters and
``.grad`` and the shadow's state and settings are gathered from the model and the loop's optimizer,
and a ``TransferProbe`` on the twin measures, each process on its own rows with the collectives on
the user's process group, as under DDP; after ``optimizer.step()``, :meth:`~ShardedProbe.finish`
gathers the new parameters for ``Δθ`` and ``D`` after. Every number (per-example dots, intervals,
the Adam/AdamW split, exact HVPs by double backward or forward-over-reverse, the re-fitted head,
the counterfactual) comes from ``TransferProbe``'s code. The gathered ``.grad`` and optimizer state
are dropped after each call; the twin's full parameters stay (docs/distributed.md: the memory).
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from objreg.analysis.math.functional import Params
from objreg.analysis.math.state_checks import fingerprint
from objreg.analysis.probe.arguments import head_names, inner_optimizer, user_group
from objreg.analysis.probe.optimizer_hooks import step_counter
from objreg.analysis.probe.replay import forward_seer
from objreg.analysis.probe.report import AlignmentReport
from objreg.analysis.probe.settings import ProbeSettings
from objreg.analysis.probe.transfer_probe import LossFn, Measurement, TransferProbe
from objreg.analysis.records import StepRecord
from objreg.core.errors import InvalidParameterError
from objreg.core.handles import Objective, Task

#: The module hook dictionaries a twin keeps, but for FSDP's own hooks.
HOOK_DICTS = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks", "_state_dict_hooks",
              "_state_dict_pre_hooks", "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks")
#: Flags keyed by a hook's id, each beside the hook dictionary it qualifies.
HOOK_FLAGS = {"_forward_pre_hooks_with_kwargs": "_forward_pre_hooks", "_forward_hooks_with_kwargs": "_forward_hooks",
              "_forward_hooks_always_called": "_forward_hooks"}
#: What FSDP2 puts in a module's ``__dict__`` (its state lives under keys ``__composable_api…``).
FSDP_ATTRIBUTES = ("_is_fsdp_managed_module", "_fsdp_use_orig_params")


def _full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a ``DTensor`` (an all-gather every process calls); a plain tensor as it is."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def _from_torch_distributed(hook: Any) -> bool:
    function = getattr(hook, "func", hook)  # functools.partial
    function = getattr(function, "__func__", function)  # a bound method
    return str(getattr(function, "__module__", "")).startswith("torch.distributed")


def _original_class(module: nn.Module) -> type:
    """The class of ``module`` before ``fully_shard`` (which puts ``FSDP<Class>`` in front of it)."""
    cls = type(module)
    index = getattr(cls, "_orig_cls_mro_index", None)
    return cls.__mro__[index] if index is not None else cls


def _twin(module: nn.Module, made: dict[int, nn.Parameter]) -> nn.Module:
    """``module`` again, unsharded and without FSDP: its original class, its attributes shared,
    FSDP's hooks and state left out, the same buffers, full plain parameters (``made``: those made
    so far, so a tied parameter stays one)."""
    twin = object.__new__(_original_class(module))
    state = {k: v for k, v in module.__dict__.items()
             if not k.startswith("__composable_api") and k not in FSDP_ATTRIBUTES}
    for name in HOOK_DICTS:
        if name in state:
            state[name] = type(state[name])((k, h) for k, h in state[name].items() if not _from_torch_distributed(h))
    for name, hooks in HOOK_FLAGS.items():
        if name in state:
            state[name] = type(state[name])((k, v) for k, v in state[name].items() if k in state[hooks])
    parameters = {}
    for name, p in module._parameters.items():
        if p is not None and id(p) not in made:
            with torch.no_grad():
                made[id(p)] = nn.Parameter(_full(p.detach()).clone(), requires_grad=p.requires_grad)
        parameters[name] = None if p is None else made[id(p)]
    state["_parameters"] = parameters
    state["_buffers"] = dict(module._buffers)
    state["_modules"] = {name: None if child is None else _twin(child, made) for name, child in module._modules.items()}
    twin.__dict__.update(state)
    return twin


def _reshard(model: nn.Module) -> None:
    """Every FSDP module back to its shards (FSDP2 leaves its root unsharded after a forward), so
    that ``model.parameters()`` are the ``DTensor`` shards the optimizer holds."""
    for module in model.modules():
        if hasattr(module, "reshard") and hasattr(module, "unshard"):
            module.reshard()


class ShardedProbe:
    """Probes the steps of a model sharded with ``fully_shard`` (FSDP2), each process passing its
    own rows: the records of :class:`~objreg.analysis.probe.transfer_probe.TransferProbe` on the
    whole batch in one process (:class:`~objreg.analysis.records.StepRecord`, ``objreg analyze``'s
    schema), measured on a gathered copy of the model (module docstring).

    Call it as ``TransferProbe``: :meth:`measure` after the loop's backward, ``optimizer.step()``,
    :meth:`finish`; under Adam, :meth:`track` every step not measured. Every process calls every
    method (they gather), each with its own rows; ``eval_batches`` (and ``fit_batches``) are the
    whole set on every process (checked). The losses must read the model they are given.

    Args:
        model: The model, ``fully_shard`` applied (some trainable parameter a ``DTensor``).
        objectives, downstream, eval_batches, weights: As ``TransferProbe``'s.
        optimizer: The loop's ``torch.optim.SGD`` (plain), ``Adam`` or ``AdamW`` over ``model``'s
            (sharded) parameters.
        **options: ``TransferProbe``'s other keywords (``per_sample_method``, ``hvp_method``,
            ``eval_dtype``, ``refit_head`` as the sharded model's module or parameter names,
            ``fit_batches``, ``counterfactual_radius``, ``seed``, …).

    Raises:
        InvalidParameterError: a model without ``DTensor`` parameters (use ``TransferProbe``),
            evaluation sets that differ between processes, or any argument ``TransferProbe``
            refuses (the message names what is wrong and what is allowed).
    """

    mode = "sharded"  # objreg.make_probe's name for it

    def __init__(self, model: nn.Module, objectives: Mapping[str, LossFn | Objective], downstream: LossFn | Task,
                 optimizer: torch.optim.Optimizer, *, eval_batches: Any = None,
                 weights: Mapping[str, float] | None = None, **options: Any):
        if not isinstance(model, nn.Module) or not any(
                hasattr(p, "full_tensor") for p in model.parameters() if p.requires_grad):
            raise InvalidParameterError("ShardedProbe takes a model sharded with torch.distributed.fsdp.fully_shard "
                                        "(its trainable parameters DTensors); for an unsharded or DDP model use "
                                        "TransferProbe")
        optimizer = inner_optimizer(optimizer)
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise InvalidParameterError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        _reshard(model)
        self.model, self.optimizer = model, optimizer
        self._names = [n for n, _ in model.named_parameters()]
        made: dict[int, nn.Parameter] = {}
        self.twin = _twin(model, made)
        twins = {id(p): made[id(p)] for p in model.parameters()}
        missing = [p for group in optimizer.param_groups for p in group["params"] if id(p) not in twins]
        if missing:
            raise InvalidParameterError(f"the optimizer holds {len(missing)} parameters the model does not have: give "
                                        f"ShardedProbe the model whose parameters the optimizer steps")
        self.shadow = object.__new__(type(optimizer))
        torch.optim.Optimizer.__init__(self.shadow, [
            {**group, "params": [twins[id(p)] for p in group["params"]]} for group in optimizer.param_groups
        ], dict(optimizer.defaults))
        self._check_same_sets(eval_batches, options.get("fit_batches"))
        head = options.get("refit_head")
        if isinstance(head, nn.Module):  # the sharded model's module: the twin's by its parameters' names
            options["refit_head"] = head_names(model, head)
        self._gather(grads=False, state=True)
        try:
            self.probe = TransferProbe(self.twin, objectives, downstream, self.shadow, eval_batches=eval_batches,
                                       weights=weights, **options)
        finally:
            self._drop()
        # The loop steps the sharded optimizer and runs the sharded model: the probe counts those
        # steps and keeps that forward's random state and modes (for the twin's modules).
        counter = optimizer.register_step_post_hook(step_counter(weakref.ref(self.probe)))
        seen = model.register_forward_pre_hook(forward_seer(weakref.ref(self.probe), self.twin))
        weakref.finalize(self, counter.remove)
        weakref.finalize(self, seen.remove)

    @property
    def records(self) -> list[StepRecord]:
        """The finished records, in order."""
        return self.probe.records

    @property
    def settings(self) -> ProbeSettings:
        """How the probe computes (the gathered model's ``TransferProbe``'s settings)."""
        return self.probe.settings

    def measure(self, batches: Mapping[str, Any], *, weights: Mapping[str, float] | None = None,
                step: int | None = None, gradients: Mapping[str, Params] | None = None,
                losses: Mapping[str, float] | None = None) -> Measurement:
        """Before ``optimizer.step()``, after the loop's backward: ``TransferProbe.measure`` on
        this process's rows (``gradients``: full tensors or ``DTensor`` shards per shared parameter)."""
        if gradients is not None and isinstance(gradients, Mapping):
            gradients = {k: {n: _full(t) for n, t in g.items()} if isinstance(g, Mapping) else g
                         for k, g in gradients.items()}
        self._gather(grads=True, state=True)
        try:
            return self.probe.measure(batches, step=step, weights=weights, gradients=gradients, losses=losses)
        finally:
            self._drop()

    def track(self, batches: Mapping[str, Any] | None = None, *, weights: Mapping[str, float] | None = None) -> None:
        """Under Adam, on every step not measured, before ``optimizer.step()``: ``TransferProbe.track``."""
        if self.probe.coalitions is None:
            return
        self._gather(grads=True, state=True)
        try:
            self.probe.track(batches, weights=weights)
        finally:
            self._drop()

    def finish(self, measurement: Measurement) -> StepRecord:
        """After ``optimizer.step()``: the new parameters gathered, the step's record."""
        self._gather(grads=False, state=False)
        return self.probe.finish(measurement)

    def report(self, downstream: str = "downstream", config: Mapping[str, Any] | None = None, **options: Any
               ) -> AlignmentReport:
        """:attr:`records` as an ``objreg.AlignmentReport`` (``TransferProbe.report``, its options too)."""
        return self.probe.report(downstream, config, **options)

    def state_dict(self) -> dict[str, Any]:
        """The probe's state for a checkpoint (``TransferProbe.state_dict``)."""
        return self.probe.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._gather(grads=False, state=True)
        try:
            self.probe.load_state_dict(state)
        finally:
            self._drop()

    # -- the gathered view ---------------------------------------------------------------------------

    @torch.no_grad()
    def _gather(self, *, grads: bool, state: bool) -> None:
        """The twin's parameters (and ``.grad``) and the shadow's settings (and state) from the
        model and the loop's optimizer, gathered in full; every process calls it in step."""
        _reshard(self.model)
        sources = dict(self.model.named_parameters())
        twins = dict(self.twin.named_parameters())
        for name in self._names:
            source, twin = sources[name], twins[name]
            twin.copy_(_full(source.detach()))
            if grads:
                twin.grad = None if source.grad is None else _full(source.grad.detach()).to(twin.dtype)
        for module, twin_module in zip(self.model.modules(), self.twin.modules()):
            twin_module._buffers.update(module._buffers)
        for group, shadow in zip(self.optimizer.param_groups, self.shadow.param_groups):
            shadow.update({k: v for k, v in group.items() if k != "params"})
        if state:
            self.shadow.state.clear()
            for group, shadow in zip(self.optimizer.param_groups, self.shadow.param_groups):
                for source, twin in zip(group["params"], shadow["params"]):
                    if self.optimizer.state.get(source):
                        self.shadow.state[twin] = {k: _full(v).clone() if isinstance(v, torch.Tensor) else v
                                                   for k, v in self.optimizer.state[source].items()}

    def _drop(self) -> None:
        """The gathered ``.grad`` and optimizer state freed (the parameters stay)."""
        for p in self.twin.parameters():
            p.grad = None
        self.shadow.state.clear()

    def _check_same_sets(self, *sets: Any) -> None:
        """Every process must pass the same evaluation (and fit) set: D is defined by the whole of it."""
        group = user_group(self.model)
        if not group.distributed:
            return
        digests = group.gather_objects(fingerprint([s for s in sets if s is not None]))
        if len(set(digests)) > 1:
            raise InvalidParameterError(
                "ShardedProbe needs every process to pass the same whole eval_batches (and fit_batches): they define "
                "D, and each process evaluates its share of them; these processes passed different ones (rank-local "
                "rows?). The objectives' batches are each process's own rows")
