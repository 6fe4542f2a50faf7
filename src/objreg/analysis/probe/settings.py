"""``ProbeSettings``: the numeric settings of a probe, in one typed, checked object.

:func:`~objreg.analysis.probe.make.make_probe` takes them as ``settings=``, ``TransferProbe`` keeps
them as ``probe.settings`` (its keyword arguments of the same names fill them), and ``objreg
analyze``'s :class:`~objreg.analysis.run.loop.Trainer` builds its probe from them, so a value is
checked once, the same way, wherever it enters.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

import torch

from objreg.analysis.math.curvature import HVP_METHODS
from objreg.analysis.math.per_sample import METHODS as PER_SAMPLE_METHODS
from objreg.core.errors import InvalidParameterError


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class ProbeSettings:
    """How a probe computes, apart from what it measures (the model, objectives and data).

    Attributes:
        per_sample_method: ``auto`` (ghost, then jvp, double backward, the per-example loop), one
            of them, or ``vmap`` (:data:`objreg.analysis.math.per_sample.METHODS`).
        hvp_method: ``auto``, ``forward_over_reverse`` or ``double_backward``
            (:data:`objreg.analysis.math.curvature.HVP_METHODS`).
        eval_dtype: The dtype ``D`` itself is evaluated in (a copy of the model); None: the model's.
        seed: Seeds the bootstrap intervals (and the spectrum's start); an integer ≥ 0.
        spectrum: How many top eigenvalues of ``H_D`` to take (0: none).
        counterfactual_radius: Under Adam, how far from the weights used the record's exact
            counterfactual points (``counterfactual.points``) reach, as a share of the weights' total: > 0 (no point moves a
            weight below 0, so beyond 1 it reaches no farther).
        strict: Raise :class:`~objreg.core.errors.ProbeStateError` where a record would be
            flagged because its split does not describe the step the optimizer took (default:
            flag the record, ``update.decomposition_flagged``, and warn once;
            :mod:`objreg.analysis.probe.split_check`).
        moments_dtype, moments_device: Under Adam, the dtype (None: the parameters'; or
            ``torch.bfloat16``, stochastically rounded) and the device (None: the parameters';
            ``"cpu"``) the coalition moments of the step's split are kept in
            (:class:`~objreg.analysis.math.shapley.CoalitionMoments`, which checks them; a warning
            says when they would outgrow the optimizer's own state: :mod:`objreg.analysis.math.costs`).

    Raises:
        InvalidParameterError: a value out of its range (the message names it and what is allowed).
    """

    per_sample_method: str = "auto"
    hvp_method: str = "auto"
    eval_dtype: torch.dtype | None = torch.float64
    seed: int = 0
    spectrum: int = 0
    counterfactual_radius: float = 0.25
    strict: bool = False
    moments_dtype: torch.dtype | None = None
    moments_device: torch.device | str | None = None

    def __post_init__(self) -> None:
        problems = []
        if self.per_sample_method not in PER_SAMPLE_METHODS:
            problems.append(f"per_sample_method must be one of {', '.join(PER_SAMPLE_METHODS)}, got "
                            f"{self.per_sample_method!r}")
        if self.hvp_method not in HVP_METHODS:
            problems.append(f"hvp_method must be one of {', '.join(HVP_METHODS)}, got {self.hvp_method!r}")
        if self.eval_dtype is not None and not (isinstance(self.eval_dtype, torch.dtype)
                                                and self.eval_dtype.is_floating_point):
            problems.append(f"eval_dtype must be a floating torch.dtype or None, got {self.eval_dtype!r}")
        if not _integer(self.seed) or self.seed < 0:
            problems.append(f"seed must be an integer ≥ 0, got {self.seed!r}")
        if not _integer(self.spectrum) or self.spectrum < 0:
            problems.append(f"spectrum must be an integer ≥ 0 (how many top eigenvalues of H_D; 0: none), got "
                            f"{self.spectrum!r}")
        radius = self.counterfactual_radius
        if (isinstance(radius, bool) or not isinstance(radius, (int, float)) or not math.isfinite(radius)
                or radius <= 0):
            problems.append(f"counterfactual_radius must be a finite number > 0 (a share of the weights' total), got "
                            f"{radius!r}")
        if not isinstance(self.strict, bool):
            problems.append(f"strict must be True or False, got {self.strict!r}")
        if problems:
            raise InvalidParameterError("; ".join(problems))

    def changed(self) -> dict[str, Any]:
        """The settings that differ from their defaults, by name."""
        default = ProbeSettings()
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != getattr(default, f.name)}

    def as_arguments(self) -> dict[str, Any]:
        """The settings as ``TransferProbe``'s keyword arguments of the same names."""
        return {f.name: getattr(self, f.name) for f in fields(self)}
