"""Wall time of the default job, ``objreg analyze --pretrain mlm,sop --downstream qa``, in a subprocess.

    python -m benchmarks.analyze --json

``cold_s``: the first run with an empty cache (it builds the default corpus and trains the
tokenizer). ``warm_s``: the median of ``--repeats`` further runs on that cache, what a user sees
from the second run on. ``*_cpu_s``: the CPU time (user + system) the same runs used, which moves
much less than wall time when other jobs share the machine (with one thread, wall time on an idle
core is close to it). The command's own exit status is checked; its output is discarded.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import torch

from benchmarks.common import REPO, base_parser, emit, machine, rounded

COMMAND = ["analyze", "--pretrain", "mlm,sop", "--downstream", "qa"]


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_once(cache: str, extra: list[str], threads: int | None) -> tuple[float, float]:
    """Wall seconds and CPU seconds of one run."""
    env = {**os.environ, "OBJREG_CACHE_DIR": cache}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    start, cpu = time.perf_counter(), children_cpu_s()
    result = subprocess.run(
        [sys.executable, "-m", "objreg", *COMMAND, *extra],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    elapsed, cpu = time.perf_counter() - start, children_cpu_s() - cpu
    if result.returncode != 0:
        raise SystemExit(f"objreg analyze failed ({result.returncode}):\n{result.stderr[-2000:]}")
    return elapsed, cpu


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--extra", default="", help="further arguments for objreg analyze, e.g. '--device cpu'")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    extra = args.extra.split()
    repeats = args.repeats or 3
    threads = {"torch_threads_in_subprocess": args.threads or "torch default"}
    with tempfile.TemporaryDirectory(prefix="objreg-bench-cache-") as cache:
        cold = run_once(cache, extra, args.threads)
        warm = [run_once(cache, extra, args.threads) for _ in range(repeats)]
    result = {
        "benchmark": "analyze",
        "machine": machine(torch.device("cpu")) | threads,
        "command": " ".join(["objreg", *COMMAND, *extra]),
        "cold_s": rounded(cold[0]),
        "warm_s": rounded(statistics.median(w for w, _ in warm)),
        "warm_runs_s": [rounded(w) for w, _ in warm],
        "cold_cpu_s": rounded(cold[1]),
        "warm_cpu_s": rounded(statistics.median(c for _, c in warm)),
        "target_s": 60,
    }
    emit(result, args.json, [(k, v) for k, v in result.items() if not isinstance(v, (dict, list))])
    return result


if __name__ == "__main__":
    main()
