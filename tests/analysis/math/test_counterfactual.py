"""The exact one-step counterfactual of an Adam/AdamW step against re-running that step with
other weights (float64), and the record's stencil model through its points."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from objreg.analysis.math.counterfactual import AdamCounterfactual, stencil
from objreg.analysis.math.functional import detached, flat_dot, named_shared
from objreg.analysis.math.mixture import counterfactual
from objreg.analysis.math.optimizers import adam_settings
from objreg.analysis.math.weight_model import step_model

NAMES = ["mlm", "sop"]
USED = {"mlm": 1.0, "sop": 1.0}
#: Eight other weight vectors: other mixtures at the same total, and other totals.
OTHERS = [{"mlm": 1.5, "sop": 0.5}, {"mlm": 0.5, "sop": 1.5}, {"mlm": 2.0, "sop": 0.0}, {"mlm": 0.0, "sop": 2.0},
          {"mlm": 1.25, "sop": 0.75}, {"mlm": 0.7, "sop": 1.3}, {"mlm": 3.0, "sop": 1.0}, {"mlm": 0.3, "sop": 0.6}]


class StepAt:
    """A float64 trainer stopped before step ``step``: the objectives' gradients of that step are
    in hand, and the step can be taken with any weights and any learning rate, then undone."""

    def __init__(self, tiny_trainer, optimizer, step, lr):
        self.trainer = trainer = tiny_trainer(optimizer.removesuffix("_coupled_decay"), lr=lr, steps=step + 1)
        if optimizer.endswith("_coupled_decay"):  # Adam's L2 decay: λθ added to the gradient it steps on
            for group in trainer.optimizer.param_groups:
                group["weight_decay"] = 0.1
        for t in range(step):
            trainer.step(t, probe=False)
        _, batches = trainer.next_batches()
        _, self.gradients = trainer.accumulate_gradients(step, batches, USED, keep=True)
        self.shared = named_shared(trainer.model, list(trainer.shared))
        self.downstream = trainer.probe.downstream
        self.before = detached(self.shared)
        self.params = {n: p.detach().clone() for n, p in trainer.trainable.items()}
        self.head_gradients = {n: p.grad.clone() for n, p in trainer.trainable.items() if n not in self.shared}
        self.state = copy.deepcopy(trainer.optimizer.state_dict())
        self.start = self.downstream.loss(trainer.model)
        self.curvature = self.downstream.curvature(trainer.model, self.before)

    def predicted(self, weights, lr):
        """∇D·Δθ(α) + ½ Δθ(α)ᵀ H_D Δθ(α) with the exact counterfactual step."""
        optimizer = self.trainer.optimizer
        for group in optimizer.param_groups:
            group["lr"] = lr
        change = AdamCounterfactual(optimizer, self.shared, self.gradients,
                                    adam_settings(optimizer, self.shared)).step(weights)
        gradient, (product,) = self.curvature.gradient_and_products([change])
        return float(flat_dot(gradient, change)) + 0.5 * float(flat_dot(change, product))

    def rerun(self, weights, lr):
        """The change of D when this step is taken with ``weights`` at ``lr`` (then undone)."""
        trainer, optimizer = self.trainer, self.trainer.optimizer
        for name, p in trainer.trainable.items():
            if name in self.shared:
                p.grad = sum(weights[k] * self.gradients[k][name] for k in weights)
            else:
                p.grad = self.head_gradients.get(name)
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.step()
        after = self.downstream.loss(trainer.model)
        with torch.no_grad():
            for name, p in trainer.trainable.items():
                p.copy_(self.params[name])
        optimizer.load_state_dict(copy.deepcopy(self.state))
        return after - self.start


@pytest.mark.parametrize("optimizer", ["adam", "adamw", "adam_coupled_decay"])
@pytest.mark.parametrize("step", [0, 3])
def test_the_exact_adam_counterfactual_is_re_running_the_step_up_to_the_taylor_remainder(
        tiny_trainer, optimizer, step):
    lr = 2e-4
    at = StepAt(tiny_trainer, optimizer, step, lr)
    errors = {}
    for rate in (lr, lr / 2):
        used_predicted, used_actual = at.predicted(USED, rate), at.rerun(USED, rate)
        for weights in OTHERS:
            predicted, actual = at.predicted(weights, rate), at.rerun(weights, rate)
            gain, realised = used_predicted - predicted, used_actual - actual
            if rate == lr:
                assert abs(gain - realised) <= 0.1 * abs(realised), (weights, gain, realised)
            errors.setdefault(rate, []).append(abs(predicted - actual))
    # Third-order remainder: halving the learning rate cuts the error about 8×, over the eight
    # vectors together (one by one 7.3 to 11.3, where the third-order coefficient is not near 0).
    big, small = np.array(errors[lr]), np.array(errors[lr / 2])
    assert 7 < big.sum() / small.sum() < 10 and 7 < np.median(big / small) < 10, (big, small)
    assert np.all(small < big)


def test_the_probe_records_the_exact_counterfactual_and_the_model_goes_through_it(tiny_trainer):
    """The probe's points against re-running the step with their weights; the step model: at the
    weights used the record's own prediction, its second-order term through the stencil's points;
    the run's optimum one of the grid's points, predicted by the exact terms there."""
    lr = 2e-4
    (record,) = tiny_trainer("adamw", lr=lr, steps=1).run()
    points, first_order = record["counterfactual"]["points"], record["counterfactual"]["grid"]
    assert [p["weights"] for p in points] == stencil(USED, NAMES, 0.25) == [{"mlm": 1.5, "sop": 0.5},
                                                                           {"mlm": 0.5, "sop": 1.5}]
    assert [p["weights"]["mlm"] for p in first_order] == pytest.approx(
        [1 + j / 16 for j in range(1, 9)] + [1 - j / 16 for j in range(1, 9)])
    model = step_model(record, "adamw", lr, NAMES)
    used = model.improvement(USED)
    assert used["first_order"] == pytest.approx(-record["predicted_delta"]["first_order"], rel=1e-12)
    assert used["first_plus_second_order"] == pytest.approx(
        -(record["predicted_delta"]["first_order"] + record["predicted_delta"]["second_order"]), rel=1e-12)
    for point in points:
        predicted = model.improvement(point["weights"])
        assert predicted["first_plus_second_order"] - predicted["first_order"] == pytest.approx(
            -point["second_order"], rel=1e-9)
        rerun = tiny_trainer("adamw", lr=lr, steps=1)
        rerun.weights_by_step = [dict(point["weights"])]
        (again,) = rerun.run()
        assert point["first_order"] + point["second_order"] == pytest.approx(again["actual_delta"], rel=1e-3)
    best = counterfactual([record], NAMES, "adamw", lr, radius=0.25)["best"]
    grid_point = next(p for p in [*first_order, {"weights": USED, "first_order": record["predicted_delta"][
        "first_order"]}] if p["weights"] == pytest.approx(best["weights"]))
    assert best["first_order"] == pytest.approx(-grid_point["first_order"], rel=1e-12)
    second = model.improvement(best["weights"])
    assert best["first_plus_second_order"] == pytest.approx(
        best["first_order"] + second["first_plus_second_order"] - second["first_order"], rel=1e-12)

    def predicted(point):  # the grid point's exact first-order term plus the model's second-order term
        terms = model.improvement(point["weights"])
        return -point["first_order"] + terms["first_plus_second_order"] - terms["first_order"]

    assert best["first_plus_second_order"] == pytest.approx(max(
        [predicted(p) for p in first_order] + [used["first_plus_second_order"]]), rel=1e-12)


def test_the_stencil_model_recovers_a_quadratic_of_three_objectives():
    """With three objectives the six points over-determine the five coefficients on the plane:
    a quadratic through them is found exactly, and so are its values elsewhere on the plane."""
    names = ["a", "b", "c"]
    used = {"a": 1.0, "b": 0.5, "c": 1.5}
    rng = np.random.default_rng(0)
    g1, g2 = rng.normal(size=3), rng.normal(size=3)
    h1, h2 = (lambda m: m + m.T)(rng.normal(size=(3, 3))), (lambda m: m + m.T)(rng.normal(size=(3, 3)))

    def first(w):
        x = np.array([w[n] for n in names])
        return 0.3 + g1 @ x + 0.5 * x @ h1 @ x

    def second(w):
        x = np.array([w[n] for n in names])
        return -0.1 + g2 @ x + 0.5 * x @ h2 @ x

    points = stencil(used, names, 0.25)
    assert len(points) == 6 and all(sum(p.values()) == pytest.approx(3.0) for p in points)
    record = {"weights": used, "predicted_delta": {"first_order": first(used), "second_order": second(used)},
              "counterfactual": {"points": [{"weights": p, "first_order": first(p), "second_order": second(p)}
                                            for p in points]}}
    model = step_model(record, "adam", 1e-3, names)
    for w in [{"a": 0.2, "b": 1.3, "c": 1.5}, {"a": 1.6, "b": 0.4, "c": 1.0}, used]:
        predicted = model.improvement(w)
        assert predicted["first_order"] == pytest.approx(-first(w), rel=1e-9, abs=1e-12)
        assert predicted["first_plus_second_order"] == pytest.approx(-(first(w) + second(w)), rel=1e-9, abs=1e-12)


def test_the_stencil_stays_at_non_negative_weights():
    # sop at 0 can only gain: two points on that side; the total is held everywhere.
    points = stencil({"mlm": 2.0, "sop": 0.0}, NAMES, 0.25)
    assert points == [{"mlm": 1.75, "sop": 0.25}, {"mlm": 1.5, "sop": 0.5}]
    assert stencil({"mlm": 0.0, "sop": 0.0}, NAMES, 0.25) == []
