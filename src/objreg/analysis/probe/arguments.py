"""The :class:`~objreg.analysis.probe.transfer_probe.TransferProbe`'s arguments, checked and turned into
the analysis' pieces: objectives as loss functions, the weights, the downstream set, the shared
parameters, the process group; and :class:`Quiet`, the model in ``eval()`` mode with the random
generators saved. Every check raises one :class:`~objreg.core.errors.InvalidParameterError` that
names the argument and what it allows.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from objreg.analysis.math.downstream import Downstream
from objreg.analysis.math.functional import CallableLoss, ObjectiveFunction, requiring_grad
from objreg.analysis.math.refit import RefitDownstream
from objreg.analysis.parallel.group import Group, ProcessGroup
from objreg.core.errors import InvalidParameterError
from objreg.core.handles import Objective, Task


class Quiet:
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


def check_choice(what: str, value: str, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise InvalidParameterError(f"{what} must be one of {', '.join(allowed)}, got {value!r}")


def check_batches(what: str, given: Mapping[str, Any], objectives: Mapping[str, Any]) -> None:
    if not isinstance(given, Mapping) or set(given) != set(objectives):
        keys = sorted(given) if isinstance(given, Mapping) else type(given).__name__
        raise InvalidParameterError(f"{what} must map every objective ({', '.join(objectives)}) to its batch, "
                                    f"got {keys}")


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
    out = {n: float(weights[n]) for n in names}
    bad = [n for n, w in out.items() if not math.isfinite(w)]
    if bad:
        raise InvalidParameterError(f"weights must be finite numbers; {', '.join(bad)} is not")
    return out


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
        raise InvalidParameterError("downstream_head needs fit_batches: the examples the head is re-fitted on, apart "
                                    "from eval_batches")
    if not names and fit_batches is not None:
        raise InvalidParameterError("fit_batches is for a re-fitted head: give downstream_head too")
    options = {"group": group, "evaluation_dtype": eval_dtype}
    if isinstance(downstream, Task):
        if names:
            built: Downstream = RefitDownstream(downstream, eval_batches, fit_set=Downstream(downstream, fit_batches,
                                                **options), head=names, **options)
        else:
            built = Downstream(downstream, eval_batches, **options)
        built.check(model)
        return built
    if not callable(downstream):
        raise InvalidParameterError(f"downstream must be a per-sample loss fn(model, batch) -> [B] or an objreg Task, "
                                    f"got {type(downstream).__name__}")
    loss = CallableLoss("downstream", downstream)
    batches = _batch_list("eval_batches", eval_batches)
    if names:
        return RefitDownstream.of_batches(loss, batches, head=names, **options,
                                          fit_set=Downstream.of_batches(loss, _batch_list("fit_batches", fit_batches),
                                                                        **options))
    return Downstream.of_batches(loss, batches, **options)


def _batch_list(what: str, given: Any) -> list[Any]:
    batches = list(given) if isinstance(given, (list, tuple)) else [given]
    if not batches:
        raise InvalidParameterError(f"{what} is empty: D needs at least one example")
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
            raise InvalidParameterError("downstream_head must be a module of the model (its parameters are re-fitted); "
                                        "this one has no parameter of the model")
        return names
    if isinstance(head, (str, bytes)) or not isinstance(head, Sequence) or not head:
        raise InvalidParameterError(f"downstream_head must be the head module or a list of its parameter names, got "
                                    f"{type(head).__name__}")
    missing = [n for n in head if n not in params]
    if missing:
        raise InvalidParameterError(f"downstream_head names {len(missing)} parameters the model does not have: "
                                    f"{', '.join(map(repr, missing[:5]))}")
    return tuple(head)


def shared_names(model: nn.Module, shared: Any, downstream: Downstream) -> tuple[str, ...]:
    head = set(getattr(downstream, "head", ()))
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad and n not in head}
    if shared is None:
        names = reached_by(model, downstream, trainable)
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


def reached_by(model: nn.Module, downstream: Downstream, trainable: dict[str, nn.Parameter]) -> tuple[str, ...]:
    """The trainable parameters ``D``'s first chunk reaches."""
    function = ObjectiveFunction(model, downstream.task, downstream.chunks[0], shared=list(trainable))
    leaves = requiring_grad({n: p.detach() for n, p in trainable.items()})
    with Quiet(model), torch.enable_grad():
        grads = torch.autograd.grad(function(leaves).sum(), list(leaves.values()), allow_unused=True)
    return tuple(n for n, g in zip(leaves, grads) if g is not None)

