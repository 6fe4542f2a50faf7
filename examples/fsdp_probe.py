"""The probe on a model sharded with FSDP2 (``torch.distributed.fsdp.fully_shard``), and its records
checked against the probe of the same model unsharded in one process.

    torchrun --nproc-per-node 2 examples/fsdp_probe.py [--steps 3] [--out records.json]

Each process holds a shard of every parameter of a small float64 Transformer-like MLP (each
``Linear`` and the whole model ``fully_shard``-ed; gloo on the CPU). :class:`~objreg.analysis.probe.sharded.ShardedProbe` computes ``∇D``, every example's
``⟨∇ℓ_i, ∇D⟩``, the Hessian-vector products ``H_D g_k`` and ``H_D Δθ`` and the split of the SGD
step on the shards, and sums them over processes. Then rank 0 runs ``objreg.TransferProbe`` on an
unsharded copy, from the same weights, and prints the largest relative difference between the two
records (the Hessian-vector products are central differences on shards and exact double backward
in one process; the difference is around 1e-9). docs/distributed.md, "FSDP2", says what is
computed how.
"""

from __future__ import annotations

import argparse
import gc
import json
import math

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

import objreg
from objreg.analysis.probe.sharded import ShardedProbe

WEIGHTS = {"reconstruct": 1.0, "smooth": 0.3}


def build_model() -> nn.Module:
    generator = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 16)).double()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=generator, dtype=torch.float64) / math.sqrt(p.shape[-1]))
    return model


def reconstruct(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """Per-example loss: rebuild the input."""
    return (model(batch) - batch).pow(2).mean(1)


def smooth(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """Per-example loss: small outputs."""
    return model(batch).pow(2).mean(1)


def downstream(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """The downstream per-example loss D: the first 4 outputs should be the input's 4 first coordinates, negated."""
    return (model(batch)[:, :4] + batch[:, :4]).pow(2).sum(1)


OBJECTIVES = {"reconstruct": reconstruct, "smooth": smooth}


def step_batches(step: int) -> dict[str, torch.Tensor]:
    """Every process draws the same rows (FSDP2's backward averages the processes' gradients, so
    the probe needs each row on every process)."""
    generator = torch.Generator().manual_seed(1000 + step)
    rows = torch.randn(8, 16, generator=generator, dtype=torch.float64)
    return {"reconstruct": rows, "smooth": rows[:6]}


def eval_batch() -> torch.Tensor:
    return torch.randn(16, 16, generator=torch.Generator().manual_seed(7), dtype=torch.float64)


def train_loss(model: nn.Module, batches: dict[str, torch.Tensor]) -> torch.Tensor:
    return sum(WEIGHTS[k] * fn(model, batches[k]).mean() for k, fn in OBJECTIVES.items())


def sharded_run(steps: int, lr: float) -> list[dict]:
    model = build_model()
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    probe = ShardedProbe(model, OBJECTIVES, downstream, optimizer, eval_batch=eval_batch(), weights=WEIGHTS)
    for step in range(steps):
        batches = step_batches(step)
        probe.measure(batches)  # before the loop's backward: it leaves .grad empty
        train_loss(model, batches).backward()
        optimizer.step()
        optimizer.zero_grad()
        probe.finish()
    return probe.records


def one_process_run(steps: int, lr: float) -> list[dict]:
    model = build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    probe = objreg.TransferProbe(model, OBJECTIVES, downstream, optimizer, eval_batches=eval_batch(), weights=WEIGHTS,
                                 per_sample_method="loop", hvp_method="double_backward", eval_dtype=None)
    for step in range(steps):
        batches = step_batches(step)
        optimizer.zero_grad()
        train_loss(model, batches).backward()
        measurement = probe.measure(batches)
        optimizer.step()
        probe.finish(measurement)
    return probe.records


def largest_difference(sharded: dict, whole: dict, path: str = "") -> tuple[float, str]:
    """The largest relative difference over the numbers the sharded record holds."""
    worst = (0.0, "")
    for key, value in sharded.items():
        if isinstance(value, dict):
            worst = max(worst, largest_difference(value, whole[key], f"{path}.{key}"))
        elif isinstance(value, float) and key != "decomposition_residual":  # rounding, ~1e-16 on both sides
            scale = max(abs(value), abs(whole[key]), 1e-300)
            worst = max(worst, (abs(value - whole[key]) / scale, f"{path}.{key}"))
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--out", default=None, help="write rank 0's records here (JSON)")
    args = parser.parse_args()
    dist.init_process_group("gloo")  # the CPU; on GPUs, NCCL with each process on its own device (not tried)
    try:
        records, rank = sharded_run(args.steps, args.lr), dist.get_rank()
        dist.barrier()  # neither process tears the group down while the other still uses it
    finally:
        # The sharded model and its probe (in reference cycles) go while the group exists: freed
        # at exit instead, gloo's threads can abort the process.
        gc.collect()
        dist.destroy_process_group()
    if rank != 0:
        return
    # The reference outside the process group: TransferProbe would otherwise split its work with
    # the other process.
    reference = one_process_run(args.steps, args.lr)
    for record, whole in zip(records, reference):
        difference, where = largest_difference(record, whole)
        # Improvements, as the report gives them: positive where D fell.
        print(f"step {record['step']}: D {record['downstream_loss']:.6f} → {record['downstream_loss_after']:.6f}, "
              f"predicted improvement {-record['predicted_delta']['first_order']:+.3e} (first order) "
              f"{-record['predicted_delta']['second_order']:+.3e} (second order); against one process: largest "
              f"relative difference {difference:.1e} ({where.lstrip('.')})")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(records, f, indent=1)

if __name__ == "__main__":
    main()
