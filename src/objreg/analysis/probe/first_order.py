"""``FirstOrderProbe``: the cheapest probe of a step, what ``objreg screen`` ranks by.

Before the step, ``D`` (``D*`` with a re-fitted head) and its gradient ``∇D`` at ``θ_t``; after
it, the step's first-order predicted drop ``−∇D·Δθ`` and, where asked, the curvature term
``½ Δθᵀ H_D Δθ`` (one Hessian-vector product at ``θ_t``, taken together with ``∇D`` after the step
so the two cost one pass). No per-example work and no split of the step: one gradient of ``D``
per probe (two passes with the curvature term). Like every probe it measures in ``eval()`` mode
with the random generators restored, and leaves the trajectory alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

from objreg.analysis.math.downstream import Downstream
from objreg.analysis.math.functional import Params, flat_dot, flat_norm, named_shared
from objreg.analysis.probe.arguments import Quiet, build_downstream, downstream_reached, unwrapped_model, user_group
from objreg.analysis.probe.attention import derivable_attention
from objreg.analysis.records import FirstOrderRecord
from objreg.core.errors import InvalidParameterError, ProbeStateError


@dataclass
class FirstOrderMeasurement:
    """What :meth:`FirstOrderProbe.measure` took before the step, for :meth:`FirstOrderProbe.finish`."""

    step: int
    downstream_loss: float  # not finite: nothing else was taken, and finish refuses it
    before: Params
    curvature: Any = None
    gradient: Params | None = None  # ∇D, unless the curvature term takes it after the step
    loop_gradient: Params | None = None


class FirstOrderProbe:
    """First-order transfer of a step at the cost of one gradient of ``D`` (module docstring).

    Args:
        model: The trained module.
        downstream: ``fn(model, batch) -> [B]``, the downstream per-example loss, an objreg
            ``Task``, or a built :class:`~objreg.analysis.math.downstream.Downstream` (the
            re-fitted head's ``D*`` too: ``objreg screen``'s).
        eval_batches: The fixed evaluation set defining ``D`` (one batch or a list).
        shared: Names of the parameters measured on (default: every trainable parameter ``D``
            reaches, a re-fitted head's own left out; ``objreg screen`` passes the backbone's).
        refit_head, fit_batches: Re-fit the downstream head at every probe (``D*``), as
            :class:`~objreg.analysis.probe.transfer_probe.TransferProbe` does.
        second_order: Also take ``½ Δθᵀ H_D Δθ`` (one Hessian-vector product per probe).
    """

    mode = "first_order"  # objreg.make_probe's name for it

    def __init__(self, model: nn.Module, downstream: Any, *, eval_batches: Any = None,
                 shared: Sequence[str] | None = None, refit_head: nn.Module | Sequence[str] | None = None,
                 fit_batches: Any = None, second_order: bool = False):
        if not isinstance(second_order, bool):
            raise InvalidParameterError(f"second_order must be True or False, got {second_order!r}")
        model = unwrapped_model(model)
        group = downstream.group if isinstance(downstream, Downstream) else user_group(model)
        self.downstream = build_downstream(model, downstream, eval_batches, group, None, refit_head, fit_batches)
        self.model, self.second_order = model, second_order
        self.records: list[FirstOrderRecord] = []
        self.shared = list(downstream_reached(model, self.downstream, shared))

    def loss(self) -> float:
        """``D`` now."""
        with Quiet(self.model):
            return self.downstream.loss(self.model)

    def measure(self, step: int, loop_gradient: Params | None = None) -> FirstOrderMeasurement:
        """Before the optimizer's step: ``D`` and (unless ``second_order``) ``∇D`` at ``θ_t``.
        ``loop_gradient``: the gradient the loop steps along, for the record's ``alignment``."""
        before = {n: p.detach().clone() for n, p in named_shared(self.model, self.shared).items()}
        with Quiet(self.model), derivable_attention():
            value = self.downstream.loss(self.model)
            measured = FirstOrderMeasurement(step, value, before, loop_gradient=loop_gradient)
            if not math.isfinite(value):
                return measured
            measured.curvature = self.downstream.curvature(self.model, before)
            if not self.second_order:
                measured.gradient, _ = measured.curvature.gradient_and_products([])
        return measured

    def finish(self, measured: FirstOrderMeasurement) -> FirstOrderRecord:
        """After the optimizer's step: its ``Δθ`` against ``∇D`` (and ``H_D`` where asked); the
        record is also appended to :attr:`records`."""
        if measured.curvature is None:
            raise ProbeStateError(f"finish() needs a measurement with a finite D; step {measured.step}'s D was "
                                  f"{measured.downstream_loss}")
        shared = named_shared(self.model, self.shared)
        delta = {n: p.detach() - measured.before[n] for n, p in shared.items()}
        gradient, second = measured.gradient, None
        if self.second_order:  # ∇D and H_D Δθ at θ_t (the curvature holds θ_t), one pass
            with Quiet(self.model), derivable_attention():
                gradient, dots, _ = measured.curvature.gradient_and_dots([delta], [[delta]])
            second = 0.5 * float(dots[0, 0])
        loop = measured.loop_gradient
        record: FirstOrderRecord = {
            "step": measured.step, "downstream_loss": measured.downstream_loss,
            "predicted_drop": -float(flat_dot(gradient, delta)), "second_order": second,
            "alignment": float(flat_dot(gradient, loop)) if loop is not None else None,
            "downstream_grad_norm": float(flat_norm(gradient)),
            "gradient_norm": float(flat_norm(loop)) if loop is not None else None,
            "step_norm": float(flat_norm(delta))}
        self.records.append(record)
        return record
