"""The exact derivatives of the re-fitted head's downstream loss ``D*(θ) = D_E(θ, h*(θ))``
(:class:`RefitCurvature`; the loss itself and the fit: :mod:`objreg.analysis.math.refit`).

* **The gradient** by implicit differentiation (``A = ∂²_hh F``, positive definite):
  ``∇θD* = ∂θD_E − ∂²_θh F · v``, ``v = A⁻¹ ∂_h D_E``: one head-sized solve and one mixed
  Hessian-vector product of ``F``.
* **The Hessian.** With ``J = dh*/dθ = −A⁻¹ ∂²_hθ F`` and ``Φ(θ, h) = D_E(θ, h) − ⟨∂_h F(θ, h), v⟩``
  (``v`` held fixed), ``uᵀ ∇²D* w = ũᵀ ∇²Φ w̃`` along the lifted directions ``ũ = (u, J u)``
  (docs/analysis.md derives it: ``Φ`` is ``D*`` plus a multiple of the fit's stationarity
  condition, so its second derivative along the manifold of optima is ``D*``'s). As a vector,
  ``∇²D* w = [∇²Φ w̃]_θ + Jᵀ [∇²Φ w̃]_h``, ``Jᵀ y = −∂²_θh F · A⁻¹ y``. Each direction costs a
  mixed product of ``F`` (for ``J w``), a product of ``Φ`` (of ``D_E``, and a third derivative of
  ``F``), and a mixed product of ``F`` again (for ``Jᵀ``); the probe uses it as it uses
  :class:`~objreg.analysis.math.curvature.Curvature` for a frozen head.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, jvp

from objreg.analysis.math.curvature import Curvature
from objreg.analysis.math.functional import ObjectiveFunction, Params
from objreg.analysis.math.head_fit import HeadLoss, flattened, solve, unflattened
from objreg.analysis.parallel.group import Group
from objreg.core.handles import Task


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
        self._encode, self._loss = _Encode(model), HeadLoss(model, task)
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

    def _run(self, functions: list[Any], rows: int, directions: list[Params],
             against: list[list[Params]] | None = None, keep: Collection[str] = ()
             ) -> tuple[Params, torch.Tensor, list[Params]]:
        """A pass over ``functions`` at ``(θ, h*)``: the gradient, the products' dots with
        ``against`` (none by default) and their entries named in ``keep``."""
        curvature = Curvature(functions, self.point, self.method, total=rows, group=self.group)
        result = curvature.gradient_and_dots(directions, against or [[] for _ in directions], keep)
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
        stacked = torch.stack([flattened(c, list(self.head)) for c in columns], dim=1)
        solved = solve(self.hessian, stacked.double())
        like = self.head
        return [{n: t.to(like[n].dtype) for n, t in unflattened(solved[:, i], like).items()} for i in range(len(columns))]

    def gradient_and_products(self, directions: list[Params]) -> tuple[Params, list[Params]]:
        """``∇D*`` and ``[∇²D* w for w in directions]`` (on the backbone's shared parameters)."""
        gradient, _, products = self.gradient_and_dots(directions, [[] for _ in directions], keep=list(self.shared))
        return gradient, products

    def gradient_and_dots(self, directions: list[Params], against: list[list[Params]], keep: Collection[str] = ()
                          ) -> tuple[Params, torch.Tensor, list[Params]]:
        """``∇D*``, the dots ``⟨a, ∇²D* w_k⟩`` for every ``a`` in ``against[k]`` (float64 ``[k, j]``;
        ``a`` names backbone parameters) and the products' entries named in ``keep`` (backbone
        names): as :meth:`Curvature.gradient_and_dots`, no whole product is held where ``keep`` is empty."""
        if self.fit and isinstance(self.fit[0], FeatureChunk):
            result = self._feature_products(directions, against, list(keep))
        else:
            result = self._joint_products(directions, against, list(keep))
        self.matvecs += len(directions)
        return result

    def matvec(self, direction: Params) -> Params:
        """``∇²D* w`` for one direction."""
        return self.gradient_and_products([direction])[1][0]

    # -- a plain loss function: every derivative of F through the whole model ---------------------

    def _joint_products(self, directions: list[Params], against: list[list[Params]], keep: list[str]
                        ) -> tuple[Params, torch.Tensor, list[Params]]:
        thetas, heads = list(self.shared), list(self.head)
        # J w = −A⁻¹ ∂²_hθ F w for every direction.
        _, _, mixed = self._run(self.fit, self.fit_rows, [self._lift(w) for w in directions], keep=heads)
        lifts = self._solve([{n: -m[n] for n in heads} for m in mixed])
        lifted = [self._lift(w, j) for w, j in zip(directions, lifts)]
        # ∂D_E and ∂²D_E along the lifted directions; v = A⁻¹ ∂_h D_E.
        gradient_e, dots_e, kept_e = self._run(self.evaluation, self.eval_rows, lifted, against, heads + keep)
        (v,) = self._solve([{n: gradient_e[n] for n in heads}])
        tangent = self._lift(self._zeros(self.shared), v)
        # G = ⟨∂_h F, v⟩: its gradient's θ-part is ∂²_θh F v, its products the third derivative.
        directional = [Directional(f, tangent) for f in self.fit]
        gradient_g, dots_g, kept_g = self._run(directional, self.fit_rows, lifted, against, heads + keep)
        gradient = {n: gradient_e[n] - gradient_g[n] for n in thetas}
        # ∇²D* w = [∇²Φ w̃]_θ + Jᵀ[∇²Φ w̃]_h, Jᵀ y = −∂²_θh F A⁻¹ y.
        phi = [{n: pe[n] - pg[n] for n in pe} for pe, pg in zip(kept_e, kept_g)]
        back = self._solve([{n: p[n] for n in heads} for p in phi])
        _, dots_t, transposed = self._run(self.fit, self.fit_rows,
                                          [self._lift(self._zeros(self.shared), b) for b in back], against, keep)
        return gradient, dots_e - dots_g - dots_t, [{n: p[n] - t[n] for n in keep} for p, t in zip(phi, transposed)]

    # -- an objreg task: derivatives of F on the head, the backbone only moves directions -----------

    def _feature_products(self, directions: list[Params], against: list[list[Params]], keep: list[str]
                          ) -> tuple[Params, torch.Tensor, list[Params]]:
        """The same quantities as :meth:`_joint_products`, with ``F = f(φ(θ), h)`` split at the
        head: the backbone is passed through over the fit set to move the directions into
        feature space (``φ' w``, forward mode) and, once more, for the curvature of ``⟨c, φ(θ)⟩``
        together with the pulled-back cotangents ``φ'ᵀ y`` (:class:`_Pulled`); everything else is
        taken on the head and the features (:class:`_HeadSide`)."""
        thetas, heads = list(self.shared), list(self.head)
        if self.eval_head_gradient is None or not directions:
            gradient_e, _, _ = self._run(self.evaluation, self.eval_rows, [])
            slope = flattened(gradient_e, heads)
        else:
            slope = self.eval_head_gradient
        (v,) = self._solve([unflattened(slope, self.head)])
        if not directions:
            with torch.no_grad():
                sides = [_HeadSide(chunk, chunk.features(self.shared), self.head, v) for chunk in self.fit]
            pulled_c, dots, _ = self._backbone(sides).gradient_and_dots([], [])
            return {n: gradient_e[n] - pulled_c[n] for n in thetas}, dots, []
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
        gradient_e, dots_e, kept_e = self._run(self.evaluation, self.eval_rows,
                                               [self._lift(w, j) for w, j in zip(directions, lifts)], against,
                                               heads + keep)
        thirds = [[side.third(m[k], jw) for k, jw in enumerate(lifts)] for side, m in zip(sides, moved)]
        del moved
        head_g = [self.group.all_reduce_sum(_sum_params([t[k][1] for t in thirds], self.head))
                  for k in range(len(directions))]
        back = self._solve([{n: pe[n] - hg[n] for n in heads} for pe, hg in zip(kept_e, head_g)])  # A⁻¹[∇²Φw̃]_h
        results = [{n: pe[n] for n in keep} for pe in kept_e]  # the kept θ-part of ∇²D_E w̃, made the result
        del kept_e
        # ∂²_θh F v = φ'ᵀ c and the curvature of ⟨c, φ(θ)⟩ along w, plus the cotangents
        # y = d/ds ∇_φ g + ∂²_φh f A⁻¹[∇²Φw̃]_h pulled back (φ'ᵀ y): one pass per direction.
        cotangents = [[t[k][0] + side.back(z) for k, z in enumerate(back)] for side, t in zip(sides, thirds)]
        del thirds
        lifted = [{**w, **{_Pulled.key(j): c[k] for j, c in enumerate(cotangents)}} for k, w in enumerate(directions)]
        pulled_c, dots_c, curved = self._backbone(sides).gradient_and_dots(lifted, against, keep)
        gradient = {n: gradient_e[n] - pulled_c[n] for n in thetas}
        for result, c in zip(results, curved):
            for n in keep:
                result[n].sub_(c.pop(n))
        return gradient, dots_e - dots_c, results

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

    def gradient_and_dots(self, directions: list[Params], against: list[list[Params]], keep: Collection[str] = ()
                          ) -> tuple[Params, torch.Tensor, list[Params]]:
        thetas = self.owner.shared
        if directions:
            # Directions carry no cotangent for the chunks another process holds: zero there.
            directions = [{**{n: torch.zeros_like(t) for n, t in self.curvature.shared.items()}, **d}
                          for d in directions]
        gradient, dots, kept = self.curvature.gradient_and_dots(directions, against, keep)
        self.owner.method = self.curvature.method
        return self.owner.group.all_reduce_sum(({n: gradient[n] for n in thetas}, dots, kept))


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
