"""Per-sample alignment ⟨∇ℓ_i, ∇D⟩ of one batch vs the floor: one batched forward+backward.

    python -m benchmarks.alignment --quick --json

``floor_s`` is one forward and one backward of the batch's mean loss to the shared parameters;
``alignment_s`` is ``per_sample_dots(..., "auto")`` on the same batch with the downstream
gradient, the call the analyzer makes at every probe. Every other method is timed beside them,
round-robin in one process: ``loop`` is the naive per-example loop (one forward and one backward
per example, each a batch of one), ``vmap`` materialised ``vmap(grad)`` per-sample gradients, and
with ``--quick`` also ``loop_whole_batch``, the library's exact reference (B backward passes of
ℓ_i through the whole batch, right for batch-coupled losses too). Peak memory comes from one
subprocess per path on CPU (see ``common.peak_memory_here``). ``--quick``: the default model,
B=32, T=128. Without: BERT-base size (hidden 768, 12 layers, 12 heads); on a CPU its loop and
``vmap(grad)`` are timed on the first ``--subset`` examples and scaled to the batch (both are
linear in B), which the output says.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.common import (
    Workload,
    apply_threads,
    base_parser,
    build_workload,
    emit,
    interleaved,
    machine,
    memory_method,
    peak_memory_here,
    peak_memory_in_subprocess,
    rounded,
)
from objreg.analysis.math import ghost, per_sample
from objreg.analysis.math.functional import requiring_grad
from objreg.analysis.parallel.devices import resolve_device

FAST = ("jvp", "ghost", "double_backward")


def floor(workload: Workload) -> Callable[[], Any]:
    fn, shared = workload.function, workload.shared

    def run() -> Any:
        params = requiring_grad(shared)
        return torch.autograd.grad(fn(params).mean(), list(params.values()))

    return run


def fused(workload: Workload) -> Callable[[], Any]:
    """The floor's forward+backward with :class:`GhostDots` riding along: gradient and dots at once."""
    fn, shared, direction = workload.function, workload.shared, workload.direction

    def run() -> Any:
        params = requiring_grad(shared)
        with ghost.GhostDots(fn.model, direction, fn.batch_size) as in_run:
            grads = torch.autograd.grad(fn(params).mean(), list(params.values()))
        return grads, in_run.dots() * fn.batch_size

    return run


def method(workload: Workload, name: str) -> Callable[[], Any]:
    fn, shared, direction = workload.function, workload.shared, workload.direction
    return lambda: per_sample.per_sample_dots(fn, shared, direction, name)


def on_subset(workload: Workload, name: str, size: int) -> Callable[[], Any]:
    """``name`` on the first ``size`` examples only (for scaling slow paths to the batch)."""
    part = next(workload.function.chunks(size))
    shared, direction = workload.shared, workload.direction
    return lambda: per_sample.per_sample_dots(part, shared, direction, name)


def per_example_loop(workload: Workload, count: int | None = None) -> Callable[[], Any]:
    """The naive reference: one forward and one backward per example, each a batch of one (the
    first ``count`` examples only, if given)."""
    examples = list(workload.function.chunks(1))[:count]
    shared, direction = workload.shared, workload.direction

    def run() -> torch.Tensor:
        dots = []
        for example in examples:
            params = requiring_grad(shared)
            grads = torch.autograd.grad(example(params).sum(), list(params.values()), allow_unused=True)
            dots.append(sum((g * direction[n]).sum() for g, n in zip(grads, params) if g is not None))
        return torch.stack(dots)

    return run


def paths(workload: Workload, subset: int | None) -> dict[str, Callable[[], Any]]:
    found: dict[str, Callable[[], Any]] = {"floor": floor(workload), "alignment": method(workload, "auto")}
    found.update({name: method(workload, name) for name in FAST})
    found["fused"] = fused(workload)
    found["loop"] = per_example_loop(workload, subset)
    if subset is None:
        found["vmap"] = method(workload, "vmap")
        # The library's reference loop: B backward passes of ℓ_i through the whole batch's graph.
        found["loop_whole_batch"] = method(workload, "loop")
    else:
        found["vmap"] = on_subset(workload, "vmap", subset)
    return found


def parser() -> argparse.ArgumentParser:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--objective", default="mlm", help="pre-training objective of the batch (default mlm)")
    parser.add_argument("--model", default=None, help="model name (default: 'default' with --quick, else 'bert-base')")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument(
        "--subset",
        type=int,
        default=None,
        help="time loop and vmap on this many examples and scale (default: whole batch with "
        "--quick or on CUDA, else 4)",
    )
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    parser.add_argument("--profile", action="store_true", help="print torch.profiler tables of floor and alignment")
    parser.add_argument("--memory-child", default=None, help=argparse.SUPPRESS)
    return parser


