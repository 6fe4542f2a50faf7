"""ShardedProbe on an FSDP2 model (fully_shard) in two gloo processes gives the records of
TransferProbe on the same model unsharded in one process, and every row's dot of a float64
per-example loop."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from two_processes import gloo_json

import objreg
from objreg.analysis.probe.sharded import ShardedProbe
from objreg.core.errors import InvalidParameterError

STEPS, LR = 2, 0.2
WEIGHTS = {"fit": 1.0, "spread": 0.5}


def model() -> nn.Module:
    """Float64; the last layer's 3 rows do not split evenly over two processes (FSDP2 pads)."""
    generator = torch.Generator().manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3)).double()
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn(p.shape, generator=generator, dtype=torch.float64) * 0.5)
    return net


# A batch is one tensor [B, 9]: 6 inputs, then 3 targets (TransferProbe reads a tuple as several batches).
def fit(m, batch):
    x, y = batch[:, :6], batch[:, 6:]
    return (m(x) - y).pow(2).sum(1)


def spread(m, batch):
    return m(batch[:, :6]).logsumexp(1)


def downstream(m, batch):
    x, y = batch[:, :6], batch[:, 6:]
    return (m(x)[:, 0] - y[:, 0]).pow(2)


OBJECTIVES = {"fit": fit, "spread": spread}


def batches(step: int) -> dict:
    generator = torch.Generator().manual_seed(100 + step)
    x = torch.randn(5, 6, generator=generator, dtype=torch.float64)
    y = torch.randn(5, 3, generator=generator, dtype=torch.float64)
    rows = torch.cat([x, y], 1)
    return {"fit": rows, "spread": rows[:4]}


def eval_batch():
    generator = torch.Generator().manual_seed(7)
    return torch.randn(7, 9, generator=generator, dtype=torch.float64)


def train_loss(m, step_batches):
    return sum(WEIGHTS[k] * fn(m, step_batches[k]).mean() for k, fn in OBJECTIVES.items())


def _sharded_records(rank: int) -> list:
    from torch.distributed.fsdp import fully_shard

    net = model()
    for layer in net:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(net)
    with pytest.raises(InvalidParameterError, match="plain torch.optim.SGD"):
        ShardedProbe(net, OBJECTIVES, downstream, torch.optim.Adam(net.parameters()), eval_batch=eval_batch())
    single = fully_shard(nn.Linear(2, 2))
    with pytest.raises(InvalidParameterError, match="float64 model"):
        ShardedProbe(single, OBJECTIVES, downstream, torch.optim.SGD(single.parameters(), lr=LR),
                     eval_batch=eval_batch())
    optimizer = torch.optim.SGD(net.parameters(), lr=LR)
    probe = ShardedProbe(net, OBJECTIVES, downstream, optimizer, eval_batch=eval_batch(), weights=WEIGHTS)
    for step in range(STEPS):
        probe.measure(batches(step))
        train_loss(net, batches(step)).backward()
        optimizer.step()
        optimizer.zero_grad()
        probe.finish()
    return probe.records


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    return gloo_json(_sharded_records, tmp_path_factory.mktemp("sharded"))


@pytest.fixture(scope="module")
def one_process():
    """TransferProbe on the unsharded model: the per-example loop, exact double-backward HVPs."""
    net = model()
    optimizer = torch.optim.SGD(net.parameters(), lr=LR)
    probe = objreg.TransferProbe(net, OBJECTIVES, downstream, optimizer, eval_batches=eval_batch(), weights=WEIGHTS,
                                 per_sample_method="loop", hvp_method="double_backward", eval_dtype=None)
    rows = []
    for step in range(STEPS):
        # Every row's ⟨∇ℓ_i, ∇D⟩ by plain autograd, before the step.
        params = list(net.parameters())
        d_grad = torch.autograd.grad(downstream(net, eval_batch()).mean(), params)
        rows.append({k: [sum(float((g * d).sum()) for g, d in zip(torch.autograd.grad(fn(net, batches(step)[k])[i], params),
                                                                    d_grad))
                         for i in range(len(batches(step)[k]))] for k, fn in OBJECTIVES.items()})
        optimizer.zero_grad()
        train_loss(net, batches(step)).backward()
        measurement = probe.measure(batches(step))
        optimizer.step()
        probe.finish(measurement)
    return probe.records, rows


def _compare(sharded_record, record, path=""):
    for key, value in sharded_record.items():
        if key == "dots":
            continue
        if key == "attribution" or key == "step":
            assert value == record[key], (path, key)
        elif isinstance(value, dict):
            _compare(value, record[key], f"{path}.{key}")
        else:
            assert math.isclose(value, record[key], rel_tol=1e-6, abs_tol=1e-12), (f"{path}.{key}", value, record[key])


def test_two_sharded_processes_give_one_process_records(sharded, one_process):
    records, rows = one_process
    zero, one = sharded
    assert zero == one  # every process ends with the same records
    assert len(zero) == STEPS
    for sharded_record, record, dots in zip(zero, records, rows):
        _compare(sharded_record, record)
        for name, expected in dots.items():
            assert sharded_record["alignment"][name]["dots"] == pytest.approx(expected, rel=1e-9, abs=1e-12)
    # The step moved D measurably, so the comparison of its Taylor terms is not one of zeros.
    assert all(abs(r["predicted_delta"]["second_order"]) > 1e-6 for r in zero)


def test_an_unsharded_or_unsuitable_setup_is_refused():
    net = model()
    sgd = torch.optim.SGD(net.parameters(), lr=LR)
    with pytest.raises(InvalidParameterError, match="sharded with torch.distributed.fsdp.fully_shard"):
        ShardedProbe(net, OBJECTIVES, downstream, sgd, eval_batch=eval_batch())
