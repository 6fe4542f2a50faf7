"""What a probe checks at each measure and finish: the parameters it measures are still the ones
it was made with (:func:`check_shared_unchanged`), and ``D`` is a number before the step
(:func:`check_finite_downstream`) and after it, with the likely cause where the step diverged
(:func:`check_not_diverged`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

from objreg.analysis.probe.arguments import loss_label
from objreg.core.errors import InvalidParameterError, NonFiniteLossError, ProbeStateError


def check_shared_unchanged(model: nn.Module, shared_ids: Mapping[str, int], frozen: Iterable[str]) -> None:
    """The shared parameters must still be the ones the probe measures: present, trainable and
    the same tensors (the optimizer holds those, by ``id`` in ``shared_ids``); and none of the
    parameters ``frozen`` when the default shared set was chosen may be trainable now."""
    now = dict(model.named_parameters())
    for name, ident in shared_ids.items():
        p = now.get(name)
        change = ("was removed from the model" if p is None else
                  "was replaced by another tensor (the optimizer still holds the old one)" if id(p) != ident else
                  "was frozen (requires_grad=False)" if not p.requires_grad else None)
        if change is not None:
            raise ProbeStateError(f"shared parameter {name!r} {change} after the probe was made: the probe "
                                  f"measures a fixed set of parameters; make a new TransferProbe for the new set")
    unfrozen = sorted(n for n in frozen if n in now and now[n].requires_grad)
    if unfrozen:
        raise ProbeStateError(
            f"parameter {unfrozen[0]!r} was unfrozen after the probe was made, and the default shared set was "
            f"chosen among the parameters trainable then; make a new TransferProbe, or pass shared= the "
            f"parameters to measure")


def check_finite_downstream(value: float, when: str, task: Any) -> None:
    """``D`` (of ``task``) measured ``when``: a number, else the model diverged or the loss gives NaN."""
    if not math.isfinite(value):
        raise InvalidParameterError(
            f"{loss_label('downstream', task)} is not finite {when} (D = {value}): a "
            f"diverged model, or a loss that returns NaN or inf")


def check_not_diverged(value: float, step: int, shared: Mapping[str, nn.Parameter], task: Any) -> None:
    """``D`` after a step: non-finite where the step diverged (or the loss returns NaN there)."""
    if not math.isfinite(value):
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
            f"{loss_label('downstream', task)} is not finite after step {step} (D = {value}): "
            f"{cause}")
