"""The downstream loss of a re-fitted head, ``D*(θ) = D_E(θ, h*(θ))`` (:class:`RefitDownstream`),
and the one place ``D`` or ``D*`` is built (:func:`make_downstream`).

Transfer is read through a linear probe fitted to the features the backbone has *now*:

    h*(θ) = argmin_h F(θ, h),   F(θ, h) = D_F(θ, h) + λ/2 ‖h‖²,   D*(θ) = D_E(θ, h*(θ)),

``D_F`` the mean task loss over the fit set, ``D_E`` over the evaluation set, ``h`` the head's
refitted parameters (those the head's output is linear in: the loss is then convex in ``h``).
The fit is :mod:`objreg.analysis.math.head_fit`'s Newton solve; the exact gradient and Hessian
products of ``D*`` are :mod:`objreg.analysis.math.refit_curvature`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from objreg.analysis.math.downstream import Downstream
from objreg.analysis.math.functional import CallableLoss, ObjectiveFunction, Params, named_shared
from objreg.analysis.math.head_fit import HeadFit, HeadProblem, NonFiniteFit, default_l2, fit_head, flattened
from objreg.analysis.math.refit_curvature import FeatureChunk, RefitCurvature
from objreg.analysis.math.state_checks import check_head_state, fingerprint
from objreg.analysis.parallel.group import Group
from objreg.analysis.records import DownstreamFit
from objreg.core.errors import InvalidParameterError, NonFiniteLossError
from objreg.core.handles import Task


@dataclass
class RefitDownstream(Downstream):
    """``D*``: the evaluation set's loss at the head re-fitted on the fit set at the current
    backbone (module docstring); a :class:`Downstream` to the probe, whose :meth:`loss` and
    :meth:`curvature` it replaces.

    Args (beyond :class:`Downstream`'s):
        fit_set: The fit examples, as a :class:`Downstream` (chunked alike, never evaluated as ``D``).
        head: Names of the model's parameters the fit solves for (the head's linear part).
        l2: ``λ`` (default :func:`default_l2` of the fit set's size).

    The first solve starts from the zero head, so every run with the same backbone starts from
    the same ``D*``; each later solve starts from the last solution, with its Hessian as the hint
    (:meth:`state_dict` keeps both, so a resumed run solves from where the uninterrupted one did).
    """

    fit_set: Downstream | None = None
    head: tuple[str, ...] = ()
    l2: float | None = None
    start: Params | None = field(init=False, default=None, repr=False)
    hint: torch.Tensor | None = field(init=False, default=None, repr=False)
    last_fit: HeadFit | None = field(init=False, default=None, repr=False)
    last_fit_error: float = field(init=False, default=0.0, repr=False)
    last_slope: torch.Tensor | None = field(init=False, default=None, repr=False)
    _fitted_at: Params | None = field(init=False, default=None, repr=False)
    _fit_fingerprint: str | None = field(init=False, default=None, repr=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.fit_set is None or not self.head:
            raise InvalidParameterError("a re-fitted downstream head needs a fit set and the head's parameter names")
        if self.l2 is None:
            self.l2 = default_l2(self.fit_set.size)

    def check(self, model: nn.Module) -> bool:
        self.fit_set.check(model)
        return super().check(model)

    def _head_start(self, model: nn.Module) -> Params:
        params = dict(model.named_parameters())
        missing = [n for n in self.head if n not in params]
        if missing:
            raise InvalidParameterError(f"the downstream head names parameters the model does not have: "
                                        f"{', '.join(map(repr, missing))}")
        if self.start is not None:
            return {n: self.start[n].to(params[n].dtype) for n in self.head}
        return {n: torch.zeros_like(params[n]) for n in self.head}

    def state_dict(self) -> dict[str, Any]:
        """Where the next solve starts (the last solution and its Hessian), for a checkpoint, and
        the fit set it was solved on (a fingerprint)."""
        return {"start": None if self.start is None else {n: t.clone() for n, t in self.start.items()},
                "hint": None if self.hint is None else self.hint.clone(), "fit": self.fit_fingerprint()}

    def fit_fingerprint(self) -> str:
        """A SHA-256 of the fit set's examples (taken once)."""
        if self._fit_fingerprint is None:
            self._fit_fingerprint = fingerprint(self.fit_set.chunks)
        return self._fit_fingerprint

    def check_state(self, state: Any, model: nn.Module | None = None) -> None:
        """Refuse a :meth:`state_dict` that is malformed or of another head or fit set
        (``InvalidParameterError`` naming the key); ``model``: the head's shapes are checked too."""
        check_head_state(state, self.head, model, key="downstream", fit=self.fit_fingerprint())

    def load_state_dict(self, state: dict[str, Any], model: nn.Module | None = None) -> None:
        self.check_state(state, model)
        start = state["start"]
        self.start = None if start is None else {n: t.clone() for n, t in start.items()}
        self.hint = None if state["hint"] is None else state["hint"].clone()

    @torch.no_grad()
    def loss(self, model: nn.Module) -> float:
        """``D*`` at the model's current backbone: the head re-fitted there (float64 Newton), then
        the evaluation set's loss at it, in :attr:`evaluation_dtype`."""
        evaluated = self.evaluation_model(model)
        try:
            fit = fit_head(HeadProblem(evaluated, self.task, self.chunks_for(evaluated, self.fit_set.local_chunks),
                                       self.head),
                           self._head_start(evaluated), self.fit_set.size, self.l2, self.group, self.start is None,
                           self.hint)
        except NonFiniteFit:  # D* is undefined where the backbone diverged: NaN, as D would be
            self.last_fit, self.last_fit_error, self._fitted_at = None, float("nan"), None
            return float("nan")
        evaluation = HeadProblem(evaluated, self.task, self.chunks_for(evaluated, self.local_chunks), self.head)
        sums = [call(fit.head).sum() for call in evaluation.calls]
        value = self.mean(sums, evaluated)
        # D*'s error from stopping the solve short: ∂_h D_E · A⁻¹ ∇_h F (to first order).
        slope = self.group.all_reduce_sum(flattened(torch.func.grad(evaluation.total)(fit.head), list(self.head)))
        self.last_fit, self.last_fit_error = fit, abs(float(slope.double() @ fit.remaining.double())) / self.size
        self.last_slope = slope.double() / self.size
        self.start, self.hint = fit.head, fit.hessian
        self._fitted_at = {n: t.detach().clone() for n, t in named_shared(model, self.shared).items()}
        return value

    def curvature(self, model: nn.Module, shared: Params, method: str = "auto") -> RefitCurvature:
        """``∇D*`` and ``∇²D*`` products at ``shared`` (the model's current backbone)."""
        fitted = self._fitted_at
        if fitted is None or fitted.keys() != shared.keys() or not all(torch.equal(fitted[n], shared[n])
                                                                       for n in shared):
            self.loss(model)
        if self.last_fit is None:  # the fit was not finite: D* and its derivatives are undefined here
            raise NonFiniteLossError(
                "D* is undefined here: the re-fitted head's fit on fit_batches is not finite (a NaN or infinite "
                "feature of the backbone on the fit set: the backbone diverged, or the fit set's inputs are not "
                "finite)")
        joint = [*shared, *self.head]
        fit = [FeatureChunk(model, self.task, c, self.fit_set.size) if isinstance(self.task, Task) else
               ObjectiveFunction(model, self.task, c, shared=joint) for c in self.fit_set.local_chunks]
        evaluation = [ObjectiveFunction(model, self.task, c, shared=joint) for c in self.local_chunks]
        params = dict(model.named_parameters())
        head = {n: t.to(params[n].dtype) for n, t in self.last_fit.head.items()}
        return RefitCurvature(fit, evaluation, dict(shared), head, self.last_fit.hessian,
                              (self.fit_set.size, self.size), method, self.group, eval_head_gradient=self.last_slope)

    def fit_summary(self) -> DownstreamFit:
        """The last fit, for the probe record: the fit set's loss and ``‖∇_h F‖`` where it stopped
        (NaN where the fit loss was not finite)."""
        if self.last_fit is None:
            return {"fit_loss": float("nan"), "gradient_norm": float("nan")}
        return {"fit_loss": self.last_fit.fit_loss, "gradient_norm": self.last_fit.gradient_norm}


def make_downstream(loss: Task | CallableLoss, evaluation: Any, *, head: Sequence[str] = (), fit: Any = None,
                    group: Group | None = None, evaluation_dtype: torch.dtype | None = torch.float64,
                    fit_chunk_size: int = 16, fit_chunk_tokens: int | None = None) -> Downstream:
    """``D`` (the head read as it is) or, where ``head`` names the head's linear parameters,
    ``D*`` (the head re-fitted on ``fit`` at every point). The one place either is built: the
    run, the screen and the probe's arguments all come here.

    ``loss``: an objreg task, whose ``evaluation`` and ``fit`` are one batch each (sorted by
    length and chunked; the fit set's chunks by ``fit_chunk_size`` rows and ``fit_chunk_tokens``
    tokens), or the user's per-sample loss, whose ``evaluation`` and ``fit`` are lists of batches
    (each one chunk, used as given).
    """
    options: dict[str, Any] = {"group": group if group is not None else Group(), "evaluation_dtype": evaluation_dtype}
    if isinstance(loss, CallableLoss):
        if not head:
            return Downstream.of_batches(loss, evaluation, **options)
        return RefitDownstream.of_batches(loss, evaluation, head=tuple(head),
                                          fit_set=Downstream.of_batches(loss, fit, **options), **options)
    if not head:
        return Downstream(loss, evaluation, **options)
    fit_set = Downstream(loss, fit, chunk_size=fit_chunk_size, chunk_tokens=fit_chunk_tokens, **options)
    return RefitDownstream(loss, evaluation, head=tuple(head), fit_set=fit_set, **options)
