"""The alignment report: what ``objreg.analyze`` returns, its summary over the probe steps, and its
tidy CSV table. :mod:`objreg.analysis.probe.writer` writes it to a run directory.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field
from typing import Any

from objreg.analysis.math.stats import autocorrelated_mean_ci95, correlation
from objreg.analysis.math.taylor import REGIME_RULE, inside_regime, pair_key, relative_error
from objreg.analysis.records import StepRecord, Summary

#: The summed relative errors are reported only where the actual improvement is at least this
#: share of ``Σ_t |∇D·Δθ_t|``.
RESOLVED_SHARE = 0.1


@dataclass
class AlignmentReport:
    """What ``objreg.analyze`` returns. ``to_dict()`` gives the JSON shape the CLI prints:
    ``{"pretrain", "downstream", "config", "steps": [...], "summary": {...}}``."""

    pretrain: list[str]
    downstream: str
    config: dict[str, Any]
    steps: list[StepRecord] = field(default_factory=list)
    summary: Summary = field(default_factory=dict)  # type: ignore[assignment]  # filled by summarise

    def to_dict(self) -> dict[str, Any]:
        return {
            "pretrain": list(self.pretrain),
            "downstream": self.downstream,
            "config": self.config,
            "steps": self.steps,
            "summary": self.summary,
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)


def summarise(
    pretrain: list[str],
    steps: list[StepRecord],
    *,
    weights_by_step: list[dict[str, float]] | None = None,
    update_rule: str = "",
    attribution: dict[str, Any] | None = None,
) -> Summary:
    """The run's summary from its probe records (plus what the trainer kept: the weight of every
    step, the update rule, the example scores).

    Sums run over the probed steps (every step by default) and are *improvements*, positive when
    the downstream loss falls: ``first_order_term = Σ_t −∇D·Δθ_t`` (with SGD ``η Σ_t Σ_k α_k(t)
    c_k(t)``), ``second_order_term = Σ_t −½ Δθ_tᵀ H_D Δθ_t``, ``predicted_improvement`` their sum,
    ``actual_improvement = Σ_t −(D(θ_{t+1}) − D(θ_t))``. ``taylor_error`` gives the errors of the
    whole prediction absolutely and relative to ``Σ_t |∇D·Δθ_t|`` (a scale that does not cancel);
    ``taylor_relative_error`` is relative to the actual improvement (None when that is below
    :data:`RESOLVED_SHARE` of the scale, where the steps' changes cancel, or within the rounding
    floor). Averages over probe steps describe one trajectory: their intervals are widened
    for its autocorrelation and are approximate (docs/analysis.md). The first and the last step
    are always probed, so their records hold the downstream loss before training and after it.

    Per objective, ``alignment.<k>.cosine`` is :func:`pooled_cosine` (its sign is the mean dot's);
    ``mean_probe_cosine`` is the plain mean of the per-probe cosines.
    """
    alignment = {}
    for name in pretrain:
        rows = [s["alignment"][name] for s in steps]
        over_steps = autocorrelated_mean_ci95([a["dot"] for a in rows])
        parts = [-s["update"]["first_order"].get(name, 0.0) for s in steps]
        alignment[name] = {
            "dot": over_steps["mean"],
            "ci95": [over_steps["low"], over_steps["high"]],
            "effective_probes": over_steps["effective_n"],
            "lag1_autocorrelation": over_steps["lag1_autocorrelation"],
            "cosine": pooled_cosine([a["dot"] for a in rows], [a["grad_norm"] for a in rows], [s["downstream_grad_norm"] for s in steps]),
            "mean_probe_cosine": _mean(a["cosine"] for a in rows),
            "update_cosine": _mean(a["update_cosine"] for a in rows),
            "conflict_fraction": _mean(a["conflict_fraction"] for a in rows),
            "grad_norm": _mean(a["grad_norm"] for a in rows),
            "first_order_contribution": sum(parts),
            # Probes where the raw gradient and the objective's actual part disagree on the sign of its effect.
            "sign_disagreements": sum(1 for a, gain in zip(rows, parts) if a["dot"] * gain < 0),
        }
    for name, share in second_order_shares(steps).items():
        if name in alignment:
            alignment[name]["second_order_share"] = share
            alignment[name]["predicted_contribution"] = alignment[name]["first_order_contribution"] + share
    first = [s["predicted_delta"]["first_order"] for s in steps]
    second = [s["predicted_delta"]["second_order"] for s in steps]
    actual = [s["actual_delta"] for s in steps]
    first_term, second_term, actual_improvement = -sum(first), -sum(second), -sum(actual)
    predicted = first_term + second_term
    floor = sum(s["taylor"]["rounding_floor"] for s in steps)
    scale = sum(abs(f) for f in first)
    # A ratio to the run's total change says something only where that total is not a small
    # remainder of its steps' changes cancelling (nor rounding).
    resolved = abs(actual_improvement) > max(floor, RESOLVED_SHARE * scale)
    errors = {"first_order": abs(first_term - actual_improvement),
              "first_plus_second_order": abs(predicted - actual_improvement)}
    outside = [s["step"] for s in steps if not s["taylor"]["inside_regime"]]
    ratios = [s["taylor"]["second_to_first"] for s in steps if s["taylor"]["second_to_first"] is not None]
    conditioning = [s["update"]["conditioning"] for s in steps if s["update"]["conditioning"] is not None]
    summary: Summary = {
        "alignment": alignment,
        "second_order": {key: _mean(s["second_order"][key] for s in steps) for key in steps[0]["second_order"]},
        "first_order_term": first_term,
        "second_order_term": second_term,
        "predicted_improvement": predicted,
        "actual_improvement": actual_improvement,
        "taylor_relative_error": relative_error(predicted, actual_improvement) if resolved else None,
        "first_order_relative_error": relative_error(first_term, actual_improvement) if resolved else None,
        "taylor_error": {
            **errors,
            "scale": scale,
            "scaled": {k: v / scale if scale > 0 else None for k, v in errors.items()},
            "rounding_floor": floor,
        },
        "taylor_regime": {
            "inside": not outside and inside_regime(errors["first_order"], errors["first_plus_second_order"], scale,
                                                    floor),
            "steps_outside": outside,
            "max_second_to_first": max(ratios) if ratios else None,
            "rule": REGIME_RULE,
        },
        "contributions": {
            "first_order": _summed(s["update"]["first_order"] for s in steps),
            "second_order": _summed(s["update"]["second_order"] for s in steps),
        },
        "correlation": {
            "first_order": correlation(first, actual),
            "first_plus_second_order": correlation([a + b for a, b in zip(first, second)], actual),
        },
        "decomposition_residual": max(s["update"]["decomposition_residual"] for s in steps),
        "max_conditioning": max(conditioning) if conditioning else None,
        "update_rule": update_rule,
        "initial_downstream_loss": steps[0]["downstream_loss"],
        "final_downstream_loss": steps[-1]["downstream_loss_after"],
        "probes": len(steps),
        "weights_by_step": {name: [w[name] for w in weights_by_step or []] for name in pretrain},
        "spectrum": [{"step": s["step"], **s["spectrum"]} for s in steps if "spectrum" in s],
    }
    if attribution is not None:
        summary["attribution"] = attribution
    return summary


def second_order_shares(steps: list[StepRecord]) -> dict[str, float]:
    """Each part's share of the second-order term, as an improvement summed over the probes: its
    own pair ``½ d_kᵀ H_D d_k`` and half of every pair ``d_kᵀ H_D d_j`` it is in. With each part's
    first-order term it gives the part's share of the whole prediction (the shares add up to
    ``second_order_term``), where the first-order term alone can be mostly cancelled by the
    second-order one."""
    shares: dict[str, float] = {}
    for s in steps:
        parts = list(s["update"]["first_order"])
        names = {pair_key(a, b): (a, b) for i, a in enumerate(parts) for b in parts[i:]}
        for key, value in s["update"]["second_order"].items():
            a, b = names[key]
            for part in {a, b}:
                shares[part] = shares.get(part, 0.0) - (value if a == b else value / 2)
    return shares


def pooled_cosine(dots: list[float], norms: list[float], downstream_norms: list[float]) -> float:
    """``Σ_t c_t / √(Σ_t ‖g_t‖² · Σ_t ‖∇D_t‖²)``: the cosine between the probes' gradients laid
    end to end and the downstream gradients laid end to end. Its sign is the sign of the mean dot,
    which a mean of per-probe cosines need not have; 0 where every gradient is zero."""
    denominator = (sum(n * n for n in norms) * sum(n * n for n in downstream_norms)) ** 0.5
    return sum(dots) / denominator if denominator > 0 else 0.0


def _summed(parts: Any) -> dict[str, float]:
    """Improvement per key: minus the sum of each key's predicted changes."""
    total: dict[str, float] = {}
    for part in parts:
        for key, value in part.items():
            total[key] = total.get(key, 0.0) - value
    return total


