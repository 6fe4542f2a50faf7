"""The re-fitted head's fit: ``h*(θ) = argmin_h F(θ, h)`` at a fixed backbone (:func:`fit_head`).

``F(θ, h) = D_F(θ, h) + λ/2 ‖h‖²``, ``D_F`` the mean task loss over the fit set, ``h`` the head's
parameters its output is linear in (the loss is then convex in ``h``). Newton's method on ``h``
in float64, on features computed once per point (an objreg task's hidden states; a plain loss
function is called as it is), with a backtracking line search, to ``‖∇_h F‖`` at rounding level.
``λ = 1/n_F`` by default (:func:`default_l2`): the MAP fit under a standard-normal prior on
``h``, strongly convex, so the optimum stays finite when the fit set is separable, and its pull
fades as the set grows. :mod:`objreg.analysis.math.refit` builds ``D*`` on it; ``objreg
finetune``'s linear probe fits with it too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.func import functional_call

from objreg.analysis.math.functional import CallableLoss, Params
from objreg.analysis.parallel.group import Group
from objreg.core.errors import InvalidParameterError
from objreg.core.handles import Task
from objreg.core.types import ModelOutputs

#: Newton stops when the decrement ``½ gᵀA⁻¹g`` falls below this (relative to ``F``; float64:
#: ``D*`` is then exact to rounding), when no step lowers ``F`` any more (rounding level), or
#: after :data:`MAX_NEWTON_STEPS`.
DECREMENT_TOLERANCE = 1e-26
MAX_NEWTON_STEPS = 60
#: Below this decrement (relative to ``F``) a step's decrease is rounding in ``F`` itself: the step
#: is taken whole rather than searched along.
RESOLVED = 1e-12


def default_l2(fit_rows: int) -> float:
    """``λ = 1/n_F``: the MAP fit under a standard-normal prior on the head (module docstring)."""
    return 1.0 / max(fit_rows, 1)


@dataclass
class HeadFit:
    """One solve of ``h*(θ)``: the head (float64, by parameter name), ``A = ∂²_hh F`` there
    (float64, over the flattened head), ``F``'s gradient norm there, the Newton steps taken,
    the fit set's mean loss (without the penalty), and ``A⁻¹∇_h F`` there (how far the solve
    stopped from the optimum: ``D*``'s error from it is ``∂_h D_E`` times this)."""

    head: Params
    hessian: torch.Tensor
    gradient_norm: float
    steps: int
    fit_loss: float
    remaining: torch.Tensor


class HeadLoss(nn.Module):
    """An objreg task's per-example losses on hidden states computed beforehand: only the head
    runs, so ``functional_call`` over the head's parameters is cheap."""

    def __init__(self, model: nn.Module, task: Task):
        super().__init__()
        self.model = model
        self.task = task

    def forward(self, hidden: torch.Tensor, batch: Any, mask: torch.Tensor) -> torch.Tensor:
        return self.task.loss(ModelOutputs(hidden, self.model), batch, mask)


class _Whole(nn.Module):
    """A plain loss function ``fn(model, batch)``, called whole (no features to hold fixed)."""

    def __init__(self, model: nn.Module, loss: CallableLoss):
        super().__init__()
        self.model = model
        self.loss = loss

    def forward(self, batch: Any) -> torch.Tensor:
        return self.loss.fn(self.model, batch)


