"""The optimizers the analysis trains with, and the step each takes, split into its parts.

The Taylor prediction needs the update ``Δθ`` the optimizer actually takes, split per objective.
:func:`decompose` computes that split *before* the step, from the accumulated gradient and the
optimizer's state, without touching either; after the step the probe records how far the parts
are from the ``Δθ`` it reads off the parameters (``decomposition_residual``).

* **SGD** (no momentum, no weight decay): ``Δθ = −η Σ_k α_k g_k``; objective ``k``'s part is
  ``−η α_k g_k``.
* **Adam / AdamW** (PyTorch's update rule): with ``G = Σ_k α_k g_k`` (plus ``λθ`` for Adam's
  coupled weight decay), ``v_t = β₂ v_{t−1} + (1−β₂) G²`` and the *current* preconditioner
  ``P = 1 / (√(v_t / (1−β₂ᵗ)) + ε)`` (elementwise, after this step's ``G`` entered ``v_t``),

      Δθ = −η/(1−β₁ᵗ) · P ⊙ (β₁ m_{t−1} + (1−β₁) G)  [− η λ θ for AdamW]

  which is linear in ``G`` once ``P`` is fixed. Objective ``k``'s part is
  ``−η (1−β₁)/(1−β₁ᵗ) · P ⊙ α_k g_k``; the carry-over of earlier gradients, ``−η β₁/(1−β₁ᵗ) ·
  P ⊙ m_{t−1}``, is the ``momentum`` part; AdamW's decoupled decay ``−η λ θ`` (or Adam's coupled
  ``λθ`` term pushed through ``P``) is the ``weight_decay`` part. ``P`` depends on all objectives'
  gradients together, so the split is exact for this step but is not what each objective would do
  alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from objreg.analysis.functional import Params
from objreg.core.errors import InvalidParameterError

MOMENTUM = "momentum"
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


@dataclass
class StepDecomposition:
    """The step about to be taken, as ``Δθ = Σ_k −A(α_k g_k) + Σ_e extras[e]`` on the shared
    parameters, where ``A`` is a fixed positive diagonal map (``η I`` for SGD).

    Attributes:
        scale: ``A`` as one number when it is a multiple of the identity (SGD), else None.
        diagonal: ``A`` per parameter when it is not (Adam/AdamW), else None.
        extras: The parts not owed to this step's gradients (momentum, weight decay), as
            displacements.
        rule: One line saying how the step was split (recorded in the report).
    """

    scale: float | None
    diagonal: Params | None
    extras: dict[str, Params] = field(default_factory=dict)
    rule: str = ""

    def apply(self, v: Params) -> Params:
        """``A v``."""
        if self.diagonal is None:
            return {n: self.scale * t for n, t in v.items()}
        return {n: self.diagonal[n] * t for n, t in v.items()}

    def objective_part(self, weight: float, gradient: Params) -> Params:
        """The displacement ``−A(α_k g_k)`` owed to one objective."""
        return {n: -weight * t for n, t in self.apply(gradient).items()}


def decompose(optimizer: torch.optim.Optimizer, shared: Mapping[str, nn.Parameter]) -> StepDecomposition:
    """Split the step ``optimizer`` is about to take on ``shared``, reading (never changing) its
    state and the parameters' accumulated ``.grad``.

    Raises:
        InvalidParameterError: an optimizer or setting whose step this does not model.
    """
    group = _group_of(optimizer, shared)
    if isinstance(optimizer, torch.optim.SGD):
        if group["momentum"] or group["weight_decay"] or group.get("maximize"):
            raise InvalidParameterError("the analysis models plain SGD only (no momentum, weight decay or maximize)")
        lr = float(group["lr"])
        return StepDecomposition(scale=lr, diagonal=None, rule=f"sgd: Δθ = −η Σ_k α_k g_k with η = {lr:g}; "
                                 "objective k's part is −η α_k g_k (exact)")
    if isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        return _decompose_adam(optimizer, group, shared)
    raise InvalidParameterError(f"the analysis cannot split the step of {type(optimizer).__name__}; use sgd, adam or adamw")


def _group_of(optimizer: torch.optim.Optimizer, shared: Mapping[str, nn.Parameter]) -> dict:
    ids = {id(p) for p in shared.values()}
    groups = [g for g in optimizer.param_groups if ids & {id(p) for p in g["params"]}]
    if len(groups) != 1:
        raise InvalidParameterError("the shared parameters must lie in exactly one optimizer parameter group")
    return groups[0]


def _decompose_adam(optimizer: torch.optim.Optimizer, group: dict, shared: Mapping[str, nn.Parameter]) -> StepDecomposition:
    if group.get("amsgrad") or group.get("maximize"):
        raise InvalidParameterError("the analysis models Adam/AdamW without amsgrad or maximize")
    decoupled = isinstance(optimizer, torch.optim.AdamW) or bool(group.get("decoupled_weight_decay"))
    lr, eps, decay = float(group["lr"]), float(group["eps"]), float(group["weight_decay"])
    beta1, beta2 = (float(b) for b in group["betas"])
    diagonal: Params = {}
    momentum: Params = {}
    weight_decay: Params = {}
    for name, p in shared.items():
        state = optimizer.state.get(p, {})
        step = float(state["step"]) + 1 if "step" in state else 1.0
        gradient = p.grad.detach() if p.grad is not None else torch.zeros_like(p)
        theta = p.detach()
        if decay and not decoupled:
            gradient = gradient + decay * theta
        v_prev = state.get("exp_avg_sq", torch.zeros_like(p))
        m_prev = state.get("exp_avg", torch.zeros_like(p))
        v = beta2 * v_prev + (1 - beta2) * gradient * gradient
        bias1, bias2 = 1 - beta1**step, 1 - beta2**step
        preconditioner = 1.0 / (v.sqrt() / bias2**0.5 + eps)
        diagonal[name] = lr * (1 - beta1) / bias1 * preconditioner
        momentum[name] = -lr * beta1 / bias1 * preconditioner * m_prev
        if decay:
            # AdamW shrinks θ by (1 − ηλ) before its step; Adam adds λθ to the gradient, so that
            # part goes through the same preconditioner as the objectives' gradients.
            weight_decay[name] = -lr * decay * theta if decoupled else -diagonal[name] * decay * theta
    extras = {}
    if beta1 > 0 and any("exp_avg" in optimizer.state.get(p, {}) for p in shared.values()):
        extras[MOMENTUM] = momentum
    if decay:
        extras[WEIGHT_DECAY] = weight_decay
    label = "adamw" if decoupled else "adam"
    wd_text = (f" − η λ θ (decoupled, λ = {decay:g})" if decoupled else f" with λθ (λ = {decay:g}) added to G") if decay else ""
    rule = (
        f"{label}: Δθ = −η/(1−β₁ᵗ) · P ⊙ (β₁ m_(t−1) + (1−β₁) Σ_k α_k g_k){wd_text}, η = {lr:g}, "
        f"β = ({beta1:g}, {beta2:g}), ε = {eps:g}, P = 1/(√(v_t/(1−β₂ᵗ)) + ε) the preconditioner after this "
        f"step's gradient; objective k's part is −η (1−β₁)/(1−β₁ᵗ) P ⊙ α_k g_k, the momentum part carries "
        f"m_(t−1), the weight_decay part is the decay (exact for this step; P couples the objectives)"
    )
    return StepDecomposition(scale=None, diagonal=diagonal, extras=extras, rule=rule)
