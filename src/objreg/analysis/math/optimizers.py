"""The optimizers the analysis trains with, and the step each takes, split into its parts.

The Taylor prediction needs the update ``Δθ`` the optimizer actually takes, split per objective.
:func:`decompose` computes that split *before* the step, from the objectives' gradients, the
optimizer's state and the coalition moments (:mod:`objreg.analysis.math.shapley`), without changing
the optimizer; after the step the probe records how far the parts are from the ``Δθ`` it reads
off the parameters (``decomposition_residual``).

* **SGD** (no momentum, no weight decay): ``Δθ = −η Σ_k α_k g_k``; objective ``k``'s part is
  ``−η α_k g_k`` (linear: nothing to choose).
* **Adam / AdamW** (PyTorch's update rule): with ``G = Σ_k α_k g_k`` (plus ``λθ`` for Adam's
  coupled weight decay), ``m_t = β₁ m_{t−1} + (1−β₁) G``, ``v_t = β₂ v_{t−1} + (1−β₂) G²``,

      Δθ = −η/(1−β₁ᵗ) · m_t / (√(v_t/(1−β₂ᵗ)) + ε)  [− η λ θ for AdamW]

  The bracketed decoupled decay is its own part, ``weight_decay``. The rest, ``u_N``, is split
  into the objectives' Shapley values over coalitions that each keep their own Adam moments
  (:class:`~objreg.analysis.math.shapley.CoalitionMoments`, advanced every step by :func:`advance`):
  exact, bounded where gradients cancel, and momentum goes to the objectives whose past
  gradients built it. Adam's coupled decay ``λθ`` is one more player, ``weight_decay``.
  Per-example scores still need a linear map of one example's gradient into the step: the
  *fresh-gradient* map ``A = η (1−β₁)/(1−β₁ᵗ) · P`` with ``P = 1/(√v̂_t + ε)`` (``diagonal``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from objreg.analysis.math.functional import Params
from objreg.analysis.math.shapley import CoalitionMoments
from objreg.core.errors import InvalidParameterError

WEIGHT_DECAY = "weight_decay"


def make_optimizer(name: str, params: list[nn.Parameter], lr: float) -> torch.optim.Optimizer:
    """``sgd`` (plain), ``adam`` or ``adamw`` with PyTorch's defaults (AdamW: weight decay 0.01)."""
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr)
    raise InvalidParameterError(f"optimizer must be one of sgd, adam, adamw, got {name!r}")


@dataclass(frozen=True)
class AdamSettings:
    """The hyperparameters of an Adam/AdamW parameter group that its step depends on."""

    lr: float
    beta1: float
    beta2: float
    eps: float
    decay: float
    decoupled: bool

    @property
    def coupled_decay(self) -> bool:
        return bool(self.decay) and not self.decoupled


@dataclass
class StepDecomposition:
    """The step about to be taken, split into parts on the shared parameters:
    ``Δθ = Σ_c parts[c]``.

    Attributes:
        parts: Every part: one per objective, plus ``weight_decay`` where there is decay.
        scale: SGD's ``η`` (the map of a gradient into the step, ``−η``), else None.
        diagonal: Adam's fresh-gradient map ``A`` per parameter (``Δθ`` would change by ``−A δg``
            if this step's gradient changed by ``δg`` with ``P`` held fixed), else None. Used for
            per-example scores only.
        rule: One line saying how the step was split (recorded in the report).
        attribution: ``linear`` (SGD), ``shapley`` or ``shapley_sampled`` (more than
            :data:`~objreg.analysis.math.shapley.MAX_EXACT_PLAYERS` players).
    """

    parts: dict[str, Params]
    scale: float | None
    diagonal: Params | None
    rule: str = ""
    attribution: str = "linear"

    def apply(self, v: Params) -> Params:
        """``A v``: the fresh-gradient map applied to ``v``."""
        if self.diagonal is None:
            return {n: self.scale * t for n, t in v.items()}
        return {n: self.diagonal[n] * t for n, t in v.items()}


