"""``make_probe``, the one front door: each mode makes the probe its class makes from the same
arguments (the same records), passes its settings and options through, and refuses what the mode
does not take, by name."""

from __future__ import annotations

import copy

import probe_stand_ins as stand_ins
import pytest
import torch
from probe_stand_ins import EVAL, LOSSES, WEIGHTS, step_batches, task_loss

import objreg
from objreg.analysis.probe.in_run import InRunAlignment
from objreg.analysis.probe.make import MODE_OPTIONS, MODES
from objreg.core.errors import InvalidParameterError, ProbeStateError


def measured_steps(model, opt, probe, steps):
    generator = torch.Generator().manual_seed(1)
    for step in range(steps):
        batches = step_batches(generator)
        opt.zero_grad()
        sum(w * LOSSES[k](model, batches[k]).mean() for k, w in WEIGHTS.items()).backward()
        measured = probe.measure(batches, step=step)
        opt.step()
        probe.finish(measured)
    return probe.records


def riding_steps(model, opt, alignment, steps):
    generator = torch.Generator().manual_seed(1)
    for _ in range(steps):
        batches = step_batches(generator)
        opt.zero_grad()
        with alignment.step():
            sum(w * alignment.losses(k, LOSSES[k](model, batches[k])).mean() for k, w in WEIGHTS.items()).backward()
        opt.step()
    return alignment.records


def test_full_mode_is_the_transfer_probe_with_its_settings_and_options():
    model, opt = stand_ins.make("adam")
    twin = copy.deepcopy(model)
    twin_opt = torch.optim.Adam(twin.parameters(), lr=opt.param_groups[0]["lr"])
    settings = objreg.ProbeSettings(seed=3, spectrum=1, counterfactual_radius=0.1)
    probe = objreg.make_probe(model, task_loss, objectives=LOSSES, optimizer=opt, eval_batches=EVAL, weights=WEIGHTS,
                              settings=settings, steps=2)
    assert isinstance(probe, objreg.TransferProbe) and probe.mode == "full"
    assert probe.settings == settings
    direct = objreg.TransferProbe(twin, LOSSES, task_loss, twin_opt, eval_batches=EVAL, weights=WEIGHTS, seed=3,
                                  spectrum=1, counterfactual_radius=0.1, steps=2)
    made, by_class = measured_steps(model, opt, probe, 2), measured_steps(twin, twin_opt, direct, 2)
    assert made == by_class
    assert all("spectrum" in record for record in made)  # spectrum=1 with steps=2: both steps
    reach = max(abs(point["weights"][k] - WEIGHTS[k]) for point in made[0]["counterfactual"]["points"] for k in WEIGHTS)
    assert reach == pytest.approx(0.1 * sum(WEIGHTS.values()))  # the radius: a share of the weights' total


def test_in_run_mode_is_in_run_alignment_with_its_options():
    model, opt = stand_ins.make("sgd", lr=0.5)
    twin = copy.deepcopy(model)
    twin_opt = torch.optim.SGD(twin.parameters(), lr=0.5)
    probe = objreg.make_probe(model, task_loss, mode="in_run", eval_batches=EVAL, refresh_every=2)
    assert isinstance(probe, InRunAlignment) and probe.mode == "in_run"
    made = riding_steps(model, opt, probe, 3)
    by_class = riding_steps(twin, twin_opt, InRunAlignment(twin, task_loss, eval_batches=EVAL, refresh_every=2), 3)
    assert made == by_class
    assert [r["downstream_grad_age"] for r in made] == [0, 1, 0]


def test_every_mode_names_the_options_it_takes():
    assert set(MODE_OPTIONS) == set(MODES)


