"""The analysis configuration: every knob of a run, validated once, recorded in the report."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from objreg.analysis.math.curvature import HVP_METHODS
from objreg.analysis.math.per_sample import METHODS as PER_SAMPLE_METHODS
from objreg.analysis.parallel.devices import resolve_device
from objreg.analysis.probe.settings import ProbeSettings
from objreg.analysis.run.adaptive import check_options
from objreg.analysis.run.naming import speaks_keywords
from objreg.analysis.run.schedules import parse_schedules
from objreg.analysis.run.validation import check_schedules, check_settings
from objreg.core.errors import InvalidParameterError

OPTIMIZERS = ("sgd", "adam", "adamw")
#: The default fit set of a re-fitted head: each probe's derivatives pass through it, so its size
#: sets the probe's cost (docs/performance.md); four times the default evaluation set.
REFIT_FIT_SIZE = 256
#: The default fit set of a frozen head, fitted once before training.
FROZEN_FIT_SIZE = 1024
#: The default warm-up of a frozen head: linear-probe steps on its fit set before training.
FROZEN_WARMUP_STEPS = 100
DTYPES = {"float32": torch.float32, "float64": torch.float64}

#: Every setting with a fixed set of values: each accepted value, in order, with one line saying
#: what it does. Validation (:class:`AnalysisConfig`), ``objreg analyze --help`` and docs/cli.md
#: read them from here; tests/test_docs.py checks that the three agree. The per-sample and HVP
#: methods are those of the math that takes them.
CHOICES: dict[str, dict[str, str]] = {
    "optimizer": {
        "sgd": "plain SGD, the Taylor terms use the gradients directly",
        "adam": "Adam, the analysis uses the step Adam actually took",
        "adamw": "AdamW with decoupled weight decay, likewise",
    },
    "dtype": {
        "float32": "single precision",
        "float64": "double precision, for exactness checks",
    },
    "device": {
        "auto": "CUDA when available, else the CPU",
        "cpu": "the CPU",
        "cuda": "the current CUDA device",
        "cuda:N": "CUDA device N",
    },
    "per_sample_method": PER_SAMPLE_METHODS,
    "hvp_method": HVP_METHODS,
    "downstream_head": {
        "refit": "D is the evaluation loss of the head re-fitted (a regularised linear probe, solved exactly) on "
                 "the fit set at the current backbone",
        "frozen": "D reads the head fitted once before training (--head-warmup-steps) and then held fixed",
    },
}


@dataclass(frozen=True)
class AnalysisConfig:
    """Settings of ``objreg analyze``; the defaults give the about-a-minute default job.

    Attributes:
        pretrain: Pre-training objectives mixed during training.
        downstream: The downstream task whose loss ``D`` the alignment is measured against.
        weights: Base objective weights ``w_k`` (default 1 each).
        schedule: How each weight changes over the run, ``α_k(t) = w_k · m_k(t)``: a
            ``--schedule`` string (``"cosine"``, ``"mlm=linear:1:0,sop=step:8:0:1"``), or a mapping
            from objective to a shape string or a callable ``(step, steps) -> multiplier``, or one
            callable for all; ``None`` keeps every weight constant. See
            :mod:`objreg.analysis.run.schedules`.
        steps: Training steps on the weighted mix.
        lr: Learning rate ``η``.
        optimizer: ``sgd`` (the Taylor terms use the gradients directly), ``adam`` or ``adamw``
            (the analysis uses the step the optimizer actually took).
        batch_size: Pre-training examples per objective per step.
        seq_len: Longest row, in tokens.
        seed: Seeds model initialisation, data sampling and corruption (separate streams).
        device: ``auto`` (CUDA when available), ``cpu`` or ``cuda[:N]``.
        dtype: ``float32`` or ``float64`` (for exactness checks).
        eval_dtype: The dtype ``D`` itself is evaluated in for the actual change (``float64``,
            the default, on a float64 copy of the model: a float32 difference of two losses is
            quantised), or ``model`` for the model's own dtype.
        corpus: ``default`` or a path (text, JSONL, directory).
        downstream_data: Path to the task's data; ``None`` uses its built-in set.
        model: ``default`` (small Transformer) or another name a model plugin provides.
        probe_every: Measure alignment every this many steps (and at the last step).
        eval_size: Examples in the fixed downstream evaluation set defining ``D``.
        downstream_head: ``refit`` (``D`` is ``D*``: the head re-fitted exactly at every probed point,
            :mod:`objreg.analysis.math.refit`) or ``frozen`` (the head fitted once, before training).
        head_warmup_steps: With a frozen head, steps fitting it on its own split, backbone frozen,
            before training, so ``∇D`` reflects a fitted probe rather than a random head. Default:
            :data:`FROZEN_WARMUP_STEPS` for a frozen head; a re-fitted head has no warm-up (it is
            solved exactly at every probe), so a non-zero value with it is refused.
        head_fit_size: Examples in that split, disjoint from the evaluation set (a small split
            overfits the probe: docs/analysis.md). Default: :data:`REFIT_FIT_SIZE` for a re-fitted
            head (every probe passes through them), :data:`FROZEN_FIT_SIZE` for a frozen one.
        per_sample_method: How the per-example dots ``⟨∇ℓ_i, ∇D⟩`` are taken: ``auto`` tries
            ``ghost``, ``jvp``, ``double_backward`` and the per-example ``loop`` in that order and
            takes the first the model supports (``ghost`` is skipped for batch-coupled
            objectives; :func:`objreg.analysis.math.per_sample.per_sample_dots`); or one of them, or
            ``vmap``. :data:`CHOICES` describes each.
        hvp_method: How Hessian-vector products of ``D`` are taken: ``auto`` takes
            ``double_backward`` first on the CPU and ``forward_over_reverse`` first elsewhere,
            falling back to the other where a derivative is missing
            (:class:`objreg.analysis.math.curvature.Curvature`); or one of the two.
        char_noise: Character noise rate (insert/delete/substitute) applied to the pre-training
            text before tokenising (:func:`objreg.toolkit.noise.noisy_corpus`); 0 disables it.
        spectrum: Top eigenvalues of ``D``'s Hessian to compute (Lanczos) at the first and the last
            step, with each objective's alignment to the eigenvectors; 0 skips it (each costs
            many HVPs).
        attribution_top: How many most helpful and most harmful pre-training examples the report
            lists (0: none).
        objective_params: Parameter overrides per objective or for the downstream task, e.g.
            ``{"mlm": {"mask_prob": 0.2}, "qa": {"doc_stride": 64}}``.
        trust_radius: How far the best weights may lie from the weights used, per weight, as a
            share of the total weight: the counterfactual optimum of the report
            (:mod:`objreg.analysis.math.mixture`; over a run, divided by √(probed steps)), Adam's
            counterfactual stencil, and, per probe, ``--schedule adaptive:quadratic``.
        adaptive_rate: ``--schedule adaptive:tartan``'s largest change of a log-weight per probe.
        adaptive_smoothing: Share of the past kept when an adaptive rule averages its probes
            (exponential moving average; 0: the latest probe alone).
        min_weight, max_weight: Bounds on every weight an adaptive rule or the counterfactual
            optimum picks (``max_weight`` None: only the total bounds it).
    """

    pretrain: tuple[str, ...]
    downstream: str = "qa"
    weights: Mapping[str, float] = field(default_factory=dict)
    schedule: Any = None
    steps: int = 6
    lr: float = 0.005
    optimizer: str = "sgd"
    batch_size: int = 16
    seq_len: int = 128
    seed: int = 0
    device: str = "auto"
    dtype: str = "float32"
    eval_dtype: str = "float64"
    corpus: str = "default"
    downstream_data: str | None = None
    model: str = "default"
    probe_every: int = 1
    eval_size: int = 64
    head_warmup_steps: int | None = None
    head_fit_size: int | None = None
    downstream_head: str = "refit"
    per_sample_method: str = "auto"
    hvp_method: str = "auto"
    spectrum: int = 0
    char_noise: float = 0.0
    attribution_top: int = 5
    objective_params: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    trust_radius: float = 0.25
    adaptive_rate: float = 0.5
    adaptive_smoothing: float = 0.5
    min_weight: float = 0.0
    max_weight: float | None = None

    @speaks_keywords
    def __post_init__(self) -> None:
        if self.head_fit_size is None:
            fit_size = REFIT_FIT_SIZE if self.downstream_head == "refit" else FROZEN_FIT_SIZE
            object.__setattr__(self, "head_fit_size", fit_size)
        if self.head_warmup_steps is None:
            warmup = 0 if self.downstream_head == "refit" else FROZEN_WARMUP_STEPS
            object.__setattr__(self, "head_warmup_steps", warmup)
        check_settings(self)  # types, ranges and sizes first: docs/reliability.md
        if self.downstream_head == "refit" and self.head_warmup_steps:
            raise InvalidParameterError(
                f"--head-warmup-steps {self.head_warmup_steps} warms up a frozen head; the re-fitted head "
                f"(--downstream-head refit, the default) is solved exactly at every probe and takes no "
                f"warm-up: leave out --head-warmup-steps, or add --downstream-head frozen")
        pretrain = tuple(self.pretrain)
        if not pretrain:
            raise InvalidParameterError("no pre-training objective given: name at least one, e.g. --pretrain mlm,sop")
        if len(set(pretrain)) != len(pretrain):
            raise InvalidParameterError(f"pre-training objectives repeat: {', '.join(pretrain)}")
        object.__setattr__(self, "pretrain", pretrain)
        object.__setattr__(self, "weights", parse_weights(self.weights, pretrain))
        object.__setattr__(self, "schedule", parse_schedules(self.schedule, pretrain))
        for name in ("steps", "batch_size", "probe_every", "eval_size", "head_fit_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidParameterError(f"{name} must be a positive integer, got {value!r}")
        for name in ("spectrum", "attribution_top"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidParameterError(f"{name} must be an integer ≥ 0, got {value!r}")
        for name in ("per_sample_method", "hvp_method", "optimizer", "dtype", "downstream_head"):
            value = getattr(self, name)
            if value not in CHOICES[name]:
                raise InvalidParameterError(f"{name} must be one of {', '.join(CHOICES[name])}, got {value!r}")
        if isinstance(self.head_warmup_steps, bool) or not isinstance(self.head_warmup_steps, int) or self.head_warmup_steps < 0:
            raise InvalidParameterError(f"head_warmup_steps must be an integer ≥ 0, got {self.head_warmup_steps!r}")
        if isinstance(self.char_noise, bool) or not isinstance(self.char_noise, (int, float)) or not (
            0.0 <= self.char_noise <= 1.0
        ):
            raise InvalidParameterError(f"char_noise must be a rate in [0, 1], got {self.char_noise!r}")
        if self.seq_len < 8:
            raise InvalidParameterError(f"seq_len must be at least 8 tokens, got {self.seq_len}")
        if not isinstance(self.lr, (int, float)) or not math.isfinite(self.lr) or self.lr <= 0:
            raise InvalidParameterError(f"lr must be a positive finite number, got {self.lr!r}")
        if self.eval_dtype not in (*DTYPES, "model"):
            raise InvalidParameterError(f"eval_dtype must be one of {', '.join(DTYPES)}, model; got {self.eval_dtype!r}")
        check_schedules(self.steps, self.weights, self.schedule)  # a bad user schedule fails here
        check_options(pretrain, self.weights, radius=self.trust_radius, rate=self.adaptive_rate,
                      smoothing=self.adaptive_smoothing, min_weight=self.min_weight, max_weight=self.max_weight)
        unknown = set(self.objective_params) - set(pretrain) - {self.downstream}
        if unknown:
            raise InvalidParameterError(
                f"parameters given for objectives not selected: {', '.join(sorted(unknown))} "
                f"(selected: {', '.join(pretrain)}; downstream task: {self.downstream})"
            )

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def probe_settings(self) -> ProbeSettings:
        """The settings the run's probe computes with (its seed the run's)."""
        return ProbeSettings(per_sample_method=self.per_sample_method, hvp_method=self.hvp_method, seed=self.seed,
                             spectrum=self.spectrum, counterfactual_radius=self.trust_radius)

    def resolved_device(self) -> torch.device:
        """The device to run on; asking for CUDA where there is none is an error."""
        return resolve_device(self.device)

    def to_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["pretrain"] = list(self.pretrain)
        data["weights"] = dict(self.weights)
        data["schedule"] = {name: schedule.spec for name, schedule in self.schedule.items()}
        data["objective_params"] = {k: dict(v) for k, v in self.objective_params.items()}
        return data


def parse_weights(weights: Mapping[str, float] | str | None, pretrain: Sequence[str]) -> dict[str, float]:
    """Objective weights from a mapping or a ``"mlm=1,sop=0.5"`` string; unnamed objectives get 1.

    Raises:
        InvalidParameterError: a malformed entry, a non-finite or negative weight, a weight for an
            objective that is not selected, or all weights zero.
    """
    if isinstance(weights, str):
        parsed: dict[str, Any] = {}
        for item in filter(None, (part.strip() for part in weights.split(","))):
            name, sep, value = item.partition("=")
            if not sep or not name.strip():
                raise InvalidParameterError(f"malformed weight {item!r}: expected NAME=NUMBER, e.g. mlm=1,sop=0.5")
            parsed[name.strip()] = value.strip()
        weights = parsed
    result = {name: 1.0 for name in pretrain}
    for name, value in (weights or {}).items():
        if name not in result:
            raise InvalidParameterError(
                f"weight given for {name!r}, which is not a selected objective (selected: {', '.join(pretrain)})"
            )
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise InvalidParameterError(f"weight for {name!r} must be a number, got {value!r}") from None
        if not math.isfinite(number) or number < 0:
            raise InvalidParameterError(f"weight for {name!r} must be finite and ≥ 0, got {value!r}")
        result[name] = number
    if not any(result.values()):
        raise InvalidParameterError("all objective weights are zero: nothing would be trained")
    return result

