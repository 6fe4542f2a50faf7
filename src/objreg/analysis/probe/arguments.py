"""The :class:`~objreg.analysis.probe.transfer_probe.TransferProbe`'s arguments, checked and turned into
the analysis' pieces: objectives as loss functions, the weights, the downstream set, the shared
parameters, the process group; and :class:`Quiet`, the model in ``eval()`` mode with the random
generators saved. Every check raises one :class:`~objreg.core.errors.InvalidParameterError` that
names the argument and what it allows.
"""

from __future__ import annotations

import contextlib
import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils._pytree import tree_flatten

from objreg.analysis.math.downstream import Downstream
from objreg.analysis.math.functional import CallableLoss, ObjectiveFunction, batch_size_of, requiring_grad
from objreg.analysis.math.refit import make_downstream
from objreg.analysis.parallel.group import Group, ProcessGroup
from objreg.core.errors import InvalidParameterError
from objreg.core.handles import Objective, Task


class Quiet:
    """The model in ``eval()`` mode, the global random generators saved (both restored on exit),
    and the loop's autocast switched off: the probe measures in the model's own dtype, so a loop
    under ``torch.autocast`` gets the numbers it would get without it."""

    def __init__(self, model: nn.Module):
        self.model = model

    def __enter__(self) -> None:
        self.modes = [(m, m.training) for m in self.model.modules()]
        self.model.eval()
        self.devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
        self.stack = contextlib.ExitStack()
        self.stack.enter_context(torch.random.fork_rng(devices=self.devices))
        for device in ("cpu", *(["cuda"] if torch.cuda.is_available() else [])):
            self.stack.enter_context(torch.autocast(device, enabled=False))

    def __exit__(self, *exc: object) -> None:
        self.stack.__exit__(*exc)
        for module, training in self.modes:
            module.training = training


