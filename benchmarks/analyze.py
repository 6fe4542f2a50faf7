"""Wall time of the default job, ``objreg analyze --pretrain mlm,sop --downstream qa``, in a subprocess.

    python -m benchmarks.analyze --json

``cold_s``: the first run with an empty cache (it builds the default corpus and trains the
tokenizer). ``warm_s``: the median of ``--repeats`` further runs on that cache, what a user sees
from the second run on. The command's own exit status is checked; its output is discarded.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import torch

from benchmarks.common import REPO, base_parser, emit, machine, rounded

COMMAND = ["analyze", "--pretrain", "mlm,sop", "--downstream", "qa"]


def run_once(cache: str, extra: list[str], threads: int | None) -> float:
    env = {**os.environ, "OBJREG_CACHE_DIR": cache}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "objreg", *COMMAND, *extra],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"objreg analyze failed ({result.returncode}):\n{result.stderr[-2000:]}")
    return elapsed


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
        "cold_s": rounded(cold),
        "warm_s": rounded(statistics.median(warm)),
        "warm_runs_s": [rounded(w) for w in warm],
        "target_s": 60,
    }
    emit(result, args.json, [(k, v) for k, v in result.items() if not isinstance(v, (dict, list))])
    return result


if __name__ == "__main__":
    main()
