"""The screen's signals: what one candidate's short run says about how far it moves ``D*``.

The screen's run (:mod:`objreg.analysis.run.screen`) records, at every probe ``k`` (step ``s_k``):
``D*`` there, the gradient ``g`` of ``D*`` at ``θ_k``, the step ``Δθ`` the optimizer took, the
candidate's training gradient ``∇L`` on the backbone and, when asked (``second_order``), the
curvature term ``½ Δθᵀ ∇²D* Δθ``. :func:`signals` turns those into one number per signal, each
oriented so that higher predicts more transfer (a larger drop of ``D*``):

- ``score``: the mean over probes of ``−g·Δθ``, the first-order predicted drop per step (the
  screen's ranking signal; its batch-means interval is the entry's ``score``).
- ``lookahead``: the mean over probe intervals of the actual drop of ``D*`` per step,
  ``(D*_k − D*_{k+1}) / (s_{k+1} − s_k)`` (the last interval ends at the run's end); its
  batch-means interval is the entry's ``lookahead``.
- ``first_order_sum``: ``Σ_k −g_k·Δθ_k (s_{k+1} − s_k)``, the first-order prediction of
  ``D*₀ − D*`` at the run's end (each probe stands for the steps up to the next one).
- ``second_order_sum``: the same sum of ``−g·Δθ − ½ Δθᵀ∇²D*Δθ`` (only with ``second_order``).
- ``alignment``: the mean of ``g·∇L``, the raw gradient alignment (the drop plain SGD at
  learning rate 1 would predict, whatever the optimizer did).
- ``cosine``: the mean of ``cos(g, ∇L)`` (the alignment without either gradient's norm).
- ``step_cosine``: the mean of ``cos(−g, Δθ)``, the optimizer-preconditioned alignment (the step
  actually taken: Adam's differs from the gradient's direction) without the step's length.
- ``speed``: the training-speed integral, the mean over the probes after the start and the run's
  end of ``D*₀ − D*_t``.
- ``loss_decrease`` and ``grad_norm``: the baselines a user has without ``D*``: the candidate's own
  loss over the run's first half less its second half, and the mean norm of ``∇L`` at the probes.
- ``random``: minus a seeded random rank (set by the screen; the floor every signal must beat).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from objreg.analysis.math.batch_means import batch_means_ci95
from objreg.analysis.records import FirstOrderRecord

#: Every signal's name, in the order the report and the CLI show them.
SIGNALS = ("score", "lookahead", "first_order_sum", "second_order_sum", "alignment", "cosine", "step_cosine",
           "speed", "loss_decrease", "grad_norm", "random")
#: The signals a user has without the screen's ``D*`` (what a signal must beat).
BASELINES = ("loss_decrease", "grad_norm", "random")
#: The signal the screen ranks by.
DEFAULT_SIGNAL = "score"


@dataclass
class Trajectory:
    """What a run records for its signals: the probes and every step's training loss."""

    probes: list[FirstOrderRecord] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)


def _cosine(dot: float, *norms: float) -> float:
    scale = math.prod(norms)
    return dot / scale if scale > 0 else 0.0


def gaps(trajectory: Trajectory, steps: int) -> list[int]:
    """The steps each probe stands for: up to the next probe, the last one up to the run's end."""
    at = [p["step"] for p in trajectory.probes] + [steps]
    return [b - a for a, b in zip(at, at[1:])]


def lookahead_drops(trajectory: Trajectory, steps: int, final: float) -> list[float]:
    """The actual drop of ``D*`` per step over each probe interval (module docstring)."""
    values = [p["downstream_loss"] for p in trajectory.probes] + [final]
    return [(a - b) / n for a, b, n in zip(values, values[1:], gaps(trajectory, steps))]


def signals(trajectory: Trajectory, steps: int, final: float) -> dict[str, float]:
    """Every signal but ``random`` from a finished run of ``steps`` steps ending at ``D*`` =
    ``final`` (module docstring); ``second_order_sum`` is NaN where the curvature was not taken."""
    probes = trajectory.probes
    if len(probes) < 1 or len(trajectory.losses) < 2:
        raise ValueError("signals need at least one probe and two steps")
    widths = gaps(trajectory, steps)
    start = probes[0]["downstream_loss"]
    later = [p["downstream_loss"] for p in probes[1:]] + [final]
    half = len(trajectory.losses) // 2
    losses = trajectory.losses
    second = (sum((p["predicted_drop"] - p["second_order"]) * n for p, n in zip(probes, widths))
              if all(p["second_order"] is not None for p in probes) else math.nan)
    return {
        "score": _mean(p["predicted_drop"] for p in probes),
        "lookahead": _mean(lookahead_drops(trajectory, steps, final)),
        "first_order_sum": sum(p["predicted_drop"] * n for p, n in zip(probes, widths)),
        "second_order_sum": second,
        "alignment": _mean(p["alignment"] for p in probes),
        "cosine": _mean(_cosine(p["alignment"], p["downstream_grad_norm"], p["gradient_norm"]) for p in probes),
        "step_cosine": _mean(_cosine(p["predicted_drop"], p["downstream_grad_norm"], p["step_norm"]) for p in probes),
        "speed": _mean(start - value for value in later),
        "loss_decrease": sum(losses[:half]) / half - sum(losses[half:]) / (len(losses) - half),
        "grad_norm": _mean(p["gradient_norm"] for p in probes),
    }


def interval(values: Sequence[float]) -> dict[str, float]:
    """The mean of a run's per-probe values with its 95% batch-means interval (the steps are correlated)."""
    found = batch_means_ci95(values)
    return {"mean": found["mean"], "low": found["low"], "high": found["high"]}


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)