def setup(args: argparse.Namespace) -> tuple[Workload, int | None]:
    device = resolve_device(args.device)
    model = args.model or ("default" if args.quick else "bert-base")
    workload = build_workload(args.objective, model, args.batch_size, args.seq_len, device)
    subset = args.subset
    if subset is None and not args.quick and device.type == "cpu":
        subset = 4
    if subset is not None and subset >= args.batch_size:
        subset = None
    return workload, subset


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)
    apply_threads(args.threads)
    workload, subset = setup(args)
    device = workload.device
    found = paths(workload, subset)
    if args.memory_child:
        print(peak_memory_here(found[args.memory_child], device))
        return {}
    if args.profile:
        profile(found, device)
    repeats = args.repeats or (15 if args.quick else 3)
    slow = 3 if args.quick else 1
    times = interleaved(found, repeats, device, repeats_of={"vmap": slow, "loop": slow, "loop_whole_batch": slow})
    scale = 1.0 if subset is None else args.batch_size / subset
    for name in ("vmap", "loop"):
        times[name] *= scale
    _, chosen = found["alignment"]()

    result: dict[str, Any] = {
        "benchmark": "alignment",
        "machine": machine(device),
        "config": {
            "model": model_description(workload),
            "objective": args.objective,
            "batch_size": args.batch_size,
            "seq_len": args.seq_len,
            "shared_parameters": workload.parameters,
            "repeats": repeats,
            "slow_repeats": slow,
            "loop_and_vmap_scaled_from": subset,
        },
        "floor_s": rounded(times["floor"]),
        "alignment_s": rounded(times["alignment"]),
        "alignment_method": chosen,
        "ratio": rounded(times["alignment"] / times["floor"]),
        "loop_s": rounded(times["loop"]),
        "loop_ratio": rounded(times["loop"] / times["floor"]),
        "vmap_s": rounded(times["vmap"]),
        "vmap_ratio": rounded(times["vmap"] / times["floor"]),
        "loop_speedup": rounded(times["loop"] / times["alignment"]),
        "loop_whole_batch_ratio": rounded(times["loop_whole_batch"] / times["floor"])
        if "loop_whole_batch" in times
        else None,
        "methods": {name: {"s": rounded(times[name]), "ratio": rounded(times[name] / times["floor"])} for name in FAST},
        # The gradient the update needs and every per-sample dot from one forward+backward.
        "fused_s": rounded(times["fused"]),
        "fused_ratio": rounded(times["fused"] / times["floor"]),
    }
    if not args.no_memory:
        result.update(memory(argv, found, device, subset))
    rows = [(k, v) for k, v in result.items() if not isinstance(v, dict)]
    rows += [(f"{k}_ratio", v["ratio"]) for k, v in result["methods"].items()]
    emit(result, args.json, rows)
    return result


def model_description(workload: Workload) -> Any:
    config = getattr(workload.model, "config", None)
    return dataclasses.asdict(config) if dataclasses.is_dataclass(config) else type(workload.model).__name__


def memory(
    argv: list[str], found: dict[str, Callable[[], Any]], device: torch.device, subset: int | None
) -> dict[str, Any]:
    names = ["floor", "alignment", *FAST, "fused", "loop"] + (["vmap"] if subset is None else [])
    if device.type == "cuda":
        peaks = {name: peak_memory_here(found[name], device) for name in names}
    else:
        child_argv = [a for a in argv if a not in ("--json", "--profile")]
        peaks = {name: peak_memory_in_subprocess("benchmarks.alignment", child_argv, name) for name in names}
    return {
        "peak_mem_ratio": rounded(peaks["alignment"] / peaks["floor"]),
        "peak_mem_mib": {name: rounded(value) for name, value in peaks.items()},
        "peak_mem_ratios": {name: rounded(value / peaks["floor"]) for name, value in peaks.items()},
        "memory_method": memory_method(device),
    }


def profile(found: dict[str, Callable[[], Any]], device: torch.device) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    for name in ("floor", "alignment", "ghost"):
        found[name]()
        with torch_profile(activities=activities) as prof:
            found[name]()
        print(f"== {name} ==", file=sys.stderr)
        print(prof.key_averages().table(sort_by=sort, row_limit=15), file=sys.stderr)


if __name__ == "__main__":
    main()
