"""The downstream loss of a re-fitted head, ``D*(θ) = D_E(θ, h*(θ))``, and its exact derivatives.

Transfer is read through a linear probe fitted to the features the backbone has *now*:

    h*(θ) = argmin_h F(θ, h),   F(θ, h) = D_F(θ, h) + λ/2 ‖h‖²,   D*(θ) = D_E(θ, h*(θ)),

``D_F`` the mean task loss over the fit set, ``D_E`` over the evaluation set, ``h`` the head's
refitted parameters (those the head's output is linear in: the loss is then convex in ``h``).

* **The fit** (:func:`fit_head`): Newton's method on ``h`` in float64, on features computed once
  per point (an objreg task's hidden states; a plain loss function is called as it is), with a
  backtracking line search, to ``‖∇_h F‖`` at rounding level. ``λ = 1/n_F`` by default
  (:func:`default_l2`): the MAP fit under a standard-normal prior on ``h``, strongly convex, so
  the optimum stays finite when the fit set is separable, and its pull fades as the set grows.
* **The gradient** by implicit differentiation (``A = ∂²_hh F``, positive definite):
  ``∇θD* = ∂θD_E − ∂²_θh F · v``, ``v = A⁻¹ ∂_h D_E``: one head-sized solve and one mixed
  Hessian-vector product of ``F``.
* **The Hessian.** With ``J = dh*/dθ = −A⁻¹ ∂²_hθ F`` and ``Φ(θ, h) = D_E(θ, h) − ⟨∂_h F(θ, h), v⟩``
  (``v`` held fixed), ``uᵀ ∇²D* w = ũᵀ ∇²Φ w̃`` along the lifted directions ``ũ = (u, J u)``
  (docs/analysis.md derives it: ``Φ`` is ``D*`` plus a multiple of the fit's stationarity
  condition, so its second derivative along the manifold of optima is ``D*``'s). As a vector,
  ``∇²D* w = [∇²Φ w̃]_θ + Jᵀ [∇²Φ w̃]_h``, ``Jᵀ y = −∂²_θh F · A⁻¹ y``. Each direction costs a
  mixed product of ``F`` (for ``J w``), a product of ``Φ`` (of ``D_E``, and a third derivative of
  ``F``), and a mixed product of ``F`` again (for ``Jᵀ``): :class:`RefitCurvature`, which the
  probe uses as it uses :class:`~objreg.analysis.math.curvature.Curvature` for a frozen head.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, jvp

from objreg.analysis.math.curvature import Curvature
from objreg.analysis.math.downstream import Downstream
from objreg.analysis.math.functional import CallableLoss, ObjectiveFunction, Params, named_shared
from objreg.analysis.parallel.group import Group
from objreg.core.errors import InvalidParameterError
from objreg.core.handles import Task
from objreg.core.types import ModelOutputs

#: Newton stops when the decrement ``½ gᵀA⁻¹g`` falls below this (float64: ``D*`` is then exact
#: to rounding) or after :data:`MAX_NEWTON_STEPS`.
DECREMENT_TOLERANCE = 1e-26
MAX_NEWTON_STEPS = 60


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


class _HeadLoss(nn.Module):
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
        fixed = {n: t.detach() for n, t in [*model.named_parameters(), *model.named_buffers()] if n not in self.head}
        self.calls: list[Callable[[Params], torch.Tensor]] = []
        with torch.no_grad():
            for chunk in chunks:
                if isinstance(task, Task):
                    mask = task.attention_mask(chunk)
                    hidden = model.encode(chunk.input_ids, mask, chunk.position_ids).detach()
                    module = _HeadLoss(model, task)
                    args: tuple[Any, ...] = (hidden, chunk, mask)
                else:
                    module, args = _Whole(model, task), (chunk,)
                prefix = {f"model.{n}": t for n, t in fixed.items()}
                self.calls.append(self._call(module, prefix, args))

    @staticmethod
    def _call(module: nn.Module, fixed: Params, args: tuple[Any, ...]) -> Callable[[Params], torch.Tensor]:
        def losses(head: Params) -> torch.Tensor:
            return functional_call(module, {**fixed, **{f"model.{n}": t for n, t in head.items()}}, args)

        return losses

    def total(self, head: Params) -> torch.Tensor:
        """Sum of the local chunks' per-example losses at ``head``."""
        if not self.calls:  # a process with no chunk of the set
            return sum(t.sum() for t in head.values()) * 0
        return sum(call(head).sum() for call in self.calls)


