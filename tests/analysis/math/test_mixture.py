"""The quadratic model of the downstream change in the objective weights: its counterfactuals
against re-run training (SGD, float64), its Adam bookkeeping, and the trust-region optimum
against a brute-force grid."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from objreg.analysis.math.mixture import counterfactual, measured_gain_error
from objreg.analysis.math.trust_region import maximise, trust_box
from objreg.analysis.math.weight_model import Quadratic, step_model
from objreg.core.errors import InvalidParameterError

NAMES = ["mlm", "sop"]


def _rerun(tiny_trainer, lr, weights, steps):
    """The same steps (same seed: same data, corruption and start) with constant ``weights``."""
    trainer = tiny_trainer("sgd", lr=lr, steps=steps)
    trainer.weights_by_step = [dict(weights)] * steps
    return trainer.run()


def test_one_step_counterfactual_is_exact_to_second_order_under_sgd(tiny_trainer):
    other = {"mlm": 1.7, "sop": 0.3}
    errors = []
    for lr in (1e-3, 5e-4):
        measured = tiny_trainer("sgd", lr=lr, steps=1).run()[0]  # uniform weights
        predicted = step_model(measured, "sgd", lr, NAMES).improvement(other)
        actual = -_rerun(tiny_trainer, lr, other, 1)[0]["actual_delta"]
        errors.append((abs(predicted["first_order"] - actual), abs(predicted["first_plus_second_order"] - actual)))
    (first_big, both_big), (first_small, both_small) = errors
    assert both_big < first_big and both_small < first_small
    # The remainder of an exact second-order model is third order: halving η cuts it about 8×.
    assert both_big / both_small > 6.0


def test_counterfactual_best_weights_match_rerunning_the_steps_with_them(tiny_trainer):
    lr, steps = 5e-4, 3
    records = tiny_trainer("sgd", lr=lr, steps=steps).run()
    summary = counterfactual(records, NAMES, "sgd", lr, radius=0.3)
    best = summary["best"]["weights"]
    assert best != {"mlm": 1.0, "sop": 1.0}
    rerun = _rerun(tiny_trainer, lr, best, steps)
    actual = rerun[0]["downstream_loss"] - rerun[-1]["downstream_loss_after"]
    predicted = summary["best"]["first_plus_second_order"]
    # Each step is predicted at the recorded parameters: the trajectory's own change is an O(η)
    # share of the first-order term (6.8%, 3.0%, 1.2% at η = 2e-3, 1e-3, 5e-4).
    assert abs(predicted - actual) < 0.02 * abs(summary["best"]["first_order"])
    # ... and small next to what the weights change: the uniform run's improvement.
    uniform = records[0]["downstream_loss"] - records[-1]["downstream_loss_after"]
    assert abs(predicted - actual) < 0.5 * abs(actual - uniform)
    assert (actual - uniform) * (predicted - summary["used"]["first_plus_second_order"]) > 0


def test_model_at_the_weights_used_reproduces_the_recorded_prediction(tiny_trainer):
    """Adam's model scales each part by its weight ratio; at ratio 1 it must give back the
    record's own first- and second-order terms (weight decay included as a fixed part)."""
    for optimizer in ("sgd", "adamw"):
        trainer = tiny_trainer(optimizer, lr=1e-3, steps=3)
        trainer.weights_by_step = [{"mlm": 1.0, "sop": 0.5}, {"mlm": 0.0, "sop": 2.0}, {"mlm": 2.0, "sop": 1.0}]
        for record in trainer.run():
            predicted = step_model(record, optimizer, 1e-3, NAMES).improvement(record["weights"])
            delta = record["predicted_delta"]
            assert predicted["first_order"] == pytest.approx(-delta["first_order"], rel=1e-9, abs=1e-15)
            assert predicted["first_plus_second_order"] == pytest.approx(
                -(delta["first_order"] + delta["second_order"]), rel=1e-9, abs=1e-15)


def _random_model(k, seed, concave=False):
    rng = np.random.default_rng(seed)
    m = rng.normal(size=(k, k))
    # Concave (M positive definite, improvement = −½αᵀMα + …): the optimum is often inside.
    matrix = 20 * m @ m.T if concave else m + m.T
    return Quadratic(tuple(f"o{i}" for i in range(k)), 0.0, rng.normal(size=k), 0.0, np.zeros(k), matrix)


