"""The split of an optimizer's step into per-objective parts must add up to the step it takes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import objreg
from objreg.analysis.optimizers import MOMENTUM, WEIGHT_DECAY, decompose, make_optimizer
from objreg.analysis.transfer import weighted_sum

OPTIMIZERS = {
    "sgd": lambda params: make_optimizer("sgd", params, 0.1),
    "adam": lambda params: make_optimizer("adam", params, 0.01),
    "adamw": lambda params: make_optimizer("adamw", params, 0.01),
    "adam_l2": lambda params: torch.optim.Adam(params, lr=0.01, weight_decay=0.1, betas=(0.8, 0.95)),
    "adamw_foreach_off": lambda params: torch.optim.AdamW(params, lr=0.01, weight_decay=0.2, foreach=False),
}


def parameters(seed=0):
    generator = torch.Generator().manual_seed(seed)
    return {"a": nn.Parameter(torch.randn(3, 4, generator=generator, dtype=torch.float64)),
            "b": nn.Parameter(torch.randn(5, generator=generator, dtype=torch.float64))}


@pytest.mark.parametrize("kind", list(OPTIMIZERS))
def test_parts_add_up_to_the_step_taken(kind):
    params = parameters()
    optimizer = OPTIMIZERS[kind](list(params.values()))
    generator = torch.Generator().manual_seed(1)
    weights = {"mlm": 1.0, "sop": 0.5}
    for step in range(3):
        gradients = {k: {n: torch.randn(p.shape, generator=generator, dtype=p.dtype) for n, p in params.items()}
                     for k in weights}
        for n, p in params.items():
            p.grad = sum(weights[k] * gradients[k][n] for k in weights)
        state_before = {id(p): {k: v.clone() for k, v in optimizer.state[p].items()} for p in params.values()}
        split = decompose(optimizer, params)
        # Reading the state changed nothing.
        for p in params.values():
            assert all(torch.equal(v, state_before[id(p)][k]) for k, v in optimizer.state[p].items())
        parts = {k: split.objective_part(weights[k], gradients[k]) for k in weights}
        parts.update(split.extras)
        before = {n: p.detach().clone() for n, p in params.items()}
        optimizer.step()
        predicted = weighted_sum(parts, before)
        for n, p in params.items():
            assert torch.allclose(p.detach() - before[n], predicted[n], rtol=1e-12, atol=1e-15), (kind, step, n)
        expected_extras = set()
        if kind != "sgd" and step > 0:
            expected_extras.add(MOMENTUM)
        if kind in ("adamw", "adam_l2", "adamw_foreach_off"):
            expected_extras.add(WEIGHT_DECAY)
        assert set(split.extras) == expected_extras
        assert split.rule.startswith("sgd" if kind == "sgd" else "adam")


def test_sgd_part_is_minus_lr_times_the_weighted_gradient():
    params = parameters()
    optimizer = make_optimizer("sgd", list(params.values()), 0.25)
    for p in params.values():
        p.grad = torch.ones_like(p)
    split = decompose(optimizer, params)
    assert split.scale == 0.25 and split.diagonal is None and split.extras == {}
    part = split.objective_part(2.0, {n: torch.ones_like(p) for n, p in params.items()})
    assert all(torch.equal(t, torch.full_like(t, -0.5)) for t in part.values())


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9), "plain SGD only"),
        (lambda ps: torch.optim.Adam(ps, lr=0.1, amsgrad=True), "without amsgrad"),
        (lambda ps: torch.optim.RMSprop(ps, lr=0.1), "cannot split the step of RMSprop"),
    ],
)
def test_unsupported_optimizers_are_clear_errors(build, message):
    params = parameters()
    with pytest.raises(objreg.InvalidParameterError, match=message):
        decompose(build(list(params.values())), params)
    with pytest.raises(objreg.InvalidParameterError, match="optimizer must be one of"):
        make_optimizer("lamb", list(params.values()), 0.1)
