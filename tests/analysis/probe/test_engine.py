"""What a probe measures, against independent computations on a tiny model: the step's parts add
up to Δθ, under Adam each objective's part is its Shapley value over steps replayed from each
objective's gradients alone (momentum included), the first-order prediction is ∇D·Δθ, the
alignment dot is ⟨∇L_k, ∇D⟩, and S is gᵀ H_D g."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from objreg.analysis.math.curvature import hvp_double_backward
from objreg.analysis.math.functional import (
    ObjectiveFunction,
    detached,
    flat_dot,
    flat_norm,
    requiring_grad,
    shared_parameters,
)
from objreg.analysis.math.optimizers import advance


def downstream_function(trainer):
    """``D`` as one function of the shared parameters over the whole, padded evaluation set."""
    downstream = trainer.probe.downstream
    function = ObjectiveFunction(trainer.model, downstream.task, downstream.batch)
    return lambda params: function(params).mean()


def gradient(loss, shared):
    params = requiring_grad(shared)
    return dict(zip(params, torch.autograd.grad(loss(params), list(params.values()))))


def probe_step(trainer, step, inspect=lambda batches: None):
    """One training step of ``trainer`` with the probe driven by hand; ``inspect(batches)`` runs
    between the probe's measurement and the optimizer step. Returns what the probe measured, the
    shared parameters before and after the step, and what ``inspect`` returned."""
    tokens, batches = trainer.next_batches()
    weights = trainer.weights_at(step)
    losses, gradients = trainer.accumulate_gradients(step, batches, weights, keep=True)
    if trainer.coalitions is not None:
        advance(trainer.coalitions, trainer.optimizer, trainer.shared, weights, gradients)
    trainer.model.eval()
    pending = trainer.probe.engine.measure(step, weights, trainer.optimizer, tokens, batches, losses, gradients,
                                           trainer.coalitions)
    inspected = inspect(batches)
    before = {n: t.clone() for n, t in detached(shared_parameters(trainer.model)).items()}
    trainer.optimizer.step()
    record = trainer.probe.engine.finish(pending)
    trainer.next_step = step + 1
    return pending, record, before, detached(shared_parameters(trainer.model)), inspected


def independent(trainer, batches):
    """At the parameters before the step: ``D``, ``∇D``, each objective's mean-loss gradient, and
    ``H_D g_sop``, by plain autograd over the whole padded evaluation set."""
    shared = {n: t.clone() for n, t in detached(shared_parameters(trainer.model)).items()}
    downstream = downstream_function(trainer)
    objective_grads = {
        name: gradient(lambda params, f=ObjectiveFunction(trainer.model, objective, batches[name]): f(params).mean(),
                       shared)
        for name, objective in trainer.objectives.items()
    }
    return {"D": float(downstream(shared)), "grad_D": gradient(downstream, shared), "grads": objective_grads,
            "H_D g_sop": hvp_double_backward(downstream, shared, objective_grads["sop"]), "downstream": downstream}


@pytest.fixture(params=["sgd", "adamw"])
def probed(request, tiny_trainer):
    """A probe on the second step (so Adam has momentum to carry), with the independent values."""
    trainer = tiny_trainer(request.param, lr=1e-2)
    probe_step(trainer, 0)
    pending, record, before, after, values = probe_step(trainer, 1, lambda batches: independent(trainer, batches))
    return trainer, pending, record, before, after, values


def test_the_parts_of_the_step_add_up_to_the_step(probed):
    trainer, pending, record, before, after, _ = probed
    adam = isinstance(trainer.optimizer, torch.optim.AdamW)
    assert set(pending.parts) == {"mlm", "sop"} | ({"weight_decay"} if adam else set())
    for name in before:
        total = sum(part[name] for part in pending.parts.values())
        torch.testing.assert_close(total, after[name] - before[name], rtol=1e-9, atol=1e-14)
    assert record["update"]["decomposition_residual"] <= 1e-10
    assert record["update"]["norm"] == pytest.approx(float(flat_norm({n: after[n] - before[n] for n in before})))
    for part, vector in pending.parts.items():
        assert record["update"]["norms"][part] == pytest.approx(float(flat_norm(vector)), rel=1e-12)
    assert record["update"]["conditioning"] == pytest.approx(
        sum(record["update"]["norms"].values()) / record["update"]["norm"], rel=1e-12)


def test_adam_parts_attribute_momentum_to_the_objectives_that_built_it(tiny_trainer):
    """Three AdamW steps; at the last, each objective's part must be its two-player Shapley value
    ½(u_k + u_N − u_other), with u_k the step of a fresh Adam fed only objective k's weighted
    gradients from every step so far (its momentum included) and u_N the actual step less the
    decoupled decay."""
    trainer = tiny_trainer("adamw", lr=1e-2)
    recorded = []
    for step in range(3):
        pending, _, before, after, _ = probe_step(trainer, step)
        recorded.append({"weights": dict(pending.record["weights"]), "before": before, "after": after})
    # Each objective's gradient at each step, as the trainer accumulated it: recompute from the
    # same batches by replaying the data streams from a fresh trainer.
    replay = tiny_trainer("adamw", lr=1e-2)
    contributions = []
    for step in range(3):
        _, batches = replay.next_batches()
        weights = replay.weights_at(step)
        _, gradients = replay.accumulate_gradients(step, batches, weights, keep=True)
        contributions.append({k: {n: weights[k] * t for n, t in g.items()} for k, g in gradients.items()})
        replay.optimizer.step()
    group = trainer.optimizer.param_groups[0]

    def alone(name):
        params = {n: nn.Parameter(torch.zeros_like(t)) for n, t in contributions[0][name].items()}
        adam = torch.optim.Adam(list(params.values()), lr=group["lr"], betas=group["betas"], eps=group["eps"])
        for c in contributions:
            for n, p in params.items():
                p.grad = c[name][n].clone()
            start = {n: p.detach().clone() for n, p in params.items()}
            adam.step()
        return {n: p.detach() - start[n] for n, p in params.items()}

    u_mlm, u_sop = alone("mlm"), alone("sop")
    last = recorded[-1]
    decay = group["lr"] * group["weight_decay"]
    u_full = {n: last["after"][n] - last["before"][n] + decay * last["before"][n] for n in last["before"]}
    expected = {"mlm": {n: (u_mlm[n] + u_full[n] - u_sop[n]) / 2 for n in u_full},
                "sop": {n: (u_sop[n] + u_full[n] - u_mlm[n]) / 2 for n in u_full}}
    for name in ("mlm", "sop"):
        for n in u_full:
            torch.testing.assert_close(pending.parts[name][n], expected[name][n], rtol=1e-7, atol=1e-12)


def test_the_first_order_prediction_is_grad_d_dot_delta(probed):
    _, _, record, before, after, values = probed
    delta = {n: after[n] - before[n] for n in before}
    assert record["downstream_loss"] == pytest.approx(values["D"], rel=1e-12)
    assert record["downstream_loss_after"] == pytest.approx(float(values["downstream"](after)), rel=1e-12)
    assert record["predicted_delta"]["first_order"] == pytest.approx(float(flat_dot(values["grad_D"], delta)),
                                                                     rel=1e-9)
    assert sum(record["update"]["first_order"].values()) == pytest.approx(
        record["predicted_delta"]["first_order"], rel=1e-9)


def test_the_alignment_dot_is_the_mean_loss_gradient_dot(probed):
    _, _, record, _, _, values = probed
    for name, objective_grad in values["grads"].items():
        expected = float(flat_dot(objective_grad, values["grad_D"]))
        assert record["alignment"][name]["dot"] == pytest.approx(expected, rel=1e-9)


def test_the_interaction_matrix_is_g_h_g(probed):
    _, _, record, _, _, values = probed
    expected = float(flat_dot(values["grads"]["mlm"], values["H_D g_sop"]))
    assert record["second_order"]["mlm,sop"] == pytest.approx(expected, rel=1e-7)
