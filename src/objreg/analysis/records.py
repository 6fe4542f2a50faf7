"""The probe record, typed once: what ``TransferProbe.finish`` returns, one ``steps[]`` entry of
``objreg analyze``'s report, one line of ``steps.jsonl``.

Records stay plain dicts (they are JSON as they are, and users index them); these TypedDicts say
which keys each level has and what they hold, and every module that builds or reads a record
names its type. docs/analysis.md explains what each number means. The schema sits at the root of
:mod:`objreg.analysis` because every room speaks it: the probe writes it, the math (the mixture's
counterfactual) and the run read it.
"""

# No `from __future__ import annotations`: TypedDict must see NotRequired itself to know which
# keys are optional.
import sys
from typing import TypedDict

if sys.version_info >= (3, 11):
    from typing import NotRequired
else:  # pragma: no cover - Python 3.10
    from typing_extensions import NotRequired

#: Objective name → value (weights, losses, the per-part first-order terms, …).
ByName = dict[str, float]


class Alignment(TypedDict):
    """One objective's gradient against ``∇D`` at a probe (``alignment.<k>``)."""

    dot: float  # mean over examples of ⟨∇ℓ_i, ∇D⟩ = ⟨g_k, ∇D⟩
    cosine: float
    ci95: list[float]  # Student-t interval of the dot over examples
    ci95_bootstrap: list[float]
    cosine_ci95: list[float] | None  # None: withheld where the noise ratio is above the bound (docs/analysis.md)
    conflict_fraction: float  # share of examples with ⟨∇ℓ_i, ∇D⟩ < 0
    grad_norm: float  # ‖g_k‖
    grad_norm_sq_unbiased: float  # unbiased ‖E g_k‖²: the U-statistic over pairs of examples (may be ≤ 0)
    noise_ratio: float | None  # tr Σ / (B ‖E g_k‖²); None where the unbiased ‖E g_k‖² ≤ 0
    update_cosine: float  # cosine of the objective's part of the step with −∇D


class Prediction(TypedDict):
    """The Taylor prediction of ``D``'s change over the step (``predicted_delta``)."""

    first_order: float
    second_order: float


class FirstAndSecond(TypedDict):
    first_order: float | None
    first_plus_second_order: float | None


class Taylor(TypedDict):
    """The prediction's errors and the Taylor-regime diagnostic (``taylor``)."""

    error: FirstAndSecond
    scaled_error: FirstAndSecond
    rounding_floor: float
    downstream_resolution: NotRequired[float]  # the measured noise of one evaluation of D (once per run)
    second_to_first: float | None
    second_order_helps: bool
    remainder_ratio: float | None
    inside_regime: bool


class Update(TypedDict):
    """The step the optimizer took, split into parts (``update``)."""

    norm: float
    norms: ByName
    conditioning: float | None
    decomposition_residual: float
    # Only on a record whose split does not describe the step taken (analysis.probe.split_check), then True.
    decomposition_flagged: NotRequired[bool]
    attribution: str  # "exact" (SGD), "shapley" (Adam), …
    first_order: ByName  # each part's ∇D·d_c
    second_order: ByName  # each pair's ½ d_iᵀ H_D d_j (both orders summed off the diagonal)
    first_order_standard_error: NotRequired[ByName]  # sampled Shapley parts: the Monte-Carlo error of first_order


class Spectrum(TypedDict):
    """The top of ``H_D``'s spectrum (``spectrum``, on the first and last step with ``--spectrum``)."""

    eigenvalues: list[float]
    alignment: dict[str, list[float]]
    downstream_alignment: list[float]
    matvecs: int


class DownstreamFit(TypedDict):
    """One solve of a re-fitted downstream head (``downstream_fit.before`` / ``.after``)."""

    fit_loss: float  # the fit set's mean loss at h*(θ), without the penalty
    gradient_norm: float  # ‖∇_h F‖ where the solve stopped


class FitBeforeAfter(TypedDict):
    before: DownstreamFit
    after: DownstreamFit


class CounterfactualPoint(TypedDict):
    """The exact one-step counterfactual at one weight vector (Adam): the predicted change of ``D``
    had the step used these weights, from the optimizer's previous moments."""

    weights: ByName
    first_order: float  # ∇D·Δθ(α)
    second_order: float  # ½ Δθ(α)ᵀ H_D Δθ(α)


class FirstOrderPoint(TypedDict):
    """The exact counterfactual's first-order term at one weight vector of the grid (Adam)."""

    weights: ByName
    first_order: float  # ∇D·Δθ(α)


class Counterfactual(TypedDict):
    """Under Adam, the exact one-step counterfactual (``counterfactual``): to second order at the
    stencil's weight vectors, to first order on a finer grid along every pair of objectives."""

    points: list[CounterfactualPoint]
    grid: list[FirstOrderPoint]


class StepRecord(TypedDict):
    """One probe step, in the order its keys are written."""

    step: int
    weights: ByName
    losses: ByName
    downstream_loss: float
    downstream_grad_norm: float
    alignment: dict[str, Alignment]
    second_order: ByName  # S_ij = g_iᵀ H_D g_j by pair "i,j"
    second_order_asymmetry: float
    spectrum: NotRequired[Spectrum]
    counterfactual: NotRequired[Counterfactual]  # under Adam, with two objectives or more
    predicted_delta: Prediction
    downstream_loss_after: float
    downstream_fit: NotRequired[FitBeforeAfter]  # with a re-fitted head (downstream_head="refit")
    actual_delta: float
    taylor: Taylor
    update: Update