def _mean(values: Any) -> float:
    values = list(values)
    return sum(values) / len(values) if values else 0.0


#: Columns of ``report.csv``: one row per probe step and objective; step-wide values repeat.
CSV_COLUMNS = (
    "step", "objective", "weight", "loss", "dot", "ci95_low", "ci95_high", "bootstrap_low", "bootstrap_high",
    "cosine", "cosine_ci95_low", "cosine_ci95_high", "conflict_fraction", "grad_norm", "second_order_self",
    "first_order_change", "downstream_loss", "downstream_loss_after", "predicted_first_order",
    "predicted_second_order", "actual_delta", "update_cosine", "part_norm", "step_norm", "error_first_order",
    "error_first_plus_second_order", "rounding_floor",
)


def report_csv(report: AlignmentReport) -> str:
    """The tidy table of ``report.csv`` (see :data:`CSV_COLUMNS`)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for s in report.steps:
        for name, a in s["alignment"].items():
            writer.writerow([
                s["step"], name, s["weights"][name], s["losses"].get(name), a["dot"], *a["ci95"],
                *a["ci95_bootstrap"], a["cosine"], *(a["cosine_ci95"] or (None, None)), a["conflict_fraction"],
                a["grad_norm"],
                s["second_order"][pair_key(name, name)], s["update"]["first_order"].get(name),
                s["downstream_loss"], s["downstream_loss_after"], s["predicted_delta"]["first_order"],
                s["predicted_delta"]["second_order"], s["actual_delta"], a["update_cosine"],
                s["update"]["norms"].get(name), s["update"]["norm"], s["taylor"]["error"]["first_order"],
                s["taylor"]["error"]["first_plus_second_order"], s["taylor"]["rounding_floor"],
            ])
    return out.getvalue()
