"""Whether the step the probe split is the step the optimizer took.

The probe splits the step it expects from the gradients it is given or computes, the weights
and the optimizer's rule; after the step, ``Δθ`` is read off the parameters. Where the two
differ (the record's ``update.decomposition_residual``: ``‖Δθ − Σ_c d_c‖ / ‖Δθ‖``), every part,
first-order term and Shapley value describes a step that did not happen. A record is flagged
(``update.decomposition_flagged``) when the residual exceeds :data:`TOLERANCE` of the step plus
what rounding in the parameters' dtype can explain (:data:`ROUNDING` unit roundoffs of
``‖θ‖``), or when the probe saw the optimizer take other than one step between ``measure`` and
``finish``; the probe then warns once, naming what it saw and the usual causes
(:data:`LIKELY_CAUSES`), or raises in strict mode.
"""

from __future__ import annotations

import inspect
import math
from typing import Any

import torch

from objreg.analysis.math.functional import Params, flat_norm
from objreg.analysis.math.taylor import weighted_sum

#: A residual above this share of the step flags the record (plus the rounding floor below).
TOLERANCE = 1e-3
#: Unit roundoffs of ``‖θ‖`` a residual may reach by rounding alone (the step is read as a
#: difference of parameters stored in their own dtype).
ROUNDING = 4.0

LIKELY_CAUSES = (
    "the loop's loss uses other weights than the probe's (pass weights= the loop's α_k)",
    "measure() was given other batches than the step's (one micro-batch of several under gradient accumulation: "
    "hand it the whole step's batches)",
    "dropout or other train-mode randomness in the loop's backward (the probe measures in eval mode: pass "
    "gradients= the loop's own)",
    "an optimizer whose step() is not torch's SGD/Adam/AdamW step",
    "parameters changed, frozen or stepped outside the optimizer between measure() and finish()",
)


def overridden_step(optimizer: torch.optim.Optimizer) -> str | None:
    """A likely cause when ``optimizer``'s class replaces the ``step`` of the torch optimizer
    the probe models (SGD, Adam, AdamW); None when it runs torch's own."""
    for base in (torch.optim.AdamW, torch.optim.Adam, torch.optim.SGD):
        if isinstance(optimizer, base):
            if inspect.unwrap(type(optimizer).step) is not inspect.unwrap(base.step):
                return (f"{type(optimizer).__name__} overrides step(), and the probe splits the step of "
                        f"torch.optim.{base.__name__}")
            return None
    return None


def zero_grad_cause(grads: list[torch.Tensor], gradients: dict[str, Params]) -> str | None:
    """A cause when the optimizer's ``.grad`` is zero but the objectives' gradients are not."""
    if not grads or any(bool(g.ne(0).any()) for g in grads):
        return None
    if not any(float(flat_norm(g)) > 0 for g in gradients.values()):
        return None
    return ("the optimizer's .grad is zero on every shared parameter while the objectives' gradients are not "
            "(zero_grad() between the backward and measure()?)")


def gradient_cause(grads: dict[str, torch.Tensor], gradients: dict[str, Params], weights: dict[str, float]
                   ) -> str | None:
    """A cause when the optimizer's ``.grad`` is not (up to a factor, as clipping makes it) the
    weighted sum ``Σ_k α_k g_k`` of the objectives' gradients the split is built from: the loop
    weighted them otherwise, or stepped on other batches, or on gradients taken with dropout.
    Adam's split adds up to its step whatever the gradients (it reads ``.grad``), so only this
    shows its parts are of other gradients."""
    if not grads:
        return None
    mix = {n: sum(weights[k] * gradients[k][n] for k in gradients) for n in grads}
    norm = float(flat_norm(mix)) ** 2
    scale = sum(float((grads[n] * mix[n]).sum()) for n in grads) / norm if norm > 0 else 0.0
    residual = float(flat_norm({n: grads[n] - scale * mix[n] for n in grads}))
    size = float(flat_norm(grads))
    like = next(iter(grads.values()))
    unit = float(torch.finfo(like.dtype).eps) / 2
    terms = sum(abs(weights[k]) * float(flat_norm({n: g[n] for n in grads})) for k, g in gradients.items())
    if not math.isfinite(residual) or residual > TOLERANCE * size + ROUNDING * unit * terms * max(abs(scale), 1.0):
        return (f"the optimizer's .grad is not the weighted sum of the objectives' gradients the split is built from "
                f"(it misses it by {residual / size:.3g} of its norm)")
    return None


def steps_cause(steps: int) -> str | None:
    """A cause when ``steps`` optimizer steps, not one, were taken between measure and finish."""
    if steps == 1:
        return None
    return f"{steps} optimizer steps were taken between measure() and finish() (one expected)"


def residual_cause(before: Params, after: Params, parts: dict[str, Params]) -> str | None:
    """A cause when ``Δθ = after − before`` differs from the parts' sum beyond the tolerance."""
    total = weighted_sum(parts, before)
    residual = float(flat_norm({n: after[n] - before[n] - total[n] for n in before}))
    step = float(flat_norm({n: after[n] - before[n] for n in before}))
    like = next(iter(before.values()))
    unit = float(torch.finfo(like.dtype).eps) / 2
    if not math.isfinite(residual) or residual > TOLERANCE * step + ROUNDING * unit * float(flat_norm(before)):
        share = f"{residual / step:.3g} of the step" if step > 0 else f"{residual:.3g} while the parameters did not move"
        return f"the step's parts miss Δθ by {share} (tolerance {TOLERANCE:g} plus rounding)"
    return None


def mismatch_message(step: int, causes: list[str]) -> str:
    """The warning (or, in strict mode, the error) for a flagged record at ``step``."""
    return (f"TransferProbe: the split of step {step} does not describe the step the optimizer took: "
            f"{'; '.join(causes)}; the record is flagged (update.decomposition_flagged) and its parts, first-order "
            f"terms and Taylor prediction are of another step. Usual causes: {'; '.join(LIKELY_CAUSES)}")


def flagged(update: Any) -> Any:
    """``update`` with ``decomposition_flagged`` after ``decomposition_residual`` (the schema's order)."""
    out = {}
    for key, value in update.items():
        out[key] = value
        if key == "decomposition_residual":
            out["decomposition_flagged"] = True
    return out
