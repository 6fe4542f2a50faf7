"""Two gloo processes on loopback, and reports compared field by field: shared by the tests of
the distributed paths (``tests/analysis/conftest.py`` puts this folder on ``sys.path``)."""

from __future__ import annotations

import math
import socket
import time

import pytest
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
