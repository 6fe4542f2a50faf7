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
from objreg.analysis.math.state_checks import check_head_state, fingerprint
from objreg.analysis.parallel.group import Group
from objreg.analysis.records import DownstreamFit
from objreg.core.errors import InvalidParameterError, NonFiniteLossError
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
        self.calls: list[Callable[[Params], torch.Tensor]] = []
        with torch.no_grad():
            for chunk in chunks:
                if isinstance(task, Task):
                    mask = task.attention_mask(chunk)
                    hidden = model.encode(chunk.input_ids, mask, chunk.position_ids).detach()
                    module: nn.Module = _HeadLoss(model, task)
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


def _flat(params: Params, names: Sequence[str]) -> torch.Tensor:
    return torch.cat([params[n].reshape(-1) for n in names])


def _unflat(vector: torch.Tensor, like: Params) -> Params:
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
        return problem.total(_unflat(x, like)) / rows

    def chunk_objective(call: Callable[[Params], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
        return lambda x: call(_unflat(x, like)).sum() / rows

    def derivatives(x: torch.Tensor) -> tuple[float, torch.Tensor, torch.Tensor]:
        value = objective(x).detach()
        gradient = torch.func.grad(objective)(x)
        # Chunk by chunk: forward mode carries one tangent per head parameter, and over the whole
        # fit set at once those tangents' intermediates leave the cache (3× slower at 64 rows of
        # MiniLM's SQuAD windows, more at 256); the sum is the same Hessian to rounding.
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

    x = _flat(like, names)
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


class _Encode(nn.Module):
    """The backbone's pass alone (an objreg model's ``encode``), for ``functional_call`` over θ."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, mask: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        return self.model.encode(input_ids, mask, position_ids)


class FeatureChunk:
    """One fit chunk of an objreg task, split at the head: ``φ(θ)`` (the backbone's hidden states)
    and ``f(φ, h)`` (the chunk's share of ``D_F``: its summed loss over ``rows``, the fit set's
    examples), so every derivative in the head and the
    features is taken on the head alone and the backbone is passed through only to move
    directions between ``θ`` and ``φ`` (:meth:`RefitCurvature._feature_products`)."""

    def __init__(self, model: nn.Module, task: Task, chunk: Any, rows: int):
        mask = task.attention_mask(chunk)
        self.rows = rows
        self._encode, self._loss = _Encode(model), _HeadLoss(model, task)
        self._args, self._chunk, self._mask = (chunk.input_ids, mask, chunk.position_ids), chunk, mask

    def features(self, shared: Params) -> torch.Tensor:
        return functional_call(self._encode, {f"model.{n}": t for n, t in shared.items()}, self._args)

    def moved(self, shared: Params, directions: list[Params]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """``φ`` and ``φ' w`` for each direction (forward mode, the directions batched)."""
        stacked = {n: torch.stack([d[n] for d in directions]) for n in shared}
        features, tangents = torch.func.vmap(lambda d: jvp(self.features, (shared,), (d,)))(stacked)
        return features[0], list(tangents.unbind(0))

    def loss(self, features: torch.Tensor, head: Params) -> torch.Tensor:
        return functional_call(self._loss, {f"model.{n}": t for n, t in head.items()},
                               (features, self._chunk, self._mask)).sum() / self.rows


class RefitCurvature:
    """``∇D*`` and ``∇²D* w`` at a point, for the probe (module docstring).

    Args:
        fit: The fit set's local chunks: :class:`FeatureChunk` s (an objreg task), or joint
            functions of the backbone's shared parameters and the head's (a plain loss function).
        evaluation: The evaluation set's local chunks as joint functions (ObjectiveFunction over both).
        shared: The backbone's shared parameters at the point (the run's dtype).
        head: ``h*`` at the point, in the run's dtype.
        hessian: ``A = ∂²_hh F`` at ``h*`` (float64, flattened head).
        sizes: The fit and evaluation sets' examples (every process's).
        method: The Hessian-vector product method of the evaluation set and of the joint path.
        eval_head_gradient: ``∂_h D_E`` at ``h*`` (flattened, float64) where the fit already took
            it: the evaluation set's backbone pass is then shared by the gradient and the products.
    """

    def __init__(self, fit: list[Any], evaluation: list[ObjectiveFunction], shared: Params, head: Params,
                 hessian: torch.Tensor, sizes: tuple[int, int], method: str = "auto", group: Group | None = None,
                 max_directions: int = 4, eval_head_gradient: torch.Tensor | None = None):
        self.eval_head_gradient = eval_head_gradient
        self.fit, self.evaluation = fit, evaluation
        self.shared, self.head, self.hessian = shared, head, hessian
        self.fit_rows, self.eval_rows = sizes
        self.method = method
        self.group = group if group is not None else Group()
        self.point = {**shared, **head}
        self.max_directions = max_directions
        self.matvecs = 0

    def _run(self, functions: list[Any], rows: int, directions: list[Params]) -> tuple[Params, list[Params]]:
        curvature = Curvature(functions, self.point, self.method, total=rows, group=self.group)
        result = curvature.gradient_and_products(directions)
        self.method = curvature.method
        return result

    def _zeros(self, like: Params) -> Params:
        return {n: torch.zeros_like(t) for n, t in like.items()}

    def _lift(self, theta: Params, head: Params | None = None) -> Params:
        return {**theta, **(head if head is not None else self._zeros(self.head))}

    def _solve(self, columns: list[Params]) -> list[Params]:
        """``A⁻¹`` of each head-sized column (summed over the processes beforehand)."""
        if not columns:
            return []
        stacked = torch.stack([_flat(c, list(self.head)) for c in columns], dim=1)
        solved = solve(self.hessian, stacked.double())
        like = self.head
        return [{n: t.to(like[n].dtype) for n, t in _unflat(solved[:, i], like).items()} for i in range(len(columns))]

    def gradient_and_products(self, directions: list[Params]) -> tuple[Params, list[Params]]:
        """``∇D*`` and ``[∇²D* w for w in directions]`` (on the backbone's shared parameters)."""
        if self.fit and isinstance(self.fit[0], FeatureChunk):
            result = self._feature_products(directions)
        else:
            result = self._joint_products(directions)
        self.matvecs += len(directions)
        return result

    def matvec(self, direction: Params) -> Params:
        """``∇²D* w`` for one direction."""
        return self.gradient_and_products([direction])[1][0]

    # -- a plain loss function: every derivative of F through the whole model ---------------------

    def _joint_products(self, directions: list[Params]) -> tuple[Params, list[Params]]:
        thetas, heads = list(self.shared), list(self.head)
        # J w = −A⁻¹ ∂²_hθ F w for every direction.
        _, mixed = self._run(self.fit, self.fit_rows, [self._lift(w) for w in directions]) if directions else (
            None, [])
        lifts = self._solve([{n: -m[n] for n in heads} for m in mixed])
        lifted = [self._lift(w, j) for w, j in zip(directions, lifts)]
        # ∂D_E and ∂²D_E along the lifted directions; v = A⁻¹ ∂_h D_E.
        gradient_e, products_e = self._run(self.evaluation, self.eval_rows, lifted)
        (v,) = self._solve([{n: gradient_e[n] for n in heads}])
        tangent = self._lift(self._zeros(self.shared), v)
        # G = ⟨∂_h F, v⟩: its gradient's θ-part is ∂²_θh F v, its products the third derivative.
        directional = [Directional(f, tangent) for f in self.fit]
        gradient_g, products_g = self._run(directional, self.fit_rows, lifted)
        gradient = {n: gradient_e[n] - gradient_g[n] for n in thetas}
        # ∇²D* w = [∇²Φ w̃]_θ + Jᵀ[∇²Φ w̃]_h, Jᵀ y = −∂²_θh F A⁻¹ y.
        phi = [{n: pe[n] - pg[n] for n in self.point} for pe, pg in zip(products_e, products_g)]
        back = self._solve([{n: p[n] for n in heads} for p in phi])
        _, transposed = self._run(self.fit, self.fit_rows, [self._lift(self._zeros(self.shared), b) for b in back]) \
            if back else (None, [])
        return gradient, [{n: p[n] - t[n] for n in thetas} for p, t in zip(phi, transposed)]

    # -- an objreg task: derivatives of F on the head, the backbone only moves directions -----------

    def _feature_products(self, directions: list[Params]) -> tuple[Params, list[Params]]:
        """The same quantities as :meth:`_joint_products`, with ``F = f(φ(θ), h)`` split at the
        head: the backbone is passed through over the fit set to move the directions into
        feature space (``φ' w``, forward mode) and, once more, for the curvature of ``⟨c, φ(θ)⟩``
        together with the pulled-back cotangents ``φ'ᵀ y`` (:class:`_Pulled`); everything else is
        taken on the head and the features (:class:`_HeadSide`)."""
        thetas, heads = list(self.shared), list(self.head)
        if self.eval_head_gradient is None or not directions:
            gradient_e, _ = self._run(self.evaluation, self.eval_rows, [])
            slope = _flat(gradient_e, heads)
        else:
            slope = self.eval_head_gradient
        (v,) = self._solve([_unflat(slope, self.head)])
        if not directions:
            with torch.no_grad():
                sides = [_HeadSide(chunk, chunk.features(self.shared), self.head, v) for chunk in self.fit]
            pulled_c, _ = self._backbone(sides).gradient_and_products([])
            return {n: gradient_e[n] - pulled_c[n] for n in thetas}, []
        # φ and φ' w, chunk by chunk; the head-side derivatives there.
        with torch.no_grad():
            moved = []
            sides = []
            for chunk in self.fit:
                features, tangents = chunk.moved(self.shared, directions)
                sides.append(_HeadSide(chunk, features, self.head, v))
                moved.append(tangents)
        sums = [self.group.all_reduce_sum(_sum_params([side.mixed(m[k]) for side, m in zip(sides, moved)], self.head))
                for k in range(len(directions))]
        lifts = self._solve([{n: -m[n] for n in heads} for m in sums])  # J w = −A⁻¹ ∂²_hθ F w
        gradient_e, products_e = self._run(self.evaluation, self.eval_rows,
                                           [self._lift(w, j) for w, j in zip(directions, lifts)])
        thirds = [[side.third(m[k], jw) for k, jw in enumerate(lifts)] for side, m in zip(sides, moved)]
        del moved
        head_g = [self.group.all_reduce_sum(_sum_params([t[k][1] for t in thirds], self.head))
                  for k in range(len(directions))]
        back = self._solve([{n: pe[n] - hg[n] for n in heads} for pe, hg in zip(products_e, head_g)])  # A⁻¹[∇²Φw̃]_h
        results = [{n: pe[n] for n in thetas} for pe in products_e]  # the θ-part of ∇²D_E w̃, made the result
        del products_e
        # ∂²_θh F v = φ'ᵀ c and the curvature of ⟨c, φ(θ)⟩ along w, plus the cotangents
        # y = d/ds ∇_φ g + ∂²_φh f A⁻¹[∇²Φw̃]_h pulled back (φ'ᵀ y): one pass per direction.
        cotangents = [[t[k][0] + side.back(z) for k, z in enumerate(back)] for side, t in zip(sides, thirds)]
        del thirds
        lifted = [{**w, **{_Pulled.key(j): c[k] for j, c in enumerate(cotangents)}} for k, w in enumerate(directions)]
        pulled_c, curved = self._backbone(sides).gradient_and_products(lifted)
        gradient = {n: gradient_e[n] - pulled_c[n] for n in thetas}
        for result, c in zip(results, curved):
            for n in thetas:
                result[n].sub_(c.pop(n))
        return gradient, results

    def _backbone(self, sides: list[_HeadSide]) -> Curvature:
        """``θ ↦ Σ_j ⟨c_j, φ_j(θ)⟩`` over the fit chunks, each ``c_j`` a parameter of its own
        (:class:`_Pulled`): its gradient's θ-part is ``φ'ᵀ c``, and its product along ``(w, y)`` has
        the θ-part ``∇²_θθ⟨c, φ⟩ w + φ'ᵀ y``."""
        cotangents = {_Pulled.key(j): side.cotangent() for j, side in enumerate(sides)}
        # This process's chunks only (their cotangents are its own); the θ-parts are summed after.
        return _ThetaPart(Curvature([_Pulled(side.chunk, _Pulled.key(j)) for j, side in enumerate(sides)],
                                    {**self.shared, **cotangents}, self.method, total=1), self)


class _ThetaPart:
    """A :class:`Curvature` over ``θ`` and this process's cotangents, answering with the θ-parts
    summed over the processes (and telling the method it used to the :class:`RefitCurvature`)."""

    def __init__(self, curvature: Curvature, owner: RefitCurvature):
        self.curvature, self.owner = curvature, owner

    def gradient_and_products(self, directions: list[Params]) -> tuple[Params, list[Params]]:
        thetas = self.owner.shared
        if directions:
            # Directions carry no cotangent for the chunks another process holds: zero there.
            directions = [{**{n: torch.zeros_like(t) for n, t in self.curvature.shared.items()}, **d}
                          for d in directions]
        gradient, products = self.curvature.gradient_and_products(directions)
        self.owner.method = self.curvature.method
        return self.owner.group.all_reduce_sum(({n: gradient[n] for n in thetas},
                                                [{n: p[n] for n in thetas} for p in products]))


class _Pulled:
    """``(θ, c) ↦ ⟨c, φ(θ)⟩`` for one fit chunk, its cotangent ``c`` a parameter named :meth:`key`,
    as a one-example loss for :class:`Curvature`: its gradient in θ is ``φ'ᵀ c``, and the θ-part
    of its product along ``(w, y)`` is ``d/ds φ'(θ + s w)ᵀ (c + s y) = ∇²_θθ⟨c, φ⟩ w + φ'ᵀ y``."""

    batch_size = 1

    def __init__(self, chunk: FeatureChunk, key: str):
        self.chunk, self.name = chunk, key

    @staticmethod
    def key(index: int) -> str:
        return f"\0cotangent{index}"  # no parameter's name

    def __call__(self, params: Params) -> torch.Tensor:
        shared = {n: t for n, t in params.items() if not n.startswith("\0")}
        return (params[self.name] * self.chunk.features(shared)).sum().reshape(1)


class _HeadSide:
    """One fit chunk's derivatives on the head and the features, at ``(φ, h*)`` (all cheap: no
    backbone pass). ``g(φ, h) = ⟨∂_h f(φ, h), v⟩``."""

    def __init__(self, chunk: FeatureChunk, features: torch.Tensor, head: Params, v: Params):
        self.chunk, self.phi, self.head, self.v = chunk, features, head, v

    def _g(self, phi: torch.Tensor, head: Params) -> torch.Tensor:
        return jvp(lambda h: self.chunk.loss(phi, h), (head,), (self.v,))[1]

    def cotangent(self) -> torch.Tensor:
        """``∂_φ g``: pulled back through the backbone it is ``∂²_θh F v``."""
        return torch.func.grad(self._g, argnums=0)(self.phi, self.head)

    def mixed(self, moved: torch.Tensor) -> Params:
        """``∂²_hθ F w = d/ds ∂_h f(φ + s φ'w, h)`` (``moved``: ``φ' w``)."""
        return jvp(lambda phi: torch.func.grad(lambda h: self.chunk.loss(phi, h))(self.head), (self.phi,), (moved,))[1]

    def third(self, moved: torch.Tensor, jw: Params) -> tuple[torch.Tensor, Params]:
        """``d/ds ∇_(φ,h) g`` along ``(φ'w, J w)``: a cotangent for the backbone and the head part
        of ``G``'s curvature along the lifted direction (the third derivative of ``f``)."""
        return jvp(torch.func.grad(self._g, argnums=(0, 1)), (self.phi, self.head), (moved, jw))[1]

    def back(self, z: Params) -> torch.Tensor:
        """``∂²_φh f z``: pulled back through the backbone it is ``∂²_θh F z`` (for ``Jᵀ``)."""
        return jvp(lambda h: torch.func.grad(self.chunk.loss, argnums=0)(self.phi, h), (self.head,), (z,))[1]


def _sum_params(parts: list[Any], like: dict[Any, Any]) -> Any:
    """The sum of ``parts``, each a dict with ``like``'s keys (tensors, or dicts of tensors)."""
    total = parts[0] if parts else {n: torch.zeros_like(t) for n, t in like.items()}
    for part in parts[1:]:
        total = {n: (_sum_params([total[n], part[n]], {}) if isinstance(part[n], dict) else total[n] + part[n])
                 for n in total}
    return total


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
        slope = self.group.all_reduce_sum(_flat(torch.func.grad(evaluation.total)(fit.head), list(self.head)))
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
