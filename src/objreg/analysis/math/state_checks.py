"""Checks shared by the states the analysis keeps (a re-fitted head's, a probe's): one
``InvalidParameterError`` naming the key, and a fingerprint of a set of examples, so that a state
solved on other data is told apart."""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from objreg.core.errors import InvalidParameterError


def refuse(key: str, what: str) -> InvalidParameterError:
    return InvalidParameterError(f"the probe state's {key!r} {what}")


def shape_of(value: Any) -> str:
    return f"of shape {list(value.shape)}" if isinstance(value, torch.Tensor) else f"as {type(value).__name__}"


def check_head_state(state: Any, head: Sequence[str], model: nn.Module | None, key: str = "state",
                     fit: str | None = None) -> None:
    """Refuse a re-fitted head's state (``RefitDownstream.state_dict``) that is malformed, of
    other head parameters, shapes (another number of classes) or dtype-less data, or of another
    fit set (``fit``: this head's fit-set fingerprint; None: not compared here)."""
    if not isinstance(state, Mapping) or not all(k in state for k in ("start", "hint", "fit")):
        raise refuse(key, "must hold the re-fitted head's start, hint and fit set (a RefitDownstream state_dict)")
    start, hint = state["start"], state["hint"]
    if start is not None:
        if not isinstance(start, Mapping) or set(start) != set(head):
            found = sorted(start) if isinstance(start, Mapping) else type(start).__name__
            raise refuse(f"{key}.start", f"has the head parameters {found}; this head's are {sorted(head)}")
        params = dict(model.named_parameters()) if model is not None else {}
        for name in head:
            tensor = start[name]
            if not isinstance(tensor, torch.Tensor) or not tensor.dtype.is_floating_point:
                raise refuse(f"{key}.start", f"holds {name!r} {shape_of(tensor)}, not a floating tensor")
            if name in params and tensor.shape != params[name].shape:
                raise refuse(f"{key}.start", f"holds {name!r} of shape {list(tensor.shape)}; this model's is "
                                             f"{list(params[name].shape)} (a head of other classes?)")
            if not bool(torch.isfinite(tensor).all()):
                raise refuse(f"{key}.start", f"holds {name!r} with infinite or NaN values")
    if hint is not None:
        size = sum(start[n].numel() for n in head) if isinstance(start, Mapping) else None
        if start is None or not isinstance(hint, torch.Tensor) or hint.dim() != 2 or list(hint.shape) != [size, size]:
            raise refuse(f"{key}.hint", f"must be the last solve's Hessian, a [{size}, {size}] matrix beside its "
                                        f"start; got {shape_of(hint)}")
        if not bool(torch.isfinite(hint).all()):
            raise refuse(f"{key}.hint", "holds infinite or NaN values")
    if not isinstance(state["fit"], str):
        raise refuse(f"{key}.fit", "must be the fit set's fingerprint")
    if fit is not None and state["fit"] != fit:
        raise refuse(f"{key}.fit", "is of another fit set (other examples or another order): the head was solved "
                                   "on other data than this probe's fit_batches")


def fingerprint(value: Any) -> str:
    """A SHA-256 of every tensor and plain value in ``value`` (batches of any nesting), in order."""
    digest = hashlib.sha256()

    def walk(item: Any) -> None:
        if isinstance(item, torch.Tensor):
            flat = item.detach().cpu().contiguous().reshape(-1)
            digest.update(f"{item.dtype}{list(item.shape)}".encode())
            digest.update(flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b"")
        elif isinstance(item, Mapping):
            for k in item:
                digest.update(repr(k).encode())
                walk(item[k])
        elif isinstance(item, (list, tuple)):
            digest.update(f"[{len(item)}".encode())
            for v in item:
                walk(v)
        elif dataclasses.is_dataclass(item) and not isinstance(item, type):
            for f in dataclasses.fields(item):
                digest.update(f.name.encode())
                walk(getattr(item, f.name))
        elif isinstance(item, float) and math.isnan(item):
            digest.update(b"nan")
        elif item is None or isinstance(item, (bool, int, float, str, bytes)):
            digest.update(repr(item).encode())
        elif hasattr(item, "__dict__"):  # an object holding its data in attributes
            digest.update(type(item).__name__.encode())
            walk(vars(item))
        else:  # nothing of it that reads the same in another process (a repr may hold an address)
            digest.update(type(item).__name__.encode())

    walk(value)
    return digest.hexdigest()