@pytest.mark.parametrize("arguments, message", [
    ({"mode": "riding"}, "mode must be one of full, in_run, sharded, first_order, got 'riding'"),
    ({"mode": "first_order", "objectives": LOSSES}, "mode first_order does not take objectives"),
    ({"mode": "first_order", "refresh_every": 2}, "mode first_order does not take refresh_every (it takes "
                                                  "second_order)"),
    ({"refresh_every": 2}, "mode full does not take refresh_every (it takes steps, batch_coupled, whole_batches, "
                           "decode)"),
    ({"mode": "in_run", "steps": 4}, "mode in_run does not take steps (it takes refresh_every, per_example)"),
    ({"mode": "in_run", "objectives": LOSSES}, "mode in_run does not take objectives: the loop names"),
    ({"mode": "in_run", "optimizer": "the loop's"}, "mode in_run does not take optimizer"),
    ({"mode": "in_run", "weights": WEIGHTS}, "mode in_run does not take weights"),
    ({"mode": "in_run", "settings": objreg.ProbeSettings(seed=1)}, "mode in_run takes no probe settings"),
    ({"mode": "first_order", "settings": objreg.ProbeSettings(seed=1)}, "mode first_order takes no probe settings"),
    ({"objectives": None}, "mode full needs objectives"),
    ({"optimizer": None}, "mode full needs optimizer"),
    ({"settings": {"seed": 1}}, "settings must be an objreg.ProbeSettings, got dict"),
    ({"mode": "sharded", "whole_batches": True}, "mode sharded does not take whole_batches (it takes steps, "
                                                 "batch_coupled, decode)"),
    ({"mode": "sharded"}, "ShardedProbe takes a model sharded with torch.distributed.fsdp.fully_shard"),
])
def test_what_a_mode_does_not_take_is_refused_by_name(arguments, message):
    model, opt = stand_ins.make("sgd")
    given = {"objectives": LOSSES, "optimizer": opt, "eval_batches": EVAL}
    if arguments.get("mode") in ("in_run", "first_order"):
        given = {"eval_batches": EVAL}
    with pytest.raises(InvalidParameterError) as raised:
        objreg.make_probe(model, task_loss, **{**given, **arguments})
    assert message in str(raised.value)


@pytest.mark.parametrize("second_order", [False, True], ids=["first", "with_second"])
def test_first_order_mode_gives_the_drop_and_curvature_of_the_step_by_autograd(second_order):
    """−∇D·Δθ, ½ Δθᵀ H_D Δθ (a float64 double backward of the whole evaluation set) and ∇D·g of
    the loop's gradient, against the probe's record of one SGD step."""
    model, opt = stand_ins.make("sgd", lr=0.5)
    probe = objreg.make_probe(model, task_loss, mode="first_order", eval_batches=EVAL, second_order=second_order)
    assert probe.mode == "first_order"
    names = list(probe.shared)
    assert names == ["embed.weight", "body.weight", "body.bias", "task_head.weight", "task_head.bias"]  # D reaches
    point = copy.deepcopy(model)  # θ_t, kept apart from the step
    params = [point.get_parameter(n) for n in names]
    before = [p.detach().clone() for p in params]
    rows = sum(b["ids"].shape[0] for b in EVAL)
    value = sum(task_loss(point, b).sum() for b in EVAL) / rows
    reached = torch.autograd.grad(value, params, create_graph=True, allow_unused=True)
    gradient = [torch.zeros_like(p) if g is None else g for p, g in zip(params, reached)]  # the objectives' heads
    batches = step_batches(torch.Generator().manual_seed(1))
    opt.zero_grad()
    sum(w * LOSSES[k](model, batches[k]).mean() for k, w in WEIGHTS.items()).backward()
    loop = {n: torch.zeros_like(p) if p.grad is None else p.grad.clone() for n, p in model.named_parameters()
            if n in names}
    measured = probe.measure(0, loop)
    opt.step()
    record = probe.finish(measured)
    assert probe.records == [record]
    delta = [model.get_parameter(n).detach() - b for n, b in zip(names, before)]
    drop = -sum(float((g * d).sum()) for g, d in zip(gradient, delta))
    curvature = torch.autograd.grad(sum((g * d).sum() for g, d in zip(reached, delta) if g is not None), params,
                                    allow_unused=True)
    curvature = [torch.zeros_like(p) if c is None else c for p, c in zip(params, curvature)]
    assert record["downstream_loss"] == pytest.approx(float(value), rel=1e-12)
    assert record["predicted_drop"] == pytest.approx(drop, rel=1e-10)
    assert record["alignment"] == pytest.approx(sum(float((g * loop[n]).sum()) for n, g in zip(names, gradient)),
                                             rel=1e-10)
    assert record["step_norm"] == pytest.approx(float(torch.cat([d.flatten() for d in delta]).norm()), rel=1e-12)
    if second_order:
        expected = 0.5 * sum(float((c * d).sum()) for c, d in zip(curvature, delta))
        assert record["second_order"] == pytest.approx(expected, rel=1e-9)
    else:
        assert record["second_order"] is None


def test_first_order_mode_refuses_a_finish_without_a_finite_loss():
    model, _ = stand_ins.make("sgd")
    probe = objreg.make_probe(model, task_loss, mode="first_order", eval_batches=EVAL)
    with torch.no_grad():
        next(model.parameters()).fill_(float("nan"))
    measured = probe.measure(3)
    assert measured.downstream_loss != measured.downstream_loss  # NaN
    with pytest.raises(ProbeStateError, match="step 3's D was nan"):
        probe.finish(measured)