def check_choice(what: str, value: str, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise InvalidParameterError(f"{what} must be one of {', '.join(allowed)}, got {value!r}")


def check_batches(what: str, given: Mapping[str, Any], objectives: Mapping[str, Any],
                  device: torch.device | None = None) -> None:
    if not isinstance(given, Mapping) or set(given) != set(objectives):
        keys = sorted(given) if isinstance(given, Mapping) else type(given).__name__
        raise InvalidParameterError(f"{what} must map every objective ({', '.join(objectives)}) to its batch, "
                                    f"got {keys}")
    for name, batch in given.items():
        check_batch(f"{what}[{name!r}]", batch, device)


def check_batch(what: str, batch: Any, device: torch.device | None) -> None:
    """A batch must hold at least one example, on the model's device."""
    rows = batch_size_of(batch)
    if rows < 1:
        raise InvalidParameterError(f"{what} has no rows: every batch needs at least one example")
    if device is None:
        return
    for leaf in tree_flatten(batch)[0]:
        if isinstance(leaf, torch.Tensor) and leaf.device != device:
            raise InvalidParameterError(f"{what} is on {leaf.device} but the model on {device}: move the batch to "
                                        f"the model's device")


def model_device(model: nn.Module) -> torch.device | None:
    like = next(model.parameters(), None)
    return like.device if like is not None else None


def loss_functions(objectives: Mapping[str, Any], batch_coupled: Sequence[str]) -> dict[str, Objective | CallableLoss]:
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


def checked_weights(weights: Mapping[str, float] | None, names: list[str]) -> dict[str, float]:
    if weights is None:
        return {n: 1.0 for n in names}
    if not isinstance(weights, Mapping) or set(weights) != set(names):
        raise InvalidParameterError(f"weights must give one weight per objective ({', '.join(names)}), got "
                                    f"{sorted(weights) if isinstance(weights, Mapping) else weights!r}")
    out = {}
    for n in names:
        try:
            if isinstance(weights[n], (bool, str, bytes)):
                raise TypeError
            out[n] = float(weights[n])  # a number, a numpy scalar or a one-element tensor
        except (TypeError, ValueError, RuntimeError):
            raise InvalidParameterError(f"weights must be numbers; {n!r} is {type(weights[n]).__name__} "
                                        f"{weights[n]!r}") from None
    bad = [n for n, w in out.items() if not math.isfinite(w)]
    if bad:
        raise InvalidParameterError(f"weights must be finite numbers; {', '.join(bad)} is not")
    return out


def unwrapped_model(model: Any) -> nn.Module:
    """The module a probe measures: ``DistributedDataParallel``'s module, ``torch.compile``'s
    original module (the probe's own transforms run the eager module), in any nesting.

    Raises:
        InvalidParameterError: ``model`` is not a ``torch.nn.Module``.
    """
    while isinstance(model, nn.parallel.DistributedDataParallel) or isinstance(
            getattr(model, "_orig_mod", None), nn.Module):
        model = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model._orig_mod
    if not isinstance(model, nn.Module):
        raise InvalidParameterError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    return model


def inner_optimizer(optimizer: Any) -> Any:
    """The optimizer inside wrappers that hold it as ``.optimizer`` (as ``accelerate`` makes), in any nesting."""
    while isinstance(getattr(optimizer, "optimizer", None), torch.optim.Optimizer):
        optimizer = optimizer.optimizer
    return optimizer


def user_group(model: nn.Module) -> Group:
    """The user's default process group where one is running (the probe's collectives ride it)."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        like = next(model.parameters(), None)
        return ProcessGroup(dist.get_rank(), dist.get_world_size(), dist.get_backend(),
                            like.device if like is not None else None)
    return Group()


def build_downstream(model: nn.Module, downstream: Any, eval_batches: Any, group: Group,
                     eval_dtype: torch.dtype | None, head: Any = None, fit_batches: Any = None) -> Downstream:
    if isinstance(downstream, Downstream):
        return downstream
    if eval_batches is None:
        raise InvalidParameterError("eval_batches is required: the fixed evaluation set that defines D")
    names = head_names(model, head)
    if names and fit_batches is None:
        raise InvalidParameterError("refit_head needs fit_batches: the examples the head is re-fitted on, apart "
                                    "from eval_batches")
    if not names and fit_batches is not None:
        raise InvalidParameterError("fit_batches is for a re-fitted head: give refit_head too")
    options = {"head": names, "group": group, "evaluation_dtype": eval_dtype}
    if isinstance(downstream, Task):
        check_batch("eval_batches", eval_batches, model_device(model))
        if names:
            check_batch("fit_batches", fit_batches, model_device(model))
        built = make_downstream(downstream, eval_batches, fit=fit_batches, **options)
        built.check(model)
        return built
    if not callable(downstream):
        raise InvalidParameterError(f"downstream must be a per-sample loss fn(model, batch) -> [B] or an objreg Task, "
                                    f"got {type(downstream).__name__}")
    loss = CallableLoss("downstream", downstream, role="downstream loss")
    batches = _batch_list("eval_batches", eval_batches, model)
    _runs_on(loss, "eval_batches", batches, model)
    fits = None
    if names:
        fits = _batch_list("fit_batches", fit_batches, model)
        _runs_on(loss, "fit_batches", fits, model)
    return make_downstream(loss, batches, fit=fits, **options)


def _runs_on(loss: CallableLoss, what: str, batches: list[Any], model: nn.Module) -> None:
    """The user's downstream loss runs on every batch of a fixed set (once, before any work): an
    exception it raises there (a label outside the head's classes, a wrong key) becomes one line
    naming the batch, instead of surfacing from deep inside a probe or a head's fit."""
    for i, batch in enumerate(batches):
        try:
            with Quiet(model), torch.no_grad():
                loss.losses(model, batch, None)
        except (IndexError, KeyError, ValueError, TypeError, RuntimeError) as error:
            if isinstance(error, InvalidParameterError) or "out of memory" in str(error):
                raise
            first = str(error).strip().splitlines()[0] if str(error).strip() else ""
            raise InvalidParameterError(f"{loss.label} fails on {what}[{i}]: {type(error).__name__}: {first} (a label "
                                        f"outside the head's classes, or a batch of another form?)") from None


def _batch_list(what: str, given: Any, model: nn.Module) -> list[Any]:
    """``given`` as a list of batches (one batch or a list), each checked."""
    batches = list(given) if isinstance(given, (list, tuple)) else [given]
    if not batches:
        raise InvalidParameterError(f"{what} is empty: D needs at least one example")
    for i, batch in enumerate(batches):
        check_batch(f"{what}[{i}]", batch, model_device(model))
        # The fixed sets are read at every probe: a NaN in them makes D (or the head's fit) no
        # number however the model trains.
        if any(isinstance(leaf, torch.Tensor) and leaf.is_floating_point() and not bool(torch.isfinite(leaf).all())
               for leaf in tree_flatten(batch)[0]):
            raise InvalidParameterError(f"{what}[{i}] holds a NaN or infinite value: D would be undefined at every "
                                        f"probe; clean the set")
    return batches


def head_names(model: nn.Module, head: Any) -> tuple[str, ...]:
    """The names of the parameters a re-fitted downstream head solves for: those of the module
    ``head`` (a submodule of ``model``) or the names given; none for a frozen head (``None``)."""
    if head is None:
        return ()
    params = dict(model.named_parameters())
    if isinstance(head, nn.Module):
        owned = {id(p) for p in head.parameters()}
        names = tuple(n for n, p in params.items() if id(p) in owned)
        if not names:
            raise InvalidParameterError("refit_head must be a module of the model (its parameters are re-fitted); "
                                        "this one has no parameter of the model")
        return names
    if isinstance(head, (str, bytes)) or not isinstance(head, Sequence) or not head:
        raise InvalidParameterError(f"refit_head must be the head module or a list of its parameter names, got "
                                    f"{type(head).__name__}")
    missing = [n for n in head if n not in params]
    if missing:
        raise InvalidParameterError(f"refit_head names {len(missing)} parameters the model does not have: "
                                    f"{', '.join(map(repr, missing[:5]))}")
    return tuple(head)


def shared_names(model: nn.Module, shared: Any, downstream: Downstream, optimizer: torch.optim.Optimizer,
                 check_reach: bool = True) -> tuple[str, ...]:
    """The names of the parameters measured on: by default every trainable parameter the
    optimizer holds that ``D`` reaches (narrowed to those some objective reaches on first use);
    else the names or the filter given, each a trainable parameter the optimizer holds, at least
    one of them reached by ``D`` (``check_reach``). A re-fitted downstream head's parameters are
    never among them (the fit solves for them)."""
    head = set(getattr(downstream, "head", ()))
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad and n not in head}
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    if shared is None:
        names = reached_by(model, downstream, {n: p for n, p in trainable.items() if id(p) in held})
        if not names:
            raise InvalidParameterError("no shared parameters: the downstream loss reaches none of the trainable "
                                        "parameters the optimizer holds (is it computed under torch.no_grad(), or "
                                        "detached?)")
        return names
    if callable(shared):
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
    not_held = [n for n in names if id(trainable[n]) not in held]
    if not_held:
        raise InvalidParameterError(
            f"shared names {len(not_held)} parameters the optimizer does not update: "
            f"{', '.join(map(repr, not_held[:5]))}; the probe splits the optimizer's step, so measure on parameters "
            f"it holds")
    if check_reach and not reached_by(model, downstream, {n: trainable[n] for n in names}):
        raise InvalidParameterError(
            f"the downstream loss reaches none of the {len(names)} shared parameters ({', '.join(map(repr, names[:5]))}"
            f"{', …' if len(names) > 5 else ''}): its gradient there is zero, so every alignment would be 0; share "
            f"parameters D depends on")
    return names


def reached_by(model: nn.Module, downstream: Downstream, trainable: dict[str, nn.Parameter]) -> tuple[str, ...]:
    """The trainable parameters ``D``'s first chunk reaches (its losses checked on this first use)."""
    if not trainable:
        return ()
    function = ObjectiveFunction(model, downstream.task, downstream.chunks[0], shared=list(trainable))
    leaves = requiring_grad({n: p.detach() for n, p in trainable.items()})
    with Quiet(model), torch.enable_grad():
        values = function(leaves)
        label = loss_label("downstream", downstream.task)
        check_finite_losses(label, values, "on the first evaluation batch")
        if not values.requires_grad:  # reaches none of them
            return ()
        grads = torch.autograd.grad(values.sum(), list(leaves.values()), allow_unused=True)
    return tuple(n for n, g in zip(leaves, grads) if g is not None)


# -- the losses and gradients a measure is given or computes ----------------------------------------


def loss_label(name: str, loss: Any) -> str:
    """How messages name a loss: the function of a plain callable, else the objective or task."""
    if isinstance(loss, CallableLoss):
        return loss.label
    if isinstance(loss, Task):
        return f"the downstream task {loss.name!r}"
    return f"objective {name!r}"


def check_finite_losses(label: str, values: torch.Tensor, when: str) -> None:
    """Every per-example loss must be finite (a NaN would pass into every number of the record).

    Raises:
        InvalidParameterError: naming the loss, how many examples and the first value.
    """
    bad = ~torch.isfinite(values.detach())
    if bool(bad.any()):
        first = float(values.detach()[bad].reshape(-1)[0])
        raise InvalidParameterError(
            f"{label} returned a non-finite loss ({first}) for {int(bad.sum())} of {values.numel()} examples {when}; "
            f"every loss must be finite (a diverged model, or a log of 0?)")


def check_given_losses(losses: Any, objectives: Mapping[str, Any]) -> dict[str, float]:
    """``losses=`` of a measure: a finite number per objective."""
    if not isinstance(losses, Mapping) or set(losses) != set(objectives):
        keys = sorted(losses) if isinstance(losses, Mapping) else type(losses).__name__
        raise InvalidParameterError(f"losses must map every objective ({', '.join(objectives)}) to its mean loss, "
                                    f"got {keys}")
    out = {}
    for name, value in losses.items():
        number = value.item() if isinstance(value, torch.Tensor) and value.numel() == 1 else value
        if isinstance(number, bool) or not isinstance(number, numbers.Real) or not math.isfinite(number):
            raise InvalidParameterError(f"losses[{name!r}] must be a finite number, got {value!r}")
        out[name] = float(number)
    return out


def check_gradients(gradients: Any, objectives: Mapping[str, Any], shared: Mapping[str, nn.Parameter]
                    ) -> dict[str, dict[str, torch.Tensor]]:
    """``gradients=`` of a measure or track: per objective, a tensor shaped like each shared
    parameter, finite; returned restricted to the shared parameters."""
    if not isinstance(gradients, Mapping) or set(gradients) != set(objectives):
        keys = sorted(gradients) if isinstance(gradients, Mapping) else type(gradients).__name__
        raise InvalidParameterError(f"gradients must map every objective ({', '.join(objectives)}) to its mean-loss "
                                    f"gradient, a dict of shared parameter name → tensor; got {keys}")
    out = {}
    for name, given in gradients.items():
        if not isinstance(given, Mapping):
            raise InvalidParameterError(f"gradients[{name!r}] must be a dict of shared parameter name → tensor, got "
                                        f"{type(given).__name__}")
        missing = [n for n in shared if n not in given]
        if missing:
            raise InvalidParameterError(f"gradients[{name!r}] lacks {len(missing)} of the {len(shared)} shared "
                                        f"parameters: {', '.join(map(repr, missing[:5]))}")
        for n, p in shared.items():
            t = given[n]
            if not isinstance(t, torch.Tensor) or not t.dtype.is_floating_point or t.shape != p.shape:
                got = (f"a {t.dtype} tensor of shape {list(t.shape)}" if isinstance(t, torch.Tensor)
                       else type(t).__name__)
                raise InvalidParameterError(f"gradients[{name!r}][{n!r}] must be a floating tensor of the "
                                            f"parameter's shape {list(p.shape)}, got {got}")
            if t.device != p.device:
                raise InvalidParameterError(f"gradients[{name!r}][{n!r}] is on {t.device}, the parameter on {p.device}")
            if not bool(torch.isfinite(t).all()):
                raise InvalidParameterError(f"gradients[{name!r}][{n!r}] is not finite (NaN or inf): the loop's "
                                            f"gradient diverged")
        out[name] = {n: given[n] for n in shared}
    return out


def downstream_reached(model: nn.Module, downstream: Downstream, shared: Sequence[str] | None) -> tuple[str, ...]:
    """The parameters a probe without objectives measures on: ``shared`` checked (trainable names),
    or by default every trainable parameter ``D`` reaches; a re-fitted head's own are left out."""
    head = set(head_names(model, getattr(downstream, "head", None) or None))
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad and n not in head}
    if shared is None:
        names = reached_by(model, downstream, trainable)
        if not names:
            raise InvalidParameterError("the downstream loss reaches none of the model's trainable parameters "
                                        "(computed under torch.no_grad(), or detached?)")
        return names
    if isinstance(shared, (str, bytes)) or not isinstance(shared, Sequence) or not shared:
        raise InvalidParameterError(f"shared must be a non-empty list of parameter names, got {shared!r}")
    unknown = [n for n in shared if n not in trainable]
    if unknown:
        raise InvalidParameterError(f"shared names {len(unknown)} parameters the model has no trainable parameter "
                                    f"called: {', '.join(map(repr, unknown[:5]))}")
    return tuple(n for n in trainable if n in set(shared))
