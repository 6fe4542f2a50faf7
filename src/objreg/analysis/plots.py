"""PNG plots of a report: alignment over steps, predicted vs actual change, the Hessian spectrum.

Panels only for what varies (the weights only where a schedule moves them), one row per
objective so that confidence bands never overlap, and axes labelled in words with their units.

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
    """``alignment.png``, ``taylor.png``, (when the report has a spectrum) ``spectrum.png`` and
    (with two objectives or more) ``counterfactual.png``."""
    written = [_save(_alignment(report), out_dir / "alignment.png"), _save(_taylor(report), out_dir / "taylor.png")]
    if report["summary"].get("spectrum"):
        written.append(_save(_spectrum(report), out_dir / "spectrum.png"))
    if len(report["pretrain"]) >= 2 and report["summary"].get("counterfactual"):
        from objreg.analysis.counterfactual_plot import counterfactual_figure

        written.append(_save(counterfactual_figure(report), out_dir / "counterfactual.png"))
    return written


def _save(figure: Figure, path: Path) -> Path:
    FigureCanvasAgg(figure)
    with atomic_file(path) as f:
        figure.savefig(f, format="png", dpi=110)
    return path


def _varies(values: list[float]) -> bool:
    return any(v != values[0] for v in values)


def _alignment(report: dict[str, Any]) -> Figure:
    """One row per objective (its own band, so intervals never overlap): the dot product and the
    cosine with ∇D over the probe steps, each with its 95% interval over examples; a weights panel
    only where some weight changes over the run."""
    steps = report["steps"]
    names = report["pretrain"]
    x = [s["step"] for s in steps]
    weights = {name: report["summary"].get("weights_by_step", {}).get(name) or [s["weights"][name] for s in steps]
               for name in names}
    scheduled = any(_varies(w) for w in weights.values())
    rows = len(names) + scheduled
    figure = Figure(figsize=(11, 2.6 * rows + 0.8), layout="constrained")
    axes = figure.subplots(rows, 2, sharex=True, squeeze=False)
    colors = [f"C{i}" for i in range(len(names))]
    for row, (name, color) in enumerate(zip(names, colors)):
        probes = [s["alignment"][name] for s in steps]
        for column, (key, band, label) in enumerate((
            ("dot", "ci95", "dot product with ∇D\n(loss² per parameter²)"),
            ("cosine", "cosine_ci95", "cosine with ∇D\n(−1 to 1)"),
        )):
            panel = axes[row][column]
            panel.fill_between(x, [a[band][0] for a in probes], [a[band][1] for a in probes], color=color, alpha=0.2,
                               linewidth=0, label="95% interval over examples")
            panel.plot(x, [a[key] for a in probes], marker="o", markersize=3, color=color, label="mean over examples")
            panel.axhline(0.0, color="grey", linewidth=0.8)
            panel.set_ylabel(label)
            panel.set_title(f"{name}: {'dot product' if key == 'dot' else 'cosine'} with the downstream gradient",
                            fontsize="medium")
            if row == 0 and column == 0:
                panel.legend(loc="best", fontsize="small")
    if scheduled:
        panel = axes[-1][0]
        for name, color in zip(names, colors):
            w = weights[name]
            # Each step's weight held until the next step (the last one drawn to the end of the run).
            panel.plot(range(len(w) + 1), [*w, w[-1]], drawstyle="steps-post", color=color, label=name)
        panel.set(ylabel="objective weight α_k(t)", title="Weights over the run")
        panel.legend(loc="best", fontsize="small")
        axes[-1][1].set_visible(False)
    for panel in axes[-1]:
        panel.set_xlabel("training step")
    figure.suptitle(f"How each pre-training objective's gradient aligns with the downstream gradient "
                    f"({report['downstream']}), per probe step")
    return figure


def _taylor(report: dict[str, Any]) -> Figure:
    steps = report["steps"]
    x = [s["step"] for s in steps]
    first = [s["predicted_delta"]["first_order"] for s in steps]
    both = [s["predicted_delta"]["first_order"] + s["predicted_delta"]["second_order"] for s in steps]
    actual = [s["actual_delta"] for s in steps]
    figure = Figure(figsize=(11, 4.5), layout="constrained")
    over_steps, scatter = figure.subplots(1, 2)
    over_steps.plot(x, actual, marker="o", color="black", label="actual change")
    over_steps.plot(x, first, marker="x", linestyle="--", label="predicted, first order")
    over_steps.plot(x, both, marker="+", linestyle=":", label="predicted, first + second order")
    over_steps.axhline(0.0, color="grey", linewidth=0.8)
    over_steps.set(title="Change in the downstream loss at each step (below 0: it fell)", xlabel="training step",
                   ylabel="change in downstream loss D (loss units)")
    over_steps.legend(fontsize="small")
    scatter.scatter(actual, first, marker="x", label="first order")
    scatter.scatter(actual, both, marker="+", label="first + second order")
    low, high = min(actual + first + both), max(actual + first + both)
    scatter.plot([low, high], [low, high], color="grey", linewidth=0.8, label="predicted = actual")
    scatter.set(title="Predicted against actual change, one point per step", xlabel="actual change in D (loss units)",
                ylabel="predicted change in D (loss units)")
    scatter.legend(fontsize="small")
    return figure


def _spectrum(report: dict[str, Any]) -> Figure:
    spectra = report["summary"]["spectrum"]
    figure = Figure(figsize=(11, 4.5), layout="constrained")
    values_axes, alignment_axes = figure.subplots(1, 2)
    for entry in spectra:
        values_axes.plot(range(1, len(entry["eigenvalues"]) + 1), entry["eigenvalues"], marker="o",
                         label=f"step {entry['step']}")
    values_axes.set(title="Largest eigenvalues of the downstream loss's Hessian H_D",
                    xlabel="eigenvalue rank (1 = largest)", ylabel="eigenvalue (curvature of D)")
    values_axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    alignment_axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    values_axes.legend()
    last = spectra[-1]
    rows = {**last["alignment"], "∇D": last["downstream_alignment"]}
    width = 0.8 / len(rows)
    for i, (name, cosines) in enumerate(rows.items()):
        alignment_axes.bar([j + 1 + (i - (len(rows) - 1) / 2) * width for j in range(len(cosines))],
                           [abs(c) for c in cosines], width=width, label=name)
    alignment_axes.set(title=f"How each gradient lines up with the top eigenvectors, step {last['step']}",
                       xlabel="eigenvector rank (1 = largest eigenvalue)", ylabel="|cosine| (0 to 1)")
    alignment_axes.legend()
    return figure
