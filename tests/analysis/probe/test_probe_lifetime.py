"""Attached probes neither outlive their user nor lose count: a dropped ``TransferProbe`` or
``InRunAlignment`` is collected and its hooks removed (the model and optimizer run as without
it); after ``detach()`` and a new ``attach()`` the records carry the optimizer's step numbers; an
optimizer replaced under an attached probe is named in the error."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from probe_stand_ins import EVAL, LOSSES, WEIGHTS, make, step_batches, task_loss

import objreg
from objreg.analysis.probe.in_run import InRunAlignment
from objreg.core.errors import ProbeStateError


def transfer(model, opt):
    return objreg.TransferProbe(model, LOSSES, task_loss, opt, eval_batches=EVAL, weights=WEIGHTS).attach(opt)


def in_run(model, opt):
    return InRunAlignment(model, task_loss, eval_batches=EVAL).attach(opt)


def step(model, opt, probe, generator, observe=True):
    batches = step_batches(generator)
    opt.zero_grad()
    riding = observe and isinstance(probe, InRunAlignment)
    losses = {}
    for k in WEIGHTS:  # each objective's losses named right after its forward, for the riding hooks
        losses[k] = LOSSES[k](model, batches[k])
        if riding:
            losses[k] = probe.losses(k, losses[k])
    sum(w * losses[k].mean() for k, w in WEIGHTS.items()).backward()
    if observe and isinstance(probe, objreg.TransferProbe):
        probe.observe(batches)
    opt.step()


def hooks(model, opt):
    return (sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules()),
            len(opt._optimizer_step_pre_hooks) + len(opt._optimizer_step_post_hooks))


@pytest.mark.parametrize("kind", [transfer, in_run], ids=["TransferProbe", "InRunAlignment"])
@pytest.mark.parametrize("detached", [False, True], ids=["attached", "detached"])
def test_a_dropped_probe_is_collected_and_leaves_no_hook(kind, detached):
    model, opt = make("sgd")
    before = hooks(model, opt)
    probe = kind(model, opt)
    generator = torch.Generator().manual_seed(1)
    step(model, opt, probe, generator)
    if detached:
        probe.detach()
    alive = weakref.ref(probe)
    del probe
    gc.collect()
    assert alive() is None
    assert hooks(model, opt) == before
    step(model, opt, None, generator)  # the loop goes on as without it


@pytest.mark.parametrize("kind", [transfer, in_run], ids=["TransferProbe", "InRunAlignment"])
@pytest.mark.parametrize("gap", [1, 3])
def test_records_after_detach_and_attach_carry_the_optimizers_step(kind, gap):
    model, opt = make("sgd")
    probe = kind(model, opt)
    generator = torch.Generator().manual_seed(1)
    for _ in range(2):
        step(model, opt, probe, generator)
    probe.detach()
    for _ in range(gap):
        step(model, opt, probe, generator, observe=False)
    probe.attach(opt)
    step(model, opt, probe, generator)
    assert [r["step"] for r in probe.records] == [0, 1, 2 + gap]


def test_an_optimizer_replaced_under_an_attached_probe_is_named():
    model, opt = make("sgd")
    probe = transfer(model, opt)
    generator = torch.Generator().manual_seed(1)
    step(model, opt, probe, generator)
    other = torch.optim.SGD(opt.param_groups[0]["params"], lr=0.05)
    with pytest.raises(ProbeStateError, match="another optimizer than the one the probe is attached to"):
        step(model, other, probe, generator)
        step(model, other, probe, generator)