@pytest.mark.parametrize("k,seed,concave", [(2, 0, False), (2, 1, False), (3, 2, False), (3, 3, False),
                                            (2, 5, True), (3, 6, True), (3, 7, True)])
def test_trust_region_optimum_beats_every_point_of_a_grid(k, seed, concave):
    """Indefinite models too: the enumerated faces must find the global optimum."""
    model = _random_model(k, seed, concave)
    center = np.full(k, 1.0)
    lower, upper = trust_box(center, 0.3, 0.0, None)
    best = maximise(model, lower, upper, float(center.sum()))
    assert best.sum() == pytest.approx(k) and np.all(best >= lower - 1e-12) and np.all(best <= upper + 1e-12)
    value = model.improvement(best)["first_plus_second_order"]
    axes = [np.linspace(lower[i], upper[i], 201) for i in range(k - 1)]
    grid = np.stack(np.meshgrid(*axes, indexing="ij"), -1).reshape(-1, k - 1)
    last = k - grid.sum(axis=1)
    points = np.column_stack([grid, last])[(last >= lower[-1] - 1e-9) & (last <= upper[-1] + 1e-9)]
    values = [model.improvement(p)["first_plus_second_order"] for p in points]
    assert value >= max(values) - 1e-12
    assert value - max(values) < 1e-3 * (max(values) - min(values))  # the grid comes close to it


def test_an_optimum_inside_the_trust_region_is_the_closed_form_one():
    # Improvement 0.1 α₀ − 5 (α₀² + α₁²) on α₀ + α₁ = 2: stationary where α₀ − α₁ = 0.01.
    model = Quadratic(("a", "b"), 0.0, np.array([-0.1, 0.0]), 0.0, np.zeros(2), 10 * np.eye(2))
    lower, upper = trust_box(np.ones(2), 0.25)
    assert maximise(model, lower, upper, 2.0) == pytest.approx([1.005, 0.995], abs=1e-12)


def test_trust_region_without_a_feasible_point_is_one_clear_error():
    model = _random_model(2, 0)
    with pytest.raises(InvalidParameterError, match="add up to the total weight"):
        maximise(model, np.array([0.0, 0.0]), np.array([0.5, 0.5]), 2.0)


def test_the_run_level_counterfactual_is_labelled_local_and_shrinks_its_trust_region(tiny_trainer):
    lr = 5e-4
    records = tiny_trainer("sgd", lr=lr, steps=4).run()
    summary = counterfactual(records, NAMES, "sgd", lr, radius=0.4)
    region = summary["trust_region"]
    assert region["given_radius"] == 0.4 and region["radius"] == pytest.approx(0.2)  # 0.4 / √4
    assert all(abs(w - 1.0) <= 0.2 * 2 + 1e-12 for w in summary["best"]["weights"].values())
    scope = summary["scope"]
    assert scope["probed_steps"] == 4 and scope["measured_horizon"] == 4
    assert scope["measured_gain_error"]["median"] > 0.1 and "local estimate" in scope["kind"]
    # The last probed step alone, with the radius as given: exactly its own one-step optimum.
    last = counterfactual(records[-1:], NAMES, "sgd", lr, radius=0.4, horizon=False)
    assert summary["recent"]["best"] == last["best"] and summary["recent"]["used"] == last["used"]
    assert "recent" not in last


def test_the_measured_gain_error_is_the_package_data_docs_quote():
    """The benchmark's figures live in objreg/data/ (not in the code); docs/analysis.md's summary
    row quotes the same medians, rounded to percent."""
    measured = measured_gain_error()
    assert sorted(measured) == ["adam", "sgd"] and all(m["setting"] for m in measured.values())
    page = (Path(__file__).resolve().parents[3] / "docs" / "analysis.md").read_text(encoding="utf-8")
    quoted = re.search(r"median (\d+)% for SGD and (\d+)% for Adam over one step, (\d+)% and (\d+)% over 4, "
                       r"(\d+)% and (\d+)% over 16", page)
    assert quoted is not None
    figures = [round(100 * measured[kind]["by_horizon"][h][0]) for h in (1, 4, 16) for kind in ("sgd", "adam")]
    assert figures == [int(g) for g in quoted.groups()]
