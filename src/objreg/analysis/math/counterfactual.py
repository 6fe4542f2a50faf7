"""The exact one-step counterfactual of an Adam/AdamW step: the step the optimizer would have
taken with other objective weights, from the state it holds now.

Under SGD the step is linear in the weights, ``Δθ(α) = −η Σ_k α_k g_k``, and the record's ``c``
and ``S`` give the predicted change of ``D`` for any ``α`` exactly to second order
(:mod:`objreg.analysis.math.mixture`). Adam's step is not linear: the weights enter through
``G(α) = Σ_k α_k g_k`` (plus ``λθ`` for Adam's coupled decay), and then

    m′ = β₁ m_{t−1} + (1−β₁) G(α),   v′ = β₂ v_{t−1} + (1−β₂) G(α)²,
    Δθ(α) = −η/(1−β₁ᵗ) · m′ / (√(v′/(1−β₂ᵗ)) + ε)  [− η λ θ for AdamW]

with the optimizer's previous moments ``m_{t−1}``, ``v_{t−1}`` and step count: exactly the step
PyTorch would take (:class:`AdamCounterfactual`). The predicted change of ``D`` of that step is
``∇D·Δθ(α) + ½ Δθ(α)ᵀ H_D Δθ(α)``: one Hessian-vector product per weight vector.

A record cannot hold ``Δθ(α)`` for every ``α``, so the probe evaluates it at a small **stencil**
of weight vectors around the weights used (:func:`stencil`: for every pair of objectives, weight
moved from one to the other and back, by up to ``radius × Σα``, the total held) and records the
first- and second-order terms at each. The mixture model fits a quadratic in the weights through
them (:func:`objreg.analysis.math.weight_model.step_model`): exact at the stencil's points (to the Taylor
remainder in ``Δθ``), interpolated between them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
from torch import nn

from objreg.analysis.math.functional import Params
from objreg.analysis.math.optimizers import AdamSettings, stepped


class AdamCounterfactual:
    """The step an Adam/AdamW optimizer would take now with other weights (module docstring).

    Reads the optimizer's state and the parameters; changes neither.

    Args:
        optimizer: The Adam or AdamW optimizer, before its step.
        shared: The shared parameters, by name (those without ``.grad`` take no step, as in PyTorch).
        gradients: Each objective's mean-loss gradient ``g_k`` on ``shared``.
        settings: The optimizer's hyperparameters for ``shared``
            (:func:`~objreg.analysis.math.optimizers.adam_settings`).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, shared: Mapping[str, nn.Parameter],
                 gradients: Mapping[str, Params], settings: AdamSettings):
        self.settings = settings
        self.gradients = gradients
        self.active = set(stepped(shared))
        self.theta = {n: p.detach() for n, p in shared.items()}
        self.state: dict[str, tuple[torch.Tensor | None, torch.Tensor | None, float]] = {}
        for name, p in shared.items():
            state = optimizer.state.get(p, {})
            step = float(state["step"]) + 1 if "step" in state else 1.0
            self.state[name] = (state.get("exp_avg"), state.get("exp_avg_sq"), step)

    def step(self, weights: Mapping[str, float]) -> Params:
        """``Δθ(α)`` on every shared parameter for the weights ``α`` (keyed like ``gradients``)."""
        s = self.settings
        out: Params = {}
        for name, theta in self.theta.items():
            if name not in self.active:
                out[name] = torch.zeros_like(theta)
                continue
            gradient = torch.zeros_like(theta)
            for k, g in self.gradients.items():
                gradient = gradient + float(weights[k]) * g[name]
            if s.coupled_decay:
                gradient = gradient + s.decay * theta
            exp_avg, exp_avg_sq, step = self.state[name]
            m = (1 - s.beta1) * gradient if exp_avg is None else s.beta1 * exp_avg + (1 - s.beta1) * gradient
            v = ((1 - s.beta2) * gradient * gradient if exp_avg_sq is None
                 else s.beta2 * exp_avg_sq + (1 - s.beta2) * gradient * gradient)
            bias1, bias2 = 1 - s.beta1**step, 1 - s.beta2**step
            delta = -s.lr / bias1 * m / (v.sqrt() / math.sqrt(bias2) + s.eps)
            if s.decay and s.decoupled:
                delta = delta - s.lr * s.decay * theta
            out[name] = delta
        return out


#: Weight vectors per pair of objectives and side at which the first-order term is recorded.
GRID = 8


def _moves(weights: Mapping[str, float], a: str, b: str, reach: float, count: int) -> list[float]:
    """Moves of weight from ``b`` to ``a`` (negative: from ``a`` to ``b``) at ``j/count`` of the
    reach on each side, ``j = 1 … count``; a side is as long as keeps both weights ≥ 0."""
    up, down = min(reach, float(weights[b])), min(reach, float(weights[a]))
    return [*(up * j / count for j in range(1, count + 1) if up > 0),
            *(-down * j / count for j in range(1, count + 1) if down > 0)]


def _moved(weights: Mapping[str, float], names: Sequence[str], a: str, b: str, move: float) -> dict[str, float]:
    point = {n: float(weights[n]) for n in names}
    point[a] += move
    point[b] -= move
    return point


def stencil(weights: Mapping[str, float], names: Sequence[str], radius: float) -> list[dict[str, float]]:
    """The weight vectors where the probe takes the exact counterfactual to second order (one
    HVP each): for every pair ``a, b`` of objectives, weight moved from ``b`` to ``a`` and from
    ``a`` to ``b`` by ``radius × Σα`` (the total held), or as far as keeps both weights ≥ 0;
    where one direction is closed (a weight at 0), two points on the open side (half way and all
    the way). ``K(K−1)`` points for ``K`` objectives, enough for a quadratic in the ``K−1`` free
    directions."""
    reach = radius * sum(float(weights[n]) for n in names)
    points = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            moves = _moves(weights, a, b, reach, 1)
            if len(moves) == 1:  # one side open: half way too
                moves = [moves[0] / 2, moves[0]]
            points += [_moved(weights, names, a, b, move) for move in moves]
    return points


def grid(weights: Mapping[str, float], names: Sequence[str], radius: float, count: int = GRID
         ) -> list[dict[str, float]]:
    """The weight vectors where the probe takes the exact counterfactual's first-order term (no
    HVP: cheap): for every pair of objectives, weight moved between them in ``count`` even steps
    up to ``radius × Σα`` on each side (as far as keeps both weights ≥ 0). Adam's one-step change
    is rough in the weights (at the first step it is ``−η sign(G(α))``), so no quadratic passes
    through it; the run's optimum is chosen among these points, where its first order is exact."""
    reach = radius * sum(float(weights[n]) for n in names)
    return [_moved(weights, names, a, b, move) for i, a in enumerate(names) for b in names[i + 1:]
            for move in _moves(weights, a, b, reach, count)]
