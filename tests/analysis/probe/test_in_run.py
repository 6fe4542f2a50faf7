"""``InRunAlignment``: the dots of the loop's own backward are today's per-example dots when ``∇D``
is fresh, the stale ``∇D``'s otherwise, and the staleness it reports is the one measured
independently; by hand, attached, beside an attached ``TransferProbe``, with a re-fitted head."""

from __future__ import annotations

import probe_stand_ins as stand_ins
import pytest
import torch
from probe_stand_ins import EVAL, FIT, LOSSES, WEIGHTS, batch, pair_loss, step_batches, task_loss

import objreg
from objreg.analysis.probe.in_run import InRunAlignment
from objreg.core.errors import InvalidParameterError, ProbeStateError

BODY = ("embed.weight", "body.weight", "body.bias")


def make(optimizer="sgd"):
    return stand_ins.make(optimizer, lr=0.5 if optimizer == "sgd" else 0.05)


def by_hand(model, opt, alignment, steps):
    """A loop naming each objective's losses inside ``alignment.step()``; returns each step's
    batches and the shared parameters before it."""
    generator = torch.Generator().manual_seed(1)
    seen = []
    for _ in range(steps):
        batches = step_batches(generator)
        seen.append((batches, {n: p.detach().clone() for n, p in model.named_parameters()}))
        opt.zero_grad()
        with alignment.step():
            loss = sum(w * alignment.losses(k, LOSSES[k](model, batches[k])).mean() for k, w in WEIGHTS.items())
            loss.backward()
        opt.step()
    return seen


def attached(model, opt, alignment, steps):
    generator = torch.Generator().manual_seed(1)
    alignment.attach(opt)
    for _ in range(steps):
        batches = step_batches(generator)
        opt.zero_grad()
        sum(w * alignment.losses(k, LOSSES[k](model, batches[k])).mean() for k, w in WEIGHTS.items()).backward()
        opt.step()
    alignment.detach()


def at(model, values):
    """A copy of ``model`` holding ``values``."""
    import copy

    other = copy.deepcopy(model)
    with torch.no_grad():
        for name, p in other.named_parameters():
            p.copy_(values[name])
    return other


def downstream_grad(model):
    """``∇D`` on the body, by autograd over the whole evaluation set (float64)."""
    params = [model.get_parameter(n) for n in BODY]
    total = sum(task_loss(model, b).sum() for b in EVAL) / sum(b["ids"].shape[0] for b in EVAL)
    return dict(zip(BODY, torch.autograd.grad(total, params)))


def loop_dots(model, name, data, direction):
    """``⟨∇ℓ_i, v⟩`` by one backward per example."""
    params = [model.get_parameter(n) for n in BODY]
    losses = LOSSES[name](model, data)
    out = []
    for i in range(losses.shape[0]):
        grads = torch.autograd.grad(losses[i], params, retain_graph=True)
        out.append(sum(float((g * direction[n]).sum()) for n, g in zip(BODY, grads)))
    return out


def flat(params):
    return torch.cat([params[n].flatten() for n in BODY])


@pytest.mark.parametrize("per_example", [False, True], ids=["hooks", "per_example"])
def test_with_a_fresh_gradient_the_dots_are_a_float64_per_example_loops(per_example):
    model, opt = make()
    alignment = InRunAlignment(model, task_loss, eval_batches=EVAL, refresh_every=1, per_example=per_example)
    seen = by_hand(model, opt, alignment, 3)
    assert alignment.shared == BODY  # the frozen task head: D reaches it, no objective does
    for record, (batches, values) in zip(alignment.records, seen):
        point = at(model, values)
        direction = downstream_grad(point)
        assert record["downstream_grad_age"] == 0
        assert record["downstream_grad_norm"] == pytest.approx(float(flat(direction).norm()), rel=1e-12)
        for name in WEIGHTS:
            expected = loop_dots(point, name, batches[name], direction)
            got = record["alignment"][name]
            assert got["dots"] == pytest.approx(expected, rel=1e-10, abs=1e-14)
            assert got["dot"] == pytest.approx(sum(expected) / len(expected), rel=1e-10, abs=1e-14)
            assert got["conflict_fraction"] == sum(d < 0 for d in expected) / len(expected)


@pytest.mark.parametrize("per_example", [False, True], ids=["hooks", "per_example"])
def test_between_refreshes_the_dots_use_the_stale_gradient_and_its_staleness_is_measured(per_example):
    model, opt = make()
    alignment = InRunAlignment(model, task_loss, eval_batches=EVAL, refresh_every=3, per_example=per_example)
    seen = by_hand(model, opt, alignment, 5)
    assert [r["downstream_grad_age"] for r in alignment.records] == [0, 1, 2, 0, 1]
    assert [r["staleness"] is None for r in alignment.records] == [True, True, True, False, True]
    then = downstream_grad(at(model, seen[0][1]))
    for record, (batches, values) in zip(alignment.records[:3], seen[:3]):
        for name in WEIGHTS:  # steps 1 and 2 ride step 0's ∇D
            expected = loop_dots(at(model, values), name, batches[name], then)
            assert record["alignment"][name]["dots"] == pytest.approx(expected, rel=1e-10, abs=1e-14)
    batches, values = seen[3]
    now = downstream_grad(at(model, values))
    staleness = alignment.records[3]["staleness"]
    a, b = flat(then), flat(now)
    assert staleness["age"] == 3
    assert staleness["cosine"] == pytest.approx(float(a @ b / (a.norm() * b.norm())), rel=1e-12)
    assert staleness["relative_change"] == pytest.approx(float((b - a).norm() / b.norm()), rel=1e-10)
    for name in WEIGHTS:
        fresh = torch.tensor(loop_dots(at(model, values), name, batches[name], now), dtype=torch.float64)
        stale = torch.tensor(loop_dots(at(model, values), name, batches[name], then), dtype=torch.float64)
        assert alignment.records[3]["alignment"][name]["dots"] == pytest.approx(fresh.tolist(), rel=1e-10, abs=1e-14)
        assert staleness["dot_change"][name] == pytest.approx(float((stale - fresh).norm() / fresh.norm()), rel=1e-9)
    assert 0.0 < staleness["cosine"] < 1.0  # the run moved ∇D: the check above is not of equal vectors


