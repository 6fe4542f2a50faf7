"""Checks of a :class:`~objreg.analysis.probe.transfer_probe.TransferProbe` state before it is
loaded: every key present and of its type, and what it was measured on the same as what it is
loaded into (the model's measured parameters, their shapes and dtypes, the measured set, the
optimizer and its settings, the re-fitted head and its fit set).

A state that passes loads without a ``TypeError``, ``KeyError`` or a failed solve half-way; one
that does not is refused with :class:`~objreg.core.errors.InvalidParameterError` naming the key,
before anything of the probe is changed. The learning rate is not compared: a schedule changes it
every step, and the probe reads it from the optimizer at each step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from objreg.analysis.math.state_checks import refuse, shape_of
from objreg.core.errors import InvalidParameterError

#: The keys of a state, each checked below.
KEYS = ("format", "objectives", "shared", "parameters", "optimizer", "records", "next_step", "steps_seen",
        "tracked_at", "coalitions", "attribution", "hvp_method", "update_rule", "methods_used",
        "downstream_resolution", "downstream")
#: The optimizer settings a state must share with the probe it is loaded into (not ``lr``: above).
OPTIMIZER_SETTINGS = ("betas", "eps", "weight_decay", "momentum", "dampening", "nesterov", "amsgrad", "maximize",
                      "decoupled_weight_decay")


def parameter_layout(parameters: Mapping[str, torch.Tensor]) -> dict[str, list[Any]]:
    """``name → [shape, dtype]`` of the measured parameters, as a state keeps them."""
    return {n: [list(p.shape), str(p.dtype).removeprefix("torch.")] for n, p in parameters.items()}


def optimizer_settings(optimizer: torch.optim.Optimizer, group: Mapping[str, Any]) -> dict[str, Any]:
    """The optimizer's kind and the settings of the measured parameters' group, as plain data."""
    settings: dict[str, Any] = {"kind": type(optimizer).__name__}
    for key in OPTIMIZER_SETTINGS:
        if key in group:
            value = group[key]
            settings[key] = list(value) if isinstance(value, (tuple, list)) else value
    return settings


def _strings(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def check_state(state: Any, *, fmt: int, objectives: Sequence[str], model: nn.Module,
                shared_given: tuple[str, ...] | None, optimizer: dict[str, Any], adam: bool,
                refit_head: Sequence[str] | None) -> None:
    """Refuse ``state`` (module docstring) unless it is whole, well-formed and of this probe.

    Args:
        fmt: The state format this probe writes.
        objectives: This probe's objectives, in order.
        shared_given: The measured set the probe was given (``shared=``); None: the default set.
        optimizer: :func:`optimizer_settings` of this probe's optimizer.
        adam: Whether this probe keeps Adam's coalition moments.
        refit_head: The re-fitted head's parameter names; None: a frozen head.
    """
    if not isinstance(state, Mapping) or state.get("format") != fmt:
        found = state.get("format") if isinstance(state, Mapping) else type(state).__name__
        raise InvalidParameterError(f"not a TransferProbe state_dict of format {fmt} (got {found!r})")
    missing = [k for k in KEYS if k not in state]
    if missing:
        raise InvalidParameterError(f"the probe state is partial: it lacks {', '.join(map(repr, missing))}")
    if not _strings(state["objectives"]):
        raise refuse("objectives", "must be a list of objective names")
    if list(state["objectives"]) != list(objectives):
        raise InvalidParameterError(f"the state is of a probe of objectives {list(state['objectives'])}, this one "
                                    f"probes {list(objectives)}")
    names = state["shared"]
    if not _strings(names) or not names or len(set(names)) != len(names):
        raise refuse("shared", "must be a non-empty list of distinct parameter names")
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    absent = [n for n in names if n not in trainable]
    if absent:
        raise InvalidParameterError(f"the state measures {len(absent)} parameters this model has no trainable "
                                    f"parameter called: {', '.join(map(repr, absent[:5]))}")
    if shared_given is not None and tuple(names) != shared_given:
        raise refuse("shared", f"measures {len(names)} parameters ({', '.join(map(repr, names[:3]))}...), this probe "
                               f"was given shared= {len(shared_given)} others or in another order: make the probe with "
                               f"the state's set, or without shared=")
    layout = state["parameters"]
    if not isinstance(layout, Mapping) or set(layout) != set(names):
        raise refuse("parameters", "must give the shape and dtype of every measured parameter")
    here = parameter_layout({n: trainable[n] for n in names})
    for name in names:
        saved = list(layout[name]) if isinstance(layout[name], (list, tuple)) else layout[name]
        if saved != here[name]:
            raise refuse("parameters", f"has {name!r} as {layout[name]!r}; this model's is {here[name]} (shape, "
                                       f"dtype): a state of another model")
    _check_optimizer(state["optimizer"], optimizer)
    if not isinstance(state["records"], (list, tuple)) or not all(isinstance(r, Mapping) for r in state["records"]):
        raise refuse("records", "must be a list of step records")
    for key in ("next_step", "steps_seen"):
        if not _count(state[key]):
            raise refuse(key, f"must be a step count (an integer ≥ 0), got {state[key]!r}")
    if state["tracked_at"] is not None and not _count(state["tracked_at"]):
        raise refuse("tracked_at", f"must be None or a step, got {state['tracked_at']!r}")
    _check_coalitions(state["coalitions"], adam, {n: trainable[n] for n in names})
    attribution = state["attribution"]
    if not isinstance(attribution, (list, tuple)) or not all(
            isinstance(e, (list, tuple)) and len(e) == 4 and isinstance(e[0], str) and isinstance(e[2], (int, float))
            and isinstance(e[1], (list, tuple)) and isinstance(e[3], (list, tuple)) for e in attribution):
        raise refuse("attribution", "must be a list of [objective, token ids, score, steps] entries")
    for key in ("hvp_method", "update_rule"):
        if not isinstance(state[key], str):
            raise refuse(key, f"must be a method's name, got {state[key]!r}")
    if not _strings(state["methods_used"]):
        raise refuse("methods_used", "must be a list of method names")
    downstream = state["downstream"]
    if (refit_head is not None) != (downstream is not None):
        kinds = ("frozen", "re-fitted") if refit_head is not None else ("re-fitted", "frozen")
        raise InvalidParameterError(f"the state is of a probe with a {kinds[0]} downstream head; this probe's is "
                                    f"{kinds[1]}")
    # The re-fitted head's own state: RefitDownstream.check_state, which knows its fit set.


def _check_optimizer(saved: Any, here: dict[str, Any]) -> None:
    if not isinstance(saved, Mapping) or not isinstance(saved.get("kind"), str):
        raise refuse("optimizer", "must name the optimizer's kind and settings")
    if saved["kind"] != here["kind"]:
        raise InvalidParameterError(f"the state is of a probe under {saved['kind']}; this probe's optimizer is "
                                    f"{here['kind']}")
    for key in OPTIMIZER_SETTINGS:
        if saved.get(key) != here.get(key):
            raise refuse("optimizer", f"has {key}={saved.get(key)!r}; this probe's {here['kind']} has "
                                      f"{key}={here.get(key)!r}")


def _check_coalitions(coalitions: Any, adam: bool, shared: Mapping[str, torch.Tensor]) -> None:
    if (coalitions is None) != (not adam):
        raise InvalidParameterError(f"the state is of a probe under {'Adam' if coalitions is not None else 'SGD'}; "
                                    f"this probe's optimizer is {'Adam' if adam else 'SGD'}")
    if coalitions is None:
        return
    if not isinstance(coalitions, Mapping) or not all(k in coalitions for k in ("players", "steps", "exp_avg",
                                                                                   "exp_avg_sq")):
        raise refuse("coalitions", "must hold the players, steps and both moments of the Adam coalitions")
    if not _strings(coalitions["players"]):
        raise refuse("coalitions", "must name its players")
    steps = coalitions["steps"]
    if not isinstance(steps, Mapping) or not all(n in shared and _count(s) for n, s in steps.items()):
        raise refuse("coalitions", "steps must be a step count per measured parameter")
    for moment in ("exp_avg", "exp_avg_sq"):
        table = coalitions[moment]
        if not isinstance(table, Mapping):
            raise refuse("coalitions", f"{moment} must map each coalition to its moments")
        for mask, moments in table.items():
            if not str(mask).isdigit() or not isinstance(moments, Mapping):
                raise refuse("coalitions", f"{moment} has a malformed coalition {mask!r}")
            for name, tensor in moments.items():
                if name not in shared or not isinstance(tensor, torch.Tensor) or tensor.shape != shared[name].shape:
                    raise refuse("coalitions", f"{moment} of coalition {mask} holds {name!r} "
                                 f"{shape_of(tensor)}; this model's is {shape_of(shared.get(name))}")
                if not bool(torch.isfinite(tensor).all()) or (moment == "exp_avg_sq" and bool((tensor < 0).any())):
                    raise refuse("coalitions", f"{moment} of coalition {mask} holds {name!r} with values no Adam "
                                               f"moment has (infinite, NaN or a negative square)")
