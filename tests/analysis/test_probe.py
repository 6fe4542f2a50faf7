"""What a probe measures, against independent computations on a tiny model: the step's parts add
up to Δθ, the first-order prediction is ∇D·Δθ, the alignment dot is ⟨∇L_k, ∇D⟩, and S is gᵀ H_D g."""

from __future__ import annotations

import pytest
import torch

from objreg.analysis.curvature import hvp_double_backward
from objreg.analysis.functional import ObjectiveFunction, detached, flat_dot, requiring_grad, shared_parameters


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
    trainer.model.eval()
    pending = trainer.probe.measure(step, weights, trainer.optimizer, tokens, batches, losses, gradients)
    inspected = inspect(batches)
    before = {n: t.clone() for n, t in detached(shared_parameters(trainer.model)).items()}
    trainer.optimizer.step()
    record = trainer.probe.finish(pending)
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
    assert set(pending.parts) == {"mlm", "sop"} | ({"momentum", "weight_decay"} if adam else set())
    for name in before:
        total = sum(part[name] for part in pending.parts.values())
        torch.testing.assert_close(total, after[name] - before[name], rtol=1e-9, atol=1e-14)
    assert record["update"]["decomposition_residual"] <= 1e-10


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