def test_attached_records_equal_the_records_by_hand():
    model, opt = make("adam")
    by = InRunAlignment(model, task_loss, eval_batches=EVAL, refresh_every=2)
    by_hand(model, opt, by, 4)
    model, opt = make("adam")
    on = InRunAlignment(model, task_loss, eval_batches=EVAL, refresh_every=2)
    attached(model, opt, on, 4)
    assert on.records == by.records


def test_riding_beside_an_attached_transfer_probe_changes_neither():
    def run(with_probe, with_alignment):
        model, opt = make("adam")
        probe = objreg.TransferProbe(model, LOSSES, task_loss, opt, eval_batches=EVAL, weights=WEIGHTS,
                                     shared=list(BODY)).attach(opt, every=2) if with_probe else None
        alignment = InRunAlignment(model, task_loss, eval_batches=EVAL, refresh_every=2) if with_alignment else None
        if alignment is not None:
            alignment.attach(opt)
        generator = torch.Generator().manual_seed(1)
        for _ in range(3):
            batches = step_batches(generator)
            opt.zero_grad()
            losses = {k: LOSSES[k](model, batches[k]) for k in WEIGHTS} if alignment is None else {
                k: alignment.losses(k, LOSSES[k](model, batches[k])) for k in WEIGHTS}
            sum(w * losses[k].mean() for k, w in WEIGHTS.items()).backward()
            if probe is not None:
                probe.observe(batches)
            opt.step()
        return probe.records if probe else None, alignment.records if alignment else None

    both = run(True, True)
    assert both[0] == run(True, False)[0]
    assert both[1] == run(False, True)[1]


def test_a_refitted_head_rides_the_gradient_of_the_refitted_loss():
    """The mean dot is ``⟨g_k, ∇D*⟩``: the transfer probe's, whose ``∇D*`` its own tests check."""
    model, opt = make()
    alignment = InRunAlignment(model, task_loss, eval_batches=EVAL, refresh_every=1,
                               refit_head=model.task_head, fit_batches=FIT)
    probe = objreg.TransferProbe(model, LOSSES, task_loss, opt, eval_batches=EVAL, weights=WEIGHTS,
                                 refit_head=model.task_head, fit_batches=FIT, shared=list(BODY)).attach(opt)
    alignment.attach(opt)
    generator = torch.Generator().manual_seed(1)
    for _ in range(2):
        batches = step_batches(generator)
        opt.zero_grad()
        sum(w * alignment.losses(k, LOSSES[k](model, batches[k])).mean() for k, w in WEIGHTS.items()).backward()
        probe.observe(batches)
        opt.step()
    for ours, theirs in zip(alignment.records, probe.records):
        assert ours["downstream_grad_norm"] == pytest.approx(theirs["downstream_grad_norm"], rel=1e-9)
        for name in WEIGHTS:
            assert ours["alignment"][name]["dot"] == pytest.approx(theirs["alignment"][name]["dot"], rel=1e-8)


@pytest.mark.parametrize("options, message", [
    ({"refresh_every": 0}, "refresh_every must be a positive integer"),
    ({"shared": ["nope"]}, "no trainable parameter called: 'nope'"),
    ({"eval_batches": None}, "eval_batches is required"),
    ({"per_example": "yes"}, "per_example must be True or False"),
])
def test_bad_arguments_give_one_clear_error(options, message):
    model, _ = make()
    with pytest.raises(InvalidParameterError, match=message):
        InRunAlignment(model, task_loss, **{"eval_batches": EVAL, **options})


def test_calls_out_of_order_are_refused():
    model, opt = make()
    alignment = InRunAlignment(model, task_loss, eval_batches=EVAL)
    data = batch(torch.Generator().manual_seed(1), 2)
    with pytest.raises(ProbeStateError, match="inside `with alignment.step\\(\\):`"):
        alignment.losses("pairs", pair_loss(model, data))
    with pytest.raises(ProbeStateError, match="no objective's losses were named"), alignment.step():
        pair_loss(model, data).mean().backward()
    with pytest.raises(ProbeStateError, match="no backward pass reached them"), alignment.step():
        alignment.losses("pairs", pair_loss(model, data))
    alignment.attach(opt)
    with pytest.raises(ProbeStateError, match="not attached"), alignment.step():
        pass
    with pytest.raises(ProbeStateError, match="already attached"):
        alignment.attach(opt)
    alignment.detach()
    assert alignment.records == []
