"""``counterfactual.png``: the predicted downstream improvement over a grid of two objectives'
weights, from the report's ``summary.counterfactual`` (:mod:`objreg.analysis.mixture`).

Left, the whole grid (other objectives held at their mean weights used), with the line of the
total weight the optimum keeps, the trust region, the mean weights used and the optimum. Right,
the improvement along that line, to first order and to second order, the trust region shaded.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from matplotlib.figure import Figure

from objreg.analysis.mixture import Quadratic, trust_box


def counterfactual_figure(report: dict[str, Any]) -> Figure:
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


def _rectangle(x0: float, y0: float, x1: float, y1: float) -> Any:
    from matplotlib.patches import Rectangle

    return Rectangle((x0, y0), x1 - x0, y1 - y0, fill=False, edgecolor="black", linewidth=1.2,
                     label="trust region (each weight)")
