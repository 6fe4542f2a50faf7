"""Two gloo processes on loopback, and reports compared field by field: shared by the tests of
the distributed paths (``tests/analysis/conftest.py`` puts this folder on ``sys.path``)."""

from __future__ import annotations

import gc
import json
import math
import os
import socket
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

#: Bounds a hang only: a collective's wait and the whole two-process run.
TIMEOUT_S = 1800


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_two_processes(target, *args) -> None:
    """Spawn two processes running ``target(rank, *args)``; fail instead of hanging."""
    context = mp.start_processes(target, args=args, nprocs=2, join=False, start_method="spawn")
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while not context.join(timeout=5):
            if time.monotonic() > deadline:
                pytest.fail(f"two-process run still going after {TIMEOUT_S} s: hung")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.terminate()


def _json_worker(rank: int, port: int, results: str, compute: Callable[[int], object]) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=TIMEOUT_S))
    try:
        # What ``compute`` builds (an FSDP model, a probe) lives only inside the call: it is freed
        # while the group still exists (freed at exit, gloo's threads can abort the process), and
        # neither process tears the group down while the other still has collectives in flight.
        found = compute(rank)
        with open(os.path.join(results, f"rank{rank}.json"), "w", encoding="utf-8") as f:
            json.dump(found, f)
        dist.barrier()
    finally:
        gc.collect()
        dist.destroy_process_group()


def gloo_json(compute: Callable[[int], object], results: Path) -> list:
    """``compute(rank)`` (a module-level function, so that it pickles) in each of two gloo
    processes; what each returned, as JSON, in rank order."""
    run_two_processes(_json_worker, free_port(), str(results), compute)
    return [json.loads((results / f"rank{r}.json").read_text(encoding="utf-8")) for r in (0, 1)]


def leaves(value, path=""):
    """Every scalar of a JSON-like report with its path (``.steps[0].alignment.mlm.dot``)."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from leaves(item, f"{path}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from leaves(item, f"{path}[{i}]")
    else:
        yield path, value


def assert_close_reports(one: dict, two: dict, rtol: float = 1e-6, atol: float = 1e-12) -> None:
    """Every field of the steps and the summary: numbers to ``rtol`` of their own size (``atol``
    for the fields that measure rounding itself, ~1e-16), everything else equal."""
    left, right = dict(leaves({"steps": one["steps"], "summary": one["summary"]})), dict(
        leaves({"steps": two["steps"], "summary": two["summary"]}))
    assert left.keys() == right.keys()
    for key, a in left.items():
        b = right[key]
        if isinstance(a, float) or isinstance(b, float):
            assert math.isclose(a, b, rel_tol=rtol, abs_tol=atol), (key, a, b)
        else:
            assert a == b, (key, a, b)