def _flat(params: Params, names: Sequence[str]) -> torch.Tensor:
    return torch.cat([params[n].reshape(-1) for n in names])


def _unflat(vector: torch.Tensor, like: Params) -> Params:
    out, offset = {}, 0
    for name, t in like.items():
        out[name] = vector[offset:offset + t.numel()].view_as(t)
        offset += t.numel()
    return out


def fit_head(problem: HeadProblem, start: Params, rows: int, l2: float, group: Group | None = None) -> HeadFit:
    """Newton's method for ``argmin_h F`` from ``start`` (in ``start``'s dtype, float64 for ``D*``;
    ``rows``: the fit set's examples on every process together; each process holds its chunks).

    Raises:
        InvalidParameterError: ``F`` is not convex in the head at some iterate (a head whose
            output is not linear in the refitted parameters, or a non-convex loss).
    """
    group = group if group is not None else Group()
    like = {n: start[n].detach() for n in problem.head}
    names = list(like)

    def objective(x: torch.Tensor) -> torch.Tensor:
        return problem.total(_unflat(x, like)) / rows

    def derivatives(x: torch.Tensor) -> tuple[float, torch.Tensor, torch.Tensor]:
        value = objective(x).detach()
        gradient = torch.func.grad(objective)(x)
        hessian = torch.func.hessian(objective)(x)
        value, gradient, hessian = group.all_reduce_sum((value, gradient, hessian))
        identity = torch.eye(x.numel(), dtype=x.dtype, device=x.device)
        return (float(value) + l2 / 2 * float(x @ x), gradient + l2 * x, hessian + l2 * identity)

    def penalised(x: torch.Tensor) -> float:
        return float(group.all_reduce_sum(objective(x).detach())) + l2 / 2 * float(x @ x)

    x = _flat(like, names)
    steps = 0
    value, gradient, hessian = derivatives(x)
    while True:
        factor, problem_found = torch.linalg.cholesky_ex(hessian)
        if int(problem_found) != 0:
            raise InvalidParameterError("the downstream head's fit is not convex in its parameters here (the "
                                        "Hessian of the fit loss is not positive definite): re-fitting needs a head "
                                        "whose output is linear in the refitted parameters and a convex loss; use "
                                        "downstream_head='frozen'")
        direction = -torch.cholesky_solve(gradient[:, None], factor)[:, 0]
        decrement = float(-(gradient @ direction)) / 2
        if decrement <= DECREMENT_TOLERANCE * max(1.0, abs(value)) or steps >= MAX_NEWTON_STEPS:
            break
        # Backtracking (Armijo): a full Newton step is taken near the optimum.
        size = 1.0
        while size > 1e-10:
            trial = x + size * direction
            trial_value = penalised(trial)
            if math.isfinite(trial_value) and trial_value <= value - 0.25 * size * decrement * 2:
                break
            size /= 2
        x = x + size * direction
        steps += 1
        value, gradient, hessian = derivatives(x)
    fit_loss = value - l2 / 2 * float(x @ x)
    return HeadFit({n: t.clone() for n, t in _unflat(x, like).items()}, hessian, float(gradient.norm()), steps,
                   fit_loss, solve(hessian, gradient[:, None])[:, 0])


def solve(hessian: torch.Tensor, vectors: torch.Tensor) -> torch.Tensor:
    """``A⁻¹ b`` for the columns ``b`` of ``vectors`` (float64 Cholesky of the fit's ``A``)."""
    factor = torch.linalg.cholesky(hessian)
    return torch.cholesky_solve(vectors.to(hessian.dtype), factor)


class Directional:
    """``P ↦ ⟨∂_h ℓ(P), v⟩`` per example: the derivative of an example's loss along the head
    direction ``v`` (``tangent``: zero on the backbone), whose Hessian is the third derivative
    of the fit loss that ``D*``'s curvature needs."""

    def __init__(self, function: ObjectiveFunction, tangent: Params):
        self.function, self.tangent = function, tangent
        self.batch_size = function.batch_size

    def __call__(self, params: Params) -> torch.Tensor:
        tangent = {n: self.tangent[n] for n in params}
        return jvp(self.function, (params,), (tangent,))[1]


