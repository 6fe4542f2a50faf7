"""The plots show only what varies, with one row (and band) per objective and axes in words; the
summary cosine has the sign of the mean dot."""

from __future__ import annotations

import math

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from objreg.analysis.probe import plots
from objreg.analysis.probe.report import pooled_cosine, summarise


def probe(step: int, dots: dict[str, float], norms: dict[str, float], downstream_norm: float,
          weights: dict[str, float]) -> dict:
    return {
        "step": step, "weights": weights, "losses": {n: 1.0 for n in dots}, "downstream_loss": 3.0 - 0.1 * step,
        "downstream_loss_after": 2.9 - 0.1 * step, "downstream_grad_norm": downstream_norm, "actual_delta": -0.1,
        "predicted_delta": {"first_order": -0.09, "second_order": 0.01},
        "alignment": {n: {"dot": d, "cosine": d / (norms[n] * downstream_norm), "ci95": [d - 1, d + 1],
                          "ci95_bootstrap": [d - 1, d + 1],
                          "cosine_ci95": [(d - 1) / (norms[n] * downstream_norm), (d + 1) / (norms[n] * downstream_norm)],
                          "conflict_fraction": 0.5, "grad_norm": norms[n], "update_cosine": 0.1}
                      for n, d in dots.items()},
        "second_order": {f"{a},{b}": 1.0 for a in dots for b in dots if a <= b},
        "update": {"first_order": {n: -0.01 for n in dots}, "second_order": {}, "decomposition_residual": 0.0,
                   "norm": 0.1, "norms": {n: 0.1 for n in dots}, "conditioning": 1.0},
        "taylor": {"error": {"first_order": 0.01, "first_plus_second_order": 0.001}, "rounding_floor": 1e-9,
                   "second_to_first": 0.1, "inside_regime": True},
    }


def test_the_summary_cosine_has_the_sign_of_the_mean_dot():
    # Two probes: a small negative dot with tiny gradients (cosine −0.9) and a larger positive dot
    # with large gradients (cosine +0.1). The mean dot is positive; the mean of the cosines is not.
    steps = [probe(0, {"mlm": -0.09}, {"mlm": 0.1}, 1.0, {"mlm": 1.0}),
             probe(1, {"mlm": 10.0}, {"mlm": 10.0}, 10.0, {"mlm": 1.0})]
    alignment = summarise(["mlm"], steps)["alignment"]["mlm"]
    assert alignment["dot"] > 0
    assert alignment["mean_probe_cosine"] == pytest.approx((-0.9 + 0.1) / 2) and alignment["mean_probe_cosine"] < 0
    assert alignment["cosine"] > 0
    assert alignment["cosine"] == pytest.approx((-0.09 + 10.0) / math.sqrt((0.01 + 100.0) * (1.0 + 100.0)))
    # One probe: the probe's own cosine.
    assert pooled_cosine([0.5], [2.0], [4.0]) == pytest.approx(0.5 / 8.0)
    assert pooled_cosine([0.0], [0.0], [4.0]) == 0.0


def report(weights_by_step: dict[str, list[float]]) -> dict:
    names = list(weights_by_step)
    steps = [probe(t, {n: 0.5 - 0.1 * t + i for i, n in enumerate(names)}, {n: 2.0 for n in names}, 3.0,
                   {n: weights_by_step[n][t] for n in names}) for t in range(4)]
    return {"pretrain": names, "downstream": "qa", "steps": steps,
            "summary": {"weights_by_step": weights_by_step, "spectrum": []}}


def visible_axes(figure):
    return [axes for axes in figure.axes if axes.get_visible()]


def test_constant_weights_get_no_panel_and_each_objective_its_own_row():
    figure = plots._alignment(report({"mlm": [1.0] * 4, "sop": [0.5] * 4}))
    axes = visible_axes(figure)
    assert len(axes) == 4  # dot and cosine for each of the two objectives, no weights panel
    titles = [a.get_title() for a in axes]
    assert titles == ["mlm: dot product with the downstream gradient", "mlm: cosine with the downstream gradient",
                      "sop: dot product with the downstream gradient", "sop: cosine with the downstream gradient"]
    for a in axes:
        assert len(a.collections) == 1  # one band per panel: bands never overlap
    labels = [a.get_ylabel() for a in axes] + [a.get_xlabel() for a in axes[-2:]]
    assert "dot product with ∇D\n(loss² per parameter²)" in labels and "cosine with ∇D\n(−1 to 1)" in labels
    assert labels[-2:] == ["training step", "training step"]


def test_a_schedule_adds_the_weights_panel():
    figure = plots._alignment(report({"mlm": [1.0, 0.75, 0.5, 0.25], "sop": [1.0] * 4}))
    axes = visible_axes(figure)
    assert len(axes) == 5 and axes[-1].get_ylabel() == "objective weight α_k(t)"


def test_the_taylor_plot_labels_its_axes_in_words(tmp_path):
    figure = plots._taylor(report({"mlm": [1.0] * 4}))
    over_steps, scatter = figure.axes
    assert over_steps.get_xlabel() == "training step"
    assert over_steps.get_ylabel() == "change in downstream loss D (loss units)"
    assert scatter.get_xlabel() == "actual change in D (loss units)"
    written = plots.write_plots(report({"mlm": [1.0] * 4}), tmp_path)
    assert [p.name for p in written] == ["alignment.png", "taylor.png"] and all(p.stat().st_size for p in written)


def sparse_report() -> dict:
    """Probes at steps 0, 4, 8 and 9 (``--probe-every 4`` over ten steps)."""
    steps = [probe(t, {"mlm": 0.5 - 0.1 * t}, {"mlm": 2.0}, 3.0, {"mlm": 1.0}) for t in (0, 4, 8, 9)]
    return {"pretrain": ["mlm"], "downstream": "qa", "steps": steps,
            "summary": {"weights_by_step": {"mlm": [1.0] * 10}, "spectrum": []}}


def step_ticks(axes, figure) -> list[float]:
    FigureCanvasAgg(figure).draw()
    return [t for t in axes.get_xticks() if axes.get_xlim()[0] <= t <= axes.get_xlim()[1]]


def test_sparse_probes_are_markers_with_error_bars_on_whole_steps():
    figure = plots._alignment(sparse_report())
    for axes in visible_axes(figure):
        probes = [line for line in axes.get_lines() if list(line.get_xdata()) == [0, 4, 8, 9]]
        # The probes' markers and the error bars' caps: none of them a line joining the probes.
        assert all(line.get_linestyle() == "None" for line in probes)
        assert [line.get_marker() for line in probes].count("o") == 1
        assert not axes.collections or all(len(c.get_paths()) == 4 for c in axes.collections)  # an error bar each
        assert all(float(t).is_integer() for t in step_ticks(axes, figure))
    taylor = plots._taylor(sparse_report())
    over_steps = taylor.axes[0]
    assert all(line.get_linestyle() == "None" for line in over_steps.get_lines() if len(line.get_xdata()) == 4)
    assert all(float(t).is_integer() for t in step_ticks(over_steps, taylor))


def test_dense_probes_keep_their_lines_and_bands_and_whole_steps():
    figure = plots._alignment(report({"mlm": [1.0] * 4}))
    for axes in visible_axes(figure):
        assert len(axes.collections) == 1  # the band
        assert any(line.get_linestyle() == "-" for line in axes.get_lines())
        assert all(float(t).is_integer() for t in step_ticks(axes, figure))