#: The settings a step depends on: parameter groups that agree on them take the same step.
STEP_SETTINGS = ("lr", "betas", "eps", "weight_decay", "momentum", "dampening", "nesterov", "amsgrad", "maximize",
                 "decoupled_weight_decay")


def shared_group(optimizer: torch.optim.Optimizer, shared: Mapping[str, nn.Parameter]) -> dict:
    """The parameter group of the shared parameters; several groups (a loop's decay and no-decay
    groups, say) only where they agree on every setting the step depends on."""
    ids = {id(p) for p in shared.values()}
    groups = [g for g in optimizer.param_groups if ids & {id(p) for p in g["params"]}]
    if not groups:
        raise InvalidParameterError("the optimizer holds none of the shared parameters")
    settings = {tuple(repr(g.get(k)) for k in STEP_SETTINGS) for g in groups}
    if len(settings) != 1:
        raise InvalidParameterError("the shared parameters must lie in optimizer parameter groups with the same "
                                    f"settings ({', '.join(STEP_SETTINGS)}); found {len(settings)} different ones")
    return groups[0]


def adam_settings(optimizer: torch.optim.Optimizer, shared: Mapping[str, nn.Parameter]) -> AdamSettings | None:
    """The Adam/AdamW hyperparameters of the shared parameters' group; None for SGD.

    Raises:
        InvalidParameterError: an optimizer or setting whose step this does not model.
    """
    group = shared_group(optimizer, shared)
    if isinstance(optimizer, torch.optim.SGD):
        if group["momentum"] or group["weight_decay"] or group.get("maximize"):
            raise InvalidParameterError("the analysis models plain SGD only (no momentum, weight decay or maximize)")
        return None
    if isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        if group.get("amsgrad") or group.get("maximize"):
            raise InvalidParameterError("the analysis models Adam/AdamW without amsgrad or maximize")
        decoupled = isinstance(optimizer, torch.optim.AdamW) or bool(group.get("decoupled_weight_decay"))
        beta1, beta2 = (float(b) for b in group["betas"])
        return AdamSettings(float(group["lr"]), beta1, beta2, float(group["eps"]), float(group["weight_decay"]),
                            decoupled)
    raise InvalidParameterError(f"the analysis cannot split the step of {type(optimizer).__name__}; use sgd, adam or adamw")


def players(objectives: Sequence[str], settings: AdamSettings | None) -> list[str]:
    """Who shares Adam's step: the objectives, and the coupled weight decay where there is one."""
    return [*objectives, *([WEIGHT_DECAY] if settings is not None and settings.coupled_decay else [])]


def contributions(
    weights: Mapping[str, float], gradients: Mapping[str, Params], shared: Mapping[str, nn.Parameter],
    settings: AdamSettings | None,
) -> dict[str, Params]:
    """Each player's share of the gradient the optimizer steps on: ``α_k g_k`` (and ``λθ``)."""
    out = {k: {n: weights[k] * t for n, t in g.items()} for k, g in gradients.items()}
    if settings is not None and settings.coupled_decay:
        out[WEIGHT_DECAY] = {n: settings.decay * p.detach() for n, p in shared.items()}
    return out


def stepped(shared: Mapping[str, nn.Parameter]) -> list[str]:
    """The shared parameters the optimizer updates this step (PyTorch skips those without a gradient)."""
    return [n for n, p in shared.items() if p.grad is not None]


def advance(
    coalitions: CoalitionMoments, optimizer: torch.optim.Optimizer, shared: Mapping[str, nn.Parameter],
    weights: Mapping[str, float], gradients: Mapping[str, Params],
) -> None:
    """Take this step's gradients into the coalition moments (every step, before the optimizer's)."""
    settings = adam_settings(optimizer, shared)
    if settings is None:
        return
    coalitions.advance(contributions(weights, gradients, shared, settings), stepped(shared), settings.beta1,
                       settings.beta2)


