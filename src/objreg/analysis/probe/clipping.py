"""A loop that rescales its gradient by ``c`` before the step (gradient clipping) steps on
``Σ_k c α_k ∇ℓ_k``: the probe splits the step with the weights ``c α_k`` the optimizer's
``.grad`` holds (:func:`loop_weights`), and writes the record's counterfactual back in the
loop's own weights ``α_k`` (:func:`in_loop_weights`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from torch import nn

from objreg.analysis.math.functional import Params
from objreg.analysis.math.optimizers import stepped
from objreg.analysis.records import StepRecord
from objreg.core.errors import ProbeStateError


def loop_weights(weights: Mapping[str, float], gradients: Mapping[str, Params],
                 shared: Mapping[str, nn.Parameter]) -> dict[str, float]:
    """``c α_k``: ``c`` the least-squares scale of ``Σ_k α_k gradients[k]`` onto the ``.grad`` of
    the ``shared`` parameters (1 where it is not a number).

    Raises:
        ProbeStateError: no shared parameter has a ``.grad`` (called before the backward or after the step).
    """
    if not stepped(shared):
        raise ProbeStateError("measure() reads the step's gradient: call it after the backward and before "
                              "optimizer.step() (no shared parameter has a .grad)")
    mix = {n: sum(weights[k] * gradients[k][n] for k in gradients) for n in shared}
    names = stepped(shared)
    norm = float(sum((mix[n] * mix[n]).sum() for n in names))
    scale = float(sum((shared[n].grad * mix[n]).sum() for n in names)) / norm if norm > 0 else 1.0
    if not math.isfinite(scale):
        scale = 1.0
    return {k: scale * w for k, w in weights.items()}


def in_loop_weights(record: StepRecord, weights: Mapping[str, float], stepped: Mapping[str, float]) -> None:
    """The counterfactual's weight vectors in the loop's own weights: the split used ``c·α``
    where the loop rescaled its gradient (clipping), and so did the stencil."""
    if "counterfactual" not in record:
        return
    scale = next((weights[k] / stepped[k] for k in weights if stepped[k]), 1.0)
    if scale != 1.0:
        for point in [*record["counterfactual"]["points"], *record["counterfactual"]["grid"]]:
            point["weights"] = {k: scale * w for k, w in point["weights"].items()}