class HeadProblem:
    """``h ↦`` the per-example losses of every local chunk at a fixed backbone: what the fit solves.

    For an objreg task the backbone's hidden states are computed once (in ``model``'s dtype);
    a plain loss function runs whole with the backbone held fixed.
    """

    def __init__(self, model: nn.Module, task: Task | CallableLoss, chunks: Sequence[Any], head: Sequence[str]):
        self.head = tuple(head)
        self.calls: list[Callable[[Params], torch.Tensor]] = []
        with torch.no_grad():
            for chunk in chunks:
                if isinstance(task, Task):
                    mask = task.attention_mask(chunk)
                    hidden = model.encode(chunk.input_ids, mask, chunk.position_ids).detach()
                    module: nn.Module = HeadLoss(model, task)
                    args: tuple[Any, ...] = (hidden, chunk, mask)
                else:
                    module, args = _Whole(model, task), (chunk,)
                self.calls.append(self._call(module, args))

    @staticmethod
    def _call(module: nn.Module, args: tuple[Any, ...]) -> Callable[[Params], torch.Tensor]:
        # Only the head is swapped: every other parameter stays the model's own, held fixed.
        def losses(head: Params) -> torch.Tensor:
            return functional_call(module, {f"model.{n}": t for n, t in head.items()}, args)

        return losses

    def total(self, head: Params) -> torch.Tensor:
        """Sum of the local chunks' per-example losses at ``head``."""
        if not self.calls:  # a process with no chunk of the set
            return sum(t.sum() for t in head.values()) * 0
        return sum(call(head).sum() for call in self.calls)


def flattened(params: Params, names: Sequence[str]) -> torch.Tensor:
    return torch.cat([params[n].reshape(-1) for n in names])


def unflattened(vector: torch.Tensor, like: Params) -> Params:
    out, offset = {}, 0
    for name, t in like.items():
        out[name] = vector[offset:offset + t.numel()].view_as(t)
        offset += t.numel()
    return out


class NonFiniteFit(ArithmeticError):
    """The fit loss is not finite at the backbone's parameters (a diverged backbone): ``D*`` is undefined."""


