"""PNG plots of a report: alignment over steps, predicted vs actual change, the Hessian spectrum.

matplotlib is imported here only, and this module only when plots are written, so the CLI starts
fast. Figures are drawn on the Agg canvas directly (no pyplot: no global figure state, no GUI
backend), and each file is written to a temporary name and renamed into place.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from objreg.toolkit.atomic import atomic_file


def write_plots(report: dict[str, Any], out_dir: Path) -> list[Path]:
    """``alignment.png``, ``taylor.png`` and (when the report has a spectrum) ``spectrum.png``."""
    written = [_save(_alignment(report), out_dir / "alignment.png"), _save(_taylor(report), out_dir / "taylor.png")]
    if report["summary"].get("spectrum"):
        written.append(_save(_spectrum(report), out_dir / "spectrum.png"))
    return written


def _save(figure: Figure, path: Path) -> Path:
    FigureCanvasAgg(figure)
    with atomic_file(path) as f:
        figure.savefig(f, format="png", dpi=110)
    return path


def _alignment(report: dict[str, Any]) -> Figure:
    steps = report["steps"]
    x = [s["step"] for s in steps]
    figure = Figure(figsize=(8, 9), layout="constrained")
    dot_axes, cosine_axes, weight_axes = figure.subplots(3, 1, sharex=True)
    for name in report["pretrain"]:
        rows = [s["alignment"][name] for s in steps]
        line, = dot_axes.plot(x, [a["dot"] for a in rows], marker="o", markersize=3, label=name)
        dot_axes.fill_between(x, [a["ci95"][0] for a in rows], [a["ci95"][1] for a in rows],
                              color=line.get_color(), alpha=0.2)
        cosine_axes.plot(x, [a["cosine"] for a in rows], marker="o", markersize=3, color=line.get_color(), label=name)
        cosine_axes.fill_between(x, [a["cosine_ci95"][0] for a in rows], [a["cosine_ci95"][1] for a in rows],
                                 color=line.get_color(), alpha=0.2)
        weights = report["summary"].get("weights_by_step", {}).get(name) or [s["weights"][name] for s in steps]
        # Each step's weight held until the next step (the last one drawn to the end of the run).
        weight_axes.plot(range(len(weights) + 1), [*weights, weights[-1]], drawstyle="steps-post",
                         color=line.get_color(), label=name)
    for axes in (dot_axes, cosine_axes):
        axes.axhline(0.0, color="grey", linewidth=0.8)
    dot_axes.set(title=f"Alignment with ∇D ({report['downstream']}), 95% CI over examples", ylabel="dot ⟨∇L_k, ∇D⟩")
    cosine_axes.set(ylabel="cosine")
    weight_axes.set(ylabel="weight α_k(t)", xlabel="step")
    dot_axes.legend()
    return figure


def _taylor(report: dict[str, Any]) -> Figure:
    steps = report["steps"]
    x = [s["step"] for s in steps]
    first = [s["predicted_delta"]["first_order"] for s in steps]
    both = [s["predicted_delta"]["first_order"] + s["predicted_delta"]["second_order"] for s in steps]
    actual = [s["actual_delta"] for s in steps]
    figure = Figure(figsize=(11, 4.5), layout="constrained")
    over_steps, scatter = figure.subplots(1, 2)
    over_steps.plot(x, actual, marker="o", color="black", label="actual")
    over_steps.plot(x, first, marker="x", linestyle="--", label="first order")
    over_steps.plot(x, both, marker="+", linestyle=":", label="first + second order")
    over_steps.axhline(0.0, color="grey", linewidth=0.8)
    over_steps.set(title="Downstream change per step", xlabel="step", ylabel="D(θ_{t+1}) − D(θ_t)")
    over_steps.legend()
    scatter.scatter(actual, first, marker="x", label="first order")
    scatter.scatter(actual, both, marker="+", label="first + second order")
    low, high = min(actual + first + both), max(actual + first + both)
    scatter.plot([low, high], [low, high], color="grey", linewidth=0.8, label="predicted = actual")
    scatter.set(title="Predicted vs actual change", xlabel="actual", ylabel="predicted")
    scatter.legend()
    return figure


def _spectrum(report: dict[str, Any]) -> Figure:
    spectra = report["summary"]["spectrum"]
    figure = Figure(figsize=(11, 4.5), layout="constrained")
    values_axes, alignment_axes = figure.subplots(1, 2)
    for entry in spectra:
        values_axes.plot(range(1, len(entry["eigenvalues"]) + 1), entry["eigenvalues"], marker="o",
                         label=f"step {entry['step']}")
    values_axes.set(title="Top eigenvalues of H_D", xlabel="rank", ylabel="eigenvalue")
    values_axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    alignment_axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    values_axes.legend()
    last = spectra[-1]
    rows = {**last["alignment"], "∇D": last["downstream_alignment"]}
    width = 0.8 / len(rows)
    for i, (name, cosines) in enumerate(rows.items()):
        alignment_axes.bar([j + 1 + (i - (len(rows) - 1) / 2) * width for j in range(len(cosines))],
                           [abs(c) for c in cosines], width=width, label=name)
    alignment_axes.set(title=f"|cos(gradient, eigenvector)| at step {last['step']}", xlabel="eigenvector rank",
                       ylabel="|cosine|")
    alignment_axes.legend()
    return figure