class RefitCurvature:
    """``∇D*`` and ``∇²D* w`` at a point, for the probe (module docstring).

    Args:
        fit, evaluation: The fit and evaluation sets' local chunks as joint functions of the
            backbone's shared parameters and the head's (ObjectiveFunction over both).
        shared: The backbone's shared parameters at the point (the run's dtype).
        head: ``h*`` at the point, in the run's dtype.
        hessian: ``A = ∂²_hh F`` at ``h*`` (float64, flattened head).
        sizes: The fit and evaluation sets' examples (every process's).
        method: The Hessian-vector product method (:class:`Curvature`'s).
    """

    def __init__(self, fit: list[ObjectiveFunction], evaluation: list[ObjectiveFunction], shared: Params,
                 head: Params, hessian: torch.Tensor, sizes: tuple[int, int], method: str = "auto",
                 group: Group | None = None):
        self.fit, self.evaluation = fit, evaluation
        self.shared, self.head, self.hessian = shared, head, hessian
        self.fit_rows, self.eval_rows = sizes
        self.method = method
        self.group = group if group is not None else Group()
        self.point = {**shared, **head}
        self.matvecs = 0

    def _curvature(self, functions: list[Any], rows: int) -> Curvature:
        curvature = Curvature(functions, self.point, self.method, total=rows, group=self.group)
        return curvature

    def _run(self, functions: list[Any], rows: int, directions: list[Params]) -> tuple[Params, list[Params]]:
        curvature = self._curvature(functions, rows)
        result = curvature.gradient_and_products(directions)
        self.method = curvature.method
        return result

    def _lift(self, theta: Params, head: Params | None = None) -> Params:
        return {**theta, **(head if head is not None else {n: torch.zeros_like(t) for n, t in self.head.items()})}

    def _solve(self, columns: list[Params]) -> list[Params]:
        if not columns:
            return []
        stacked = torch.stack([_flat(c, list(self.head)) for c in columns], dim=1)
        solved = solve(self.hessian, stacked.double())
        like = self.head
        return [{n: t.to(like[n].dtype) for n, t in _unflat(solved[:, i], like).items()} for i in range(len(columns))]

    def gradient_and_products(self, directions: list[Params]) -> tuple[Params, list[Params]]:
        """``∇D*`` and ``[∇²D* w for w in directions]`` (on the backbone's shared parameters)."""
        thetas, heads = list(self.shared), list(self.head)
        # J w = −A⁻¹ ∂²_hθ F w for every direction.
        _, mixed = self._run(self.fit, self.fit_rows, [self._lift(w) for w in directions])
        lifts = self._solve([{n: -m[n] for n in heads} for m in mixed])
        lifted = [self._lift(w, j) for w, j in zip(directions, lifts)]
        # ∂D_E and ∂²D_E along the lifted directions; v = A⁻¹ ∂_h D_E.
        gradient_e, products_e = self._run(self.evaluation, self.eval_rows, lifted)
        (v,) = self._solve([{n: gradient_e[n] for n in heads}])
        tangent = self._lift({n: torch.zeros_like(t) for n, t in self.shared.items()}, v)
        # G = ⟨∂_h F, v⟩: its gradient's θ-part is ∂²_θh F v, its products the third derivative.
        directional = [Directional(f, tangent) for f in self.fit]
        gradient_g, products_g = self._run(directional, self.fit_rows, lifted)
        gradient = {n: gradient_e[n] - gradient_g[n] for n in thetas}
        # ∇²D* w = [∇²Φ w̃]_θ + Jᵀ[∇²Φ w̃]_h, Jᵀ y = −∂²_θh F A⁻¹ y.
        phi = [{n: pe[n] - pg[n] for n in self.point} for pe, pg in zip(products_e, products_g)]
        back = self._solve([{n: p[n] for n in heads} for p in phi])
        _, transposed = self._run(self.fit, self.fit_rows, [self._lift({n: torch.zeros_like(t) for n, t in
                                                                        self.shared.items()}, b) for b in back])
        products = [{n: p[n] - t[n] for n in thetas} for p, t in zip(phi, transposed)]
        self.matvecs += len(directions)
        return gradient, products

    def matvec(self, direction: Params) -> Params:
        """``∇²D* w`` for one direction."""
        return self.gradient_and_products([direction])[1][0]