def fit_head(problem: HeadProblem, start: Params, rows: int, l2: float, group: Group | None = None,
             first: bool = True, hint: torch.Tensor | None = None) -> HeadFit:
    """Newton's method for ``argmin_h F`` from ``start`` (in ``start``'s dtype, float64 for ``D*``;
    ``rows``: the fit set's examples on every process together; each process holds its chunks;
    ``first``: the run's first solve, where a Hessian that is not positive definite means a fit
    that is not convex). ``hint``: ``A`` where the last solve ended (close by, the backbone having
    moved one step): steps with it come first, so the Hessian, the costly part, is taken once,
    at the end (the solution is Newton's either way: the last steps are Newton's own).

    Raises:
        InvalidParameterError: on the first solve, ``F`` is not convex in the head at some iterate
            (a head whose output is not linear in the refitted parameters, or a non-convex loss).
        NonFiniteFit: ``F`` is not finite, or (after the first solve) its Hessian stopped being
            positive definite: the backbone diverged and ``D*`` is undefined.
    """
    group = group if group is not None else Group()
    like = {n: start[n].detach() for n in problem.head}
    names = list(like)

    def objective(x: torch.Tensor) -> torch.Tensor:
        return problem.total(unflattened(x, like)) / rows

    def chunk_objective(call: Callable[[Params], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
        return lambda x: call(unflattened(x, like)).sum() / rows

    def derivatives(x: torch.Tensor) -> tuple[float, torch.Tensor, torch.Tensor]:
        value = objective(x).detach()
        gradient = torch.func.grad(objective)(x)
        # Chunk by chunk: forward mode carries one tangent per head parameter, and over the whole
        # fit set at once those tangents' intermediates leave the cache; the sum is the same
        # Hessian to rounding (docs/performance.md, the MiniLM job).
        hessian = sum((torch.func.hessian(chunk_objective(call))(x) for call in problem.calls),
                      torch.zeros(x.numel(), x.numel(), dtype=x.dtype, device=x.device))
        value, gradient, hessian = group.all_reduce_sum((value, gradient, hessian))
        identity = torch.eye(x.numel(), dtype=x.dtype, device=x.device)
        return (float(value) + l2 / 2 * float(x @ x), gradient + l2 * x, hessian + l2 * identity)

    def penalised(x: torch.Tensor) -> float:
        return float(group.all_reduce_sum(objective(x).detach())) + l2 / 2 * float(x @ x)

    def step(x: torch.Tensor, value: float, direction: torch.Tensor, decrement: float) -> torch.Tensor | None:
        """Along ``direction``: backtracking (Armijo) while ``F`` can tell the decrease, the full
        step once it cannot (``F`` resolves changes of ~1e-16 of itself; the gradient still
        shrinks quadratically there). None where no step lowers ``F``."""
        if decrement <= RESOLVED * max(1.0, abs(value)):
            return x + direction
        size = 1.0
        while size > 1e-10:
            trial_value = penalised(x + size * direction)
            if math.isfinite(trial_value) and trial_value <= value - 0.5 * size * decrement:
                return x + size * direction
            size /= 2
        return None

    def converged(decrement: float, value: float, last: float, rate: float) -> bool:
        """At the tolerance, or no longer converging at ``rate`` (rounding level)."""
        return decrement <= DECREMENT_TOLERANCE * max(1.0, abs(value)) or decrement > last * rate

    x = flattened(like, names)
    steps = 0
    if hint is not None:  # chord steps with the last solve's Hessian, while they converge fast
        factor = torch.linalg.cholesky(hint)
        last = math.inf
        for _ in range(MAX_NEWTON_STEPS):
            value = penalised(x)
            gradient = group.all_reduce_sum(torch.func.grad(objective)(x)) + l2 * x
            if not (math.isfinite(value) and bool(torch.isfinite(gradient).all())):
                raise NonFiniteFit("the downstream head's fit loss is not finite at these backbone parameters")
            direction = -torch.cholesky_solve(gradient[:, None], factor)[:, 0]
            decrement = float(-(gradient @ direction)) / 2
            moved = None if converged(decrement, value, last, 0.25) else step(x, value, direction, decrement)
            if moved is None:
                break
            x, last, steps = moved, decrement, steps + 1
    value, gradient, hessian = derivatives(x)
    if not (math.isfinite(value) and bool(torch.isfinite(gradient).all()) and bool(torch.isfinite(hessian).all())):
        raise NonFiniteFit("the downstream head's fit loss is not finite at these backbone parameters")
    last = math.inf
    while True:
        factor, problem_found = torch.linalg.cholesky_ex(hessian)
        if int(problem_found) != 0 and not first:
            # The head and the loss were convex at the first solve; a Hessian that stops being
            # positive definite later is rounding at diverged features (losses of 1e9 nats).
            raise NonFiniteFit("the downstream head's fit broke down at these backbone parameters")
        if int(problem_found) != 0:
            raise InvalidParameterError("the downstream head's fit is not convex in its parameters here (the "
                                        "Hessian of the fit loss is not positive definite): re-fitting needs a head "
                                        "whose output is linear in the refitted parameters and a convex loss; use "
                                        "downstream_head='frozen'")
        direction = -torch.cholesky_solve(gradient[:, None], factor)[:, 0]
        decrement = float(-(gradient @ direction)) / 2
        stop = converged(decrement, value, last, 0.5) or steps >= MAX_NEWTON_STEPS
        moved = None if stop else step(x, value, direction, decrement)
        if moved is None:
            break
        x, last, steps = moved, decrement, steps + 1
        value, gradient, hessian = derivatives(x)
    fit_loss = value - l2 / 2 * float(x @ x)
    return HeadFit({n: t.clone() for n, t in unflattened(x, like).items()}, hessian, float(gradient.norm()), steps,
                   fit_loss, solve(hessian, gradient[:, None])[:, 0])


def solve(hessian: torch.Tensor, vectors: torch.Tensor) -> torch.Tensor:
    """``A⁻¹ b`` for the columns ``b`` of ``vectors`` (float64 Cholesky of the fit's ``A``)."""
    factor = torch.linalg.cholesky(hessian)
    return torch.cholesky_solve(vectors.to(hessian.dtype), factor)
