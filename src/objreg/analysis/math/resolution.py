"""How finely ``D`` itself is resolved: the noise of one evaluation, measured once per run.

``D`` is evaluated in float64 (:mod:`objreg.analysis.math.downstream`), and the rounding floor of
the Taylor comparison (:func:`objreg.analysis.math.taylor.rounding_floor`) assumed float64's
resolution, ``2⁻⁵³ |D|``. Some models do not honour a float64 copy: Hugging Face's T5 and Llama
compute their RMSNorm (and Llama its softmax) in float32 whatever the parameters' dtype, so their
``D`` moves in float32 steps, about ``1e-8`` and ``5e-10`` of it, seven to eight orders above
the assumed floor. :func:`downstream_resolution` measures it: ``D`` at ``POINTS`` points
``θ + ε_j v`` along a random unit direction ``v`` (from the ``resolution`` random stream) with
``ε_j`` evenly spaced up to ``SCALE × ‖θ‖`` (each coordinate moves about ``SCALE`` of its own
size, far above float32's resolution, so float32 internals round differently at every point),
a cubic in ``ε`` fitted through them (``D`` is smooth there: the cubic takes the Taylor terms),
and the residual's standard deviation is the resolution of one evaluation.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from objreg.analysis.math.downstream import Downstream
from objreg.analysis.math.functional import detached, flat_norm, named_shared

POINTS = 10
SCALE = 1e-6
DEGREE = 3


@torch.no_grad()
def downstream_resolution(downstream: Downstream, model: nn.Module, generator: torch.Generator) -> float:
    """The standard deviation of one evaluation of ``D``'s rounding, near the model's parameters
    (module docstring). Every process calls it together (``D`` is summed over their chunks)."""
    evaluated = downstream.evaluation_model(model)
    shared = detached(named_shared(evaluated, downstream.shared))
    direction = {n: torch.randn(t.shape, generator=generator, dtype=torch.float64).to(t) for n, t in shared.items()}
    length = float(flat_norm(direction))
    reach = SCALE * float(flat_norm(shared))
    if length == 0 or reach == 0:
        return 0.0
    steps = np.linspace(0.0, 1.0, POINTS)
    values = []
    functions = downstream.functions(evaluated)
    like = next(iter(shared.values()))
    for step in steps:
        point = {n: t + (step * reach / length) * direction[n] for n, t in shared.items()}
        total = sum((f(point).sum() for f in functions), torch.zeros((), dtype=like.dtype, device=like.device))
        values.append(float(downstream.group.all_reduce_sum(total)) / downstream.size)
    values = np.array(values) - values[0]
    residual = values - np.polyval(np.polyfit(steps, values, DEGREE), steps)
    return math.sqrt(float(residual @ residual) / (POINTS - DEGREE - 1))