@dataclass
class RefitDownstream(Downstream):
    """``D*``: the evaluation set's loss at the head re-fitted on the fit set at the current
    backbone (module docstring); a :class:`Downstream` to the probe, whose :meth:`loss` and
    :meth:`curvature` it replaces.

    Args (beyond :class:`Downstream`'s):
        fit_set: The fit examples, as a :class:`Downstream` (chunked alike, never evaluated as ``D``).
        head: Names of the model's parameters the fit solves for (the head's linear part).
        l2: ``λ`` (default :func:`default_l2` of the fit set's size).

    Every solve starts from the zero head, so ``D*`` is a function of the backbone alone: the
    same backbone gives the same ``D*`` to the last bit, whatever the run did before.
    """

    fit_set: Downstream | None = None
    head: tuple[str, ...] = ()
    l2: float | None = None
    last_fit: HeadFit | None = field(init=False, default=None, repr=False)
    last_fit_error: float = field(init=False, default=0.0, repr=False)
    _fitted_at: Params | None = field(init=False, default=None, repr=False)

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
        return {n: torch.zeros_like(params[n]) for n in self.head}

    @torch.no_grad()
    def loss(self, model: nn.Module) -> float:
        """``D*`` at the model's current backbone: the head re-fitted there (float64 Newton), then
        the evaluation set's loss at it, in :attr:`evaluation_dtype`."""
        evaluated = self.evaluation_model(model)
        with torch.enable_grad():
            fit = fit_head(HeadProblem(evaluated, self.task, self.fit_set.local_chunks, self.head),
                           self._head_start(evaluated), self.fit_set.size, self.l2, self.group)
            evaluation = HeadProblem(evaluated, self.task, self.local_chunks, self.head)
            tracked = {n: t.clone().requires_grad_(True) for n, t in fit.head.items()}
            sums = [call(tracked).sum() for call in evaluation.calls]
            total = sum(sums) if sums else torch.zeros(())
            slope = torch.autograd.grad(total, list(tracked.values()), allow_unused=True) if sums else ()
        like = next(iter(fit.head.values()))
        value = self.mean([s.detach() for s in sums], like=like)
        # D*'s error from stopping the solve short: ∂_h D_E · A⁻¹ ∇_h F (to first order).
        slope = [torch.zeros_like(t) if g is None else g for t, g in zip(tracked.values(), slope)] or \
            [torch.zeros_like(t) for t in tracked.values()]
        slope = self.group.all_reduce_sum(torch.cat([g.reshape(-1) for g in slope]).double())
        self.last_fit, self.last_fit_error = fit, abs(float(slope @ fit.remaining)) / self.size
        self._fitted_at = {n: t.detach().clone() for n, t in named_shared(model, self.shared).items()}
        return value

    def curvature(self, model: nn.Module, shared: Params, method: str = "auto") -> RefitCurvature:
        """``∇D*`` and ``∇²D*`` products at ``shared`` (the model's current backbone)."""
        fitted = self._fitted_at
        if fitted is None or fitted.keys() != shared.keys() or not all(torch.equal(fitted[n], shared[n])
                                                                       for n in shared):
            self.loss(model)
        joint = [*shared, *self.head]
        fit = [ObjectiveFunction(model, self.task, c, shared=joint) for c in self.fit_set.local_chunks]
        evaluation = [ObjectiveFunction(model, self.task, c, shared=joint) for c in self.local_chunks]
        params = dict(model.named_parameters())
        head = {n: t.to(params[n].dtype) for n, t in self.last_fit.head.items()}
        return RefitCurvature(fit, evaluation, dict(shared), head, self.last_fit.hessian,
                              (self.fit_set.size, self.size), method, self.group)

    def fit_summary(self) -> dict[str, float]:
        """The last fit, for the probe record: the fit set's loss, ``‖∇_h F‖``, Newton's steps."""
        fit = self.last_fit
        return {"fit_loss": fit.fit_loss, "gradient_norm": fit.gradient_norm, "newton_steps": fit.steps}
