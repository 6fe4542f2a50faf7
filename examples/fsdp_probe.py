"""The probe in a sharded (FSDP2) or data-parallel (DDP) loop as users run it: AdamW, each process
its own rows from a ``DistributedSampler``; its records checked against the probe of the same
model in one process on the concatenated batch.

    torchrun --nproc-per-node 2 examples/fsdp_probe.py [--wrap fsdp|ddp] [--dtype float64|float32]
        [--autocast] [--steps 3] [--out records.json] [--time]

FSDP2 (``--wrap fsdp``, the default): each ``Linear`` and the whole model ``fully_shard``-ed,
:class:`~objreg.analysis.probe.sharded.ShardedProbe` measures on a gathered copy of the model.
DDP (``--wrap ddp``): ``objreg.TransferProbe`` on the ``DistributedDataParallel`` model. Either
way every process passes the probe its own rows. Then rank 0 runs ``objreg.TransferProbe`` in one
process on the ranks' rows concatenated in rank order, from the same weights, and prints the
largest relative difference between the records (float64: around 1e-12). ``--autocast`` runs the
loop's forward in bfloat16 autocast (the probe measures in the model's dtype; the steps then
differ from one process's at bfloat16's rounding). ``--time`` prints the seconds of a probed and
an unprobed step, and the peak memory of each loop. docs/distributed.md, "FSDP2", says what is
gathered and what it costs.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import resource
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import objreg
from objreg.analysis.probe.sharded import ShardedProbe

WEIGHTS = {"reconstruct": 1.0, "smooth": 0.3}
ROWS, BATCH = 96, 6  # the data set, and each process's rows per step


def build_model(width: int, dtype: torch.dtype) -> nn.Module:
    generator = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Linear(16, width), nn.GELU(), nn.Linear(width, width), nn.GELU(), nn.Linear(width, 16))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=generator, dtype=torch.float64) / math.sqrt(p.shape[-1]))
    return model.to(dtype)


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


def dataset(dtype: torch.dtype) -> TensorDataset:
    return TensorDataset(torch.randn(ROWS, 16, generator=torch.Generator().manual_seed(1), dtype=torch.float64).to(dtype))


def eval_batches(dtype: torch.dtype) -> list[torch.Tensor]:
    """The fixed evaluation set: the whole of it on every process."""
    rows = torch.randn(24, 16, generator=torch.Generator().manual_seed(7), dtype=torch.float64).to(dtype)
    return [rows[:12], rows[12:]]


def loader(rank: int, world: int, dtype: torch.dtype) -> DataLoader:
    """Process ``rank``'s rows, as a data-parallel loop deals them."""
    sampler = DistributedSampler(dataset(dtype), num_replicas=world, rank=rank, shuffle=True, seed=0)
    return DataLoader(dataset(dtype), batch_size=BATCH, sampler=sampler)


def train(model: nn.Module, optimizer: torch.optim.Optimizer, probe, steps: int, rows, autocast: bool) -> list[float]:
    """The loop: each step's seconds (the probe's measure and finish included)."""
    seconds = []
    for step, (batch,) in zip(range(steps), rows):
        start = time.perf_counter()
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = sum(WEIGHTS[k] * fn(model, batch).mean() for k, fn in OBJECTIVES.items())
        loss.backward()
        measured = probe.measure({k: batch for k in OBJECTIVES}, step=step) if probe is not None else None
        optimizer.step()
        if probe is not None:
            probe.finish(measured)
        seconds.append(time.perf_counter() - start)
    return seconds


def distributed_run(args: argparse.Namespace, dtype: torch.dtype, probed: bool = True) -> tuple[list, list[float]]:
    """This process's loop: FSDP2 and ShardedProbe, or DDP and TransferProbe."""
    model = build_model(args.width, dtype)
    if args.wrap == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        model, probe_class = fully_shard(model), ShardedProbe
    else:
        model, probe_class = nn.parallel.DistributedDataParallel(model), objreg.TransferProbe
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.05)
    probe = probe_class(model, OBJECTIVES, downstream, optimizer, eval_batches=eval_batches(dtype),
                        weights=WEIGHTS) if probed else None
    seconds = train(model, optimizer, probe, args.steps, loader(dist.get_rank(), dist.get_world_size(), dtype),
                    args.autocast)
    return (probe.records if probe is not None else []), seconds


def one_process_run(args: argparse.Namespace, dtype: torch.dtype, world: int) -> list:
    """TransferProbe in one process, each step on the ranks' rows concatenated in rank order."""
    model = build_model(args.width, dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.05)
    probe = objreg.TransferProbe(model, OBJECTIVES, downstream, optimizer, eval_batches=eval_batches(dtype),
                                 weights=WEIGHTS)
    rows = ((torch.cat([b for (b,) in per_rank]),) for per_rank in zip(*(loader(r, world, dtype) for r in range(world))))
    train(model, optimizer, probe, args.steps, rows, args.autocast)
    return probe.records


def peak_memory() -> float:
    """This process's peak resident memory so far, MiB (Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def numbers(value, path: str = ""):
    """Every number of a record with its path."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from numbers(item, f"{path}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from numbers(item, f"{path}[{i}]")
    elif isinstance(value, float):
        yield path, value


#: Fields that measure rounding itself (S's asymmetry, the split's residual): compared to nothing.
ROUNDING_FIELDS = ("second_order_asymmetry", "decomposition_residual")


def largest_difference(record: dict, whole: dict) -> tuple[float, str]:
    """The largest relative difference over the record's numbers (those above 1e-12)."""
    other = dict(numbers(whole))
    return max(((abs(v - other[k]) / max(abs(v), abs(other[k])), k) for k, v in numbers(record)
                if max(abs(v), abs(other[k])) > 1e-12 and not k.endswith(ROUNDING_FIELDS)), default=(0.0, ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wrap", choices=("fsdp", "ddp"), default="fsdp")
    parser.add_argument("--dtype", choices=("float64", "float32"), default="float64")
    parser.add_argument("--autocast", action="store_true", help="the loop's forward in bfloat16 autocast")
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--out", default=None, help="write rank 0's records here (JSON)")
    parser.add_argument("--time", action="store_true", help="also run the loop unprobed; print seconds per step")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    dist.init_process_group("gloo")  # the CPU; on GPUs, NCCL with each process on its own device (not tried)
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        start = peak_memory()
        unprobed = distributed_run(args, dtype, probed=False)[1] if args.time else []  # first: its peak apart
        unprobed_peak = peak_memory()
        records, probed = distributed_run(args, dtype)
        probed_peak = peak_memory()
        dist.barrier()  # neither process tears the group down while the other still uses it
    finally:
        # The sharded model and its probe (in reference cycles) go while the group exists: freed
        # at exit instead, gloo's threads can abort the process.
        gc.collect()
        dist.destroy_process_group()
    if rank != 0:
        return
    if args.time:  # the first step apart: it builds what later steps reuse
        print(f"seconds per step after the first: probed {sum(probed[1:]) / (len(probed) - 1):.3f}, unprobed "
              f"{sum(unprobed[1:]) / (len(unprobed) - 1):.3f} (first step {probed[0]:.3f} and {unprobed[0]:.3f}); "
              f"rank 0's peak resident memory above its start: unprobed {unprobed_peak - start:.0f} MiB, probed "
              f"{probed_peak - start:.0f} MiB")
    # The reference outside the process group: TransferProbe would otherwise split its work with
    # the other process.
    reference = one_process_run(args, dtype, world)
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