def decompose(
    optimizer: torch.optim.Optimizer, shared: Mapping[str, nn.Parameter], weights: Mapping[str, float],
    gradients: Mapping[str, Params], coalitions: CoalitionMoments | None = None,
) -> StepDecomposition:
    """Split the step ``optimizer`` is about to take on ``shared``, reading (never changing) its
    state and the parameters' accumulated ``.grad``. ``gradients``: each objective's ``g_k``
    (``Σ_k α_k g_k`` is what ``.grad`` holds on ``shared``); ``coalitions``: the coalition
    moments, already advanced with this step's gradients (Adam only).

    Raises:
        InvalidParameterError: an optimizer or setting whose step this does not model.
    """
    settings = adam_settings(optimizer, shared)
    if settings is None:
        lr = float(shared_group(optimizer, shared)["lr"])
        parts = {k: {n: -lr * weights[k] * t for n, t in g.items()} for k, g in gradients.items()}
        rule = f"sgd: Δθ = −η Σ_k α_k g_k with η = {lr:g}; objective k's part is −η α_k g_k (exact, linear)"
        return StepDecomposition(parts, scale=lr, diagonal=None, rule=rule)
    if coalitions is None:
        raise InvalidParameterError("splitting an Adam step needs the coalition moments tracked from the start")
    return _decompose_adam(optimizer, shared, settings, coalitions)


def _decompose_adam(
    optimizer: torch.optim.Optimizer, shared: Mapping[str, nn.Parameter], s: AdamSettings,
    coalitions: CoalitionMoments,
) -> StepDecomposition:
    diagonal: Params = {}
    full: Params = {}
    weight_decay: Params = {}
    active = set(stepped(shared))
    for name, p in shared.items():
        if name not in active:  # PyTorch leaves a parameter without a gradient alone, decay included
            diagonal[name] = full[name] = weight_decay[name] = torch.zeros_like(p)
            continue
        state = optimizer.state.get(p, {})
        step = float(state["step"]) + 1 if "step" in state else 1.0
        theta = p.detach()
        gradient = p.grad.detach() + (s.decay * theta if s.coupled_decay else 0.0)
        m = s.beta1 * state.get("exp_avg", torch.zeros_like(p)) + (1 - s.beta1) * gradient
        v = s.beta2 * state.get("exp_avg_sq", torch.zeros_like(p)) + (1 - s.beta2) * gradient * gradient
        bias1, bias2 = 1 - s.beta1**step, 1 - s.beta2**step
        preconditioner = 1.0 / (v.sqrt() / math.sqrt(bias2) + s.eps)
        diagonal[name] = s.lr * (1 - s.beta1) / bias1 * preconditioner
        full[name] = -s.lr / bias1 * preconditioner * m
        # AdamW shrinks θ by (1 − ηλ) before its step: a part of its own.
        weight_decay[name] = -s.lr * s.decay * theta if s.decay and s.decoupled else torch.zeros_like(p)
    parts = coalitions.shapley(full, s.lr, s.beta1, s.beta2, s.eps)
    for part in parts.values():
        for name in part:
            if name not in active:
                part[name] = torch.zeros_like(part[name])
    if s.decay and s.decoupled:
        parts[WEIGHT_DECAY] = weight_decay
    label = "adamw" if s.decoupled else "adam"
    wd_text = (f" − η λ θ (decoupled, λ = {s.decay:g}: the weight_decay part)" if s.decoupled
               else f", λθ added to G (λ = {s.decay:g}: the weight_decay player)") if s.decay else ""
    rule = (
        f"{label}: Δθ = −η/(1−β₁ᵗ) · m_t/(√(v_t/(1−β₂ᵗ)) + ε){wd_text}, η = {s.lr:g}, β = ({s.beta1:g}, "
        f"{s.beta2:g}), ε = {s.eps:g}; each objective's part is its Shapley value over coalitions of objectives, "
        f"each coalition stepping with its own Adam moments built from its members' gradients since step 0 "
        f"({coalitions.description}); momentum goes to the objectives whose gradients built it; the parts add up "
        f"to the step"
    )
    return StepDecomposition(parts, scale=None, diagonal=diagonal, rule=rule,
                             attribution="shapley" if coalitions.exact else "shapley_sampled")
