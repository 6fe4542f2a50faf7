"""PNG plots of a report: alignment over steps, predicted vs actual change, the Hessian spectrum,
the counterfactual weights.

Panels only for what varies (the weights only where a schedule moves them), one row per
objective so that confidence bands never overlap, and axes labelled in words with their units.
Training steps are whole numbers on every axis; where the probes are sparse (``--probe-every``),
each probe is a marker with its interval as an error bar, never a line joining probes across the
steps between them that nobody measured.

matplotlib is imported here only, and this module only when plots are written, so the CLI starts
fast. Figures are drawn on the Agg canvas directly (no pyplot: no global figure state, no GUI
backend), and each file is written to a temporary name and renamed into place.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.ticker import MaxNLocator

from objreg.analysis.math.trust_region import trust_box
from objreg.analysis.math.weight_model import Quadratic
from objreg.toolkit.atomic import atomic_file


def write_plots(report: dict[str, Any], out_dir: Path) -> list[Path]:
    """``alignment.png``, ``taylor.png``, (when the report has a spectrum) ``spectrum.png`` and
    (with two objectives or more) ``counterfactual.png``."""
    written = [_save(_alignment(report), out_dir / "alignment.png"), _save(_taylor(report), out_dir / "taylor.png")]
    if report["summary"].get("spectrum"):
        written.append(_save(_spectrum(report), out_dir / "spectrum.png"))
    if len(report["pretrain"]) >= 2 and report["summary"].get("counterfactual"):
        written.append(_save(_counterfactual(report), out_dir / "counterfactual.png"))
    return written


def _save(figure: Figure, path: Path) -> Path:
    FigureCanvasAgg(figure)
    with atomic_file(path) as f:
        figure.savefig(f, format="png", dpi=110)
    return path


def _varies(values: list[float]) -> bool:
    return any(v != values[0] for v in values)


def _sparse(steps: list[int]) -> bool:
    """Whether steps between probes went unmeasured (a line would join probes across them)."""
    return any(b - a > 1 for a, b in zip(steps, steps[1:]))


def _steps_axis(panel: Any) -> None:
    panel.xaxis.set_major_locator(MaxNLocator(integer=True))


def _alignment(report: dict[str, Any]) -> Figure:
    """One row per objective (its own band, so intervals never overlap): the dot product and the
    cosine with ∇D over the probe steps, each with its 95% interval over examples; a weights panel
    only where some weight changes over the run."""
    steps = report["steps"]
    names = report["pretrain"]
    x = [s["step"] for s in steps]
    sparse = _sparse(x)
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
            # A withheld interval (the cosine's where the gradient noise is too large) leaves a gap.
            intervals = [a[band] or (float("nan"), float("nan")) for a in probes]
            low, mean, high = [i[0] for i in intervals], [a[key] for a in probes], [i[1] for i in intervals]
            if sparse:
                panel.errorbar(x, mean, yerr=[[m - lo for m, lo in zip(mean, low)], [hi - m for m, hi in zip(mean, high)]],
                               fmt="o", markersize=4, capsize=3, color=color, ecolor=color, elinewidth=1,
                               label="mean over examples, 95% interval")
            else:
                panel.fill_between(x, low, high, color=color, alpha=0.2, linewidth=0,
                                   label="95% interval over examples")
                panel.plot(x, mean, marker="o", markersize=3, color=color, label="mean over examples")
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
        _steps_axis(panel)  # the axes share x: one locator sets every row
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
    lines = ("none", "none", "none") if _sparse(x) else ("-", "--", ":")
    over_steps.plot(x, actual, marker="o", linestyle=lines[0], color="black", label="actual change")
    over_steps.plot(x, first, marker="x", linestyle=lines[1], label="predicted, first order")
    over_steps.plot(x, both, marker="+", linestyle=lines[2], label="predicted, first + second order")
    _steps_axis(over_steps)
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


def _counterfactual(report: dict[str, Any]) -> Figure:
    """The predicted improvement over a grid of the first two objectives' weights (the others at
    their mean weights used) with the line of the same total, the trust region, the mean weights
    used and the optimum; and along that line, to first and to second order."""
    names = list(report["pretrain"])
    data = report["summary"]["counterfactual"]
    model = Quadratic.from_dict(names, data["model"])
    center = model.vector(data["mean_weights"])
    total = float(center.sum())
    region = data["trust_region"]
    lower, upper = trust_box(center, region["radius"], region["low"], region["high"])
    a, b = 0, 1  # the first two objectives; the others stay at their mean weights
    rest = total - sum(center[i] for i in range(len(names)) if i not in (a, b))

    def improvement(x: np.ndarray, y: np.ndarray, key: str) -> np.ndarray:
        out = np.empty_like(x)
        for index in np.ndindex(x.shape):
            alpha = center.copy()
            alpha[a], alpha[b] = x[index], y[index]
            out[index] = model.improvement(alpha)[key]
        return out

    grid = np.linspace(0.0, max(total, 1e-12), 61)
    x, y = np.meshgrid(grid, grid)
    z = improvement(x, y, "first_plus_second_order")
    figure = Figure(figsize=(12, 5), layout="constrained")
    plane, line = figure.subplots(1, 2)
    limit = float(np.abs(z).max()) or 1.0
    image = plane.pcolormesh(x, y, z, cmap="RdBu", vmin=-limit, vmax=limit, shading="auto")
    plane.contour(x, y, z, levels=9, colors="black", linewidths=0.4)
    figure.colorbar(image, ax=plane, label="predicted improvement of D (loss units; > 0: D falls)")
    plane.plot([0, rest], [rest, 0], color="black", linestyle="--", linewidth=1, label="same total weight")
    plane.add_patch(_rectangle(lower[a], lower[b], upper[a], upper[b]))
    best = data.get("best")
    plane.plot(center[a], center[b], "o", color="black", label="mean weights used")
    if best is not None:
        plane.plot(best["weights"][names[a]], best["weights"][names[b]], "*", color="gold", markersize=14,
                   markeredgecolor="black", label="best in the trust region")
    plane.set(xlabel=f"weight of {names[a]}", ylabel=f"weight of {names[b]}",
              title="Predicted improvement over the run, first + second order")
    plane.legend(loc="upper right", fontsize="small")

    along = np.linspace(0.0, rest, 101)
    for key, style, label in (("first_order", "--", "first order"),
                              ("first_plus_second_order", "-", "first + second order")):
        line.plot(along, improvement(along, rest - along, key), linestyle=style, label=label)
    line.axvspan(max(lower[a], rest - upper[b]), min(upper[a], rest - lower[b]), color="grey", alpha=0.2,
                 label="trust region")
    line.axvline(center[a], color="black", linewidth=0.8, label="mean weights used")
    if best is not None:
        line.axvline(best["weights"][names[a]], color="goldenrod", linewidth=1.5, label="best")
    line.axhline(0.0, color="grey", linewidth=0.8)
    line.set(xlabel=f"weight of {names[a]} (the rest of the total to {names[b]})",
             ylabel="predicted improvement of D (loss units)", title="Along the line of the same total weight")
    line.legend(fontsize="small")
    held = f"; {', '.join(names[2:])} held at their mean weights" if len(names) > 2 else ""
    figure.suptitle(f"Counterfactual weights ({data['optimizer_model'].split(':')[0]} model{held}); a local model: "
                    f"trust it near the weights used")
    return figure


def _rectangle(x0: float, y0: float, x1: float, y1: float) -> Rectangle:
    return Rectangle((x0, y0), x1 - x0, y1 - y0, fill=False, edgecolor="black", linewidth=1.2,
                     label="trust region (each weight)")


def write_screen_plot(report: dict[str, Any], path: Path) -> Path:
    """``objreg screen``'s forest plot: each runnable candidate's mean score with its interval,
    best at the top, a line at zero (no predicted change of D*)."""
    entries = [e for e in report["candidates"] if e["runnable"]]
    figure = Figure(figsize=(7, 1.2 + 0.35 * len(entries)))
    panel = figure.add_subplot()
    rows = np.arange(len(entries))[::-1]
    means = np.array([e["score"]["mean"] for e in entries])
    lows = np.array([e["score"]["low"] for e in entries])
    highs = np.array([e["score"]["high"] for e in entries])
    panel.errorbar(means, rows, xerr=[means - lows, highs - means], fmt="o", capsize=3)
    panel.axvline(0.0, color="grey", linestyle="--", linewidth=0.8)
    panel.set_yticks(rows, [f"{'=' if e['tied'] else ''}{e['rank']}  {e['candidate']}" for e in entries])
    panel.set_xlabel("score −∇D*·Δθ per step (mean, 95% batch-means interval)")
    panel.set_title(f"objreg screen → {report['downstream']} ({report['budget']} per candidate)", fontsize=9)
    figure.tight_layout()
    return _save(figure, path)
