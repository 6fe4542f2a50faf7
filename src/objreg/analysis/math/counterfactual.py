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
them (:func:`objreg.analysis.math.mixture.step_model`): exact at the stencil's points (to the Taylor
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


def stencil(weights: Mapping[str, float], names: Sequence[str], radius: float) -> list[dict[str, float]]:
    """The weight vectors the probe evaluates the exact counterfactual at: for every pair
    ``a, b`` of objectives, weight moved from ``b`` to ``a`` and from ``a`` to ``b`` by
    ``radius × Σα`` (the total held), or as far as keeps both weights ≥ 0; where one direction
    is closed (a weight at 0), two points on the open side (half way and all the way).
    ``K(K−1)`` points for ``K`` objectives, enough for a quadratic in the ``K−1`` free directions."""
    total = sum(float(weights[n]) for n in names)
    reach = radius * total
    points = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            up, down = min(reach, float(weights[b])), min(reach, float(weights[a]))  # a gains, a loses
            if up > 0 and down > 0:
                moves = [up, -down]
            elif up > 0:
                moves = [up / 2, up]
            elif down > 0:
                moves = [-down / 2, -down]
            else:
                moves = []
            for move in moves:
                point = {n: float(weights[n]) for n in names}
                point[a] += move
                point[b] -= move
                points.append(point)
    return points