class RidingAlignment(TypedDict):
    """One objective's per-example dots with ``∇D`` at a step of :class:`~objreg.InRunAlignment`."""

    dot: float | None  # mean over the step's rows of ⟨∇ℓ_i, ∇D⟩ = ⟨g_k, ∇D⟩, with ∇D as old as downstream_grad_age
    ci95: list[float] | None  # Student-t interval of that mean over the rows
    conflict_fraction: float | None  # share of rows with ⟨∇ℓ_i, ∇D⟩ < 0
    dots: list[float | None]  # every row's ⟨∇ℓ_i, ∇D⟩, in the order the loop computed them
    # Rows the loop's loss gave no weight (∂L/∂ℓ_i = 0): their dot is unknown (null in dots), left
    # out of dot, ci95 and conflict_fraction (all null when no row is left).
    unmeasured_rows: list[int]


class Staleness(TypedDict):
    """How far the replaced ``∇D`` had drifted, measured on the step of a refresh."""

    age: int  # steps the replaced ∇D served
    cosine: float  # cosine between the replaced ∇D and the fresh one
    relative_change: float  # ‖∇D fresh − ∇D replaced‖ / ‖∇D fresh‖
    dot_change: ByName  # per objective: ‖dots(replaced) − dots(fresh)‖ / ‖dots(fresh)‖ over this step's rows


class InRunRecord(TypedDict):
    """One training step of :class:`~objreg.InRunAlignment`, in the order its keys are written."""

    step: int
    downstream_grad_age: int  # steps since ∇D was computed (0: fresh at this step)
    downstream_grad_norm: float  # ‖∇D‖ of the ∇D used
    alignment: dict[str, RidingAlignment]
    staleness: Staleness | None  # on a refresh step (but the first): the replaced ∇D against the fresh one


class FirstOrderRecord(TypedDict):
    """One step of :class:`~objreg.analysis.probe.first_order.FirstOrderProbe` (``objreg screen``'s)."""

    step: int
    downstream_loss: float  # D before the step
    predicted_drop: float  # −∇D·Δθ
    second_order: float | None  # ½ Δθᵀ H_D Δθ (second_order=True)
    alignment: float | None  # ∇D·g, g the gradient the loop stepped along (where given)
    downstream_grad_norm: float  # ‖∇D‖
    gradient_norm: float | None  # ‖g‖ (where given)
    step_norm: float  # ‖Δθ‖

class SummaryAlignment(TypedDict):
    """One objective's alignment over the run (``summary.alignment.<k>``, docs/analysis.md)."""

    dot: float  # mean over the probes of the mean per-example dot with ∇D
    ci95: list[float]  # its interval, widened for the trajectory's autocorrelation
    effective_probes: float
    lag1_autocorrelation: float  # raw; 0 below three probes
    cosine: float  # the pooled cosine: the probes' gradients laid end to end against ∇D's
    mean_probe_cosine: float
    update_cosine: float
    conflict_fraction: float
    grad_norm: float
    first_order_contribution: float  # Σ_t the objective's part's first-order improvement
    sign_disagreements: int  # probes where the raw gradient and the part disagree on the sign
    second_order_share: NotRequired[float]
    predicted_contribution: NotRequired[float]


class TaylorError(TypedDict):
    first_order: float  # |first-order term − actual improvement|
    first_plus_second_order: float
    scale: float  # Σ_t |∇D·Δθ_t|, a scale that does not cancel
    scaled: dict[str, float | None]  # the errors over the scale
    rounding_floor: float


class TaylorRegime(TypedDict):
    inside: bool
    steps_outside: list[int]
    max_second_to_first: float | None
    rule: str


class Summary(TypedDict):
    """The run's summary (``AlignmentReport.summary``): improvements are positive when ``D`` falls."""

    alignment: dict[str, SummaryAlignment]
    second_order: ByName  # mean S_ij over the probes, by pair "i,j"
    first_order_term: float
    second_order_term: float
    predicted_improvement: float
    actual_improvement: float
    taylor_relative_error: float | None  # None where the actual improvement is not resolved
    first_order_relative_error: float | None
    taylor_error: TaylorError
    taylor_regime: TaylorRegime
    contributions: dict[str, ByName]  # "first_order", "second_order": summed by part
    correlation: dict[str, dict[str, float | None]]  # Pearson r and Spearman ρ of per-probe predictions with the actual changes
    decomposition_residual: float
    max_conditioning: float | None
    update_rule: str
    initial_downstream_loss: float
    final_downstream_loss: float
    probes: int
    weights_by_step: dict[str, list[float]]
    spectrum: list[dict[str, object]]
    attribution: NotRequired[dict[str, object]]  # with attribution_top > 0
    counterfactual: NotRequired[dict[str, object]]  # objreg analyze: the mixture's model (math.mixture)
    adaptive: NotRequired[dict[str, object]]  # objreg analyze with an adaptive schedule
