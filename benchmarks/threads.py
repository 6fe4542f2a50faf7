"""The default job with the threads objreg chooses against torch's old default, back to back.

    python -m benchmarks.threads --json

Each round runs ``objreg analyze --pretrain mlm,sop --downstream qa`` twice, in subprocesses,
one right after the other (which goes first alternates by round):

* ``chosen``: ``python -m objreg analyze ...`` as a user runs it, with neither ``OMP_NUM_THREADS``
  nor ``OMP_WAIT_POLICY`` in the environment, so objreg picks the threads and the OpenMP wait
  policy (``objreg.cli.threads``);
* ``torch_default``: the same command as before objreg chose: torch imported first (so objreg
  leaves OpenMP's wait policy alone) and ``--threads`` set to torch's own default.

Recorded per run: wall and CPU seconds, the one-minute load average just before it, and the
threads objreg reports on its first stderr line. The command's exit status is checked.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

import torch

from benchmarks.common import REPO, base_parser, emit, machine, rounded

COMMAND = ["analyze", "--pretrain", "mlm,sop", "--downstream", "qa"]


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def command(variant: str) -> list[str]:
    if variant == "chosen":
        return [sys.executable, "-m", "objreg", *COMMAND]
    old = (f"import sys, torch; from objreg.cli import main; "
           f"sys.argv = ['objreg', *{COMMAND!r}, '--threads', str(torch.get_num_threads())]; main()")
    return [sys.executable, "-c", old]


def run_once(variant: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")}
    load = os.getloadavg()[0]
    start, cpu = time.perf_counter(), children_cpu_s()
    done = subprocess.run(command(variant), cwd=REPO, env=env, capture_output=True, text=True, check=False)
    elapsed, cpu = time.perf_counter() - start, children_cpu_s() - cpu
    if done.returncode != 0:
        raise SystemExit(f"objreg analyze ({variant}) failed ({done.returncode}):\n{done.stderr[-2000:]}")
    first = done.stderr.splitlines()[0] if done.stderr else ""
    return {"variant": variant, "wall_s": rounded(elapsed), "cpu_s": rounded(cpu), "load_before": round(load, 2),
            "threads": first.split("computing with ", 1)[-1].split(";")[0] if "computing with" in first else None}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = base_parser(__doc__.splitlines()[0])
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    rounds = args.repeats or 2
    runs = []
    for r in range(rounds):
        order = ("torch_default", "chosen") if r % 2 == 0 else ("chosen", "torch_default")
        runs += [run_once(variant) for variant in order]
    by = {v: [run for run in runs if run["variant"] == v] for v in ("chosen", "torch_default")}
    result = {
        "benchmark": "threads",
        "machine": machine(torch.device("cpu")),
        "command": " ".join(["objreg", *COMMAND]),
        "runs": runs,
        **{f"{v}_wall_s": rounded(statistics.median(run["wall_s"] for run in by[v])) for v in by},
        **{f"{v}_cpu_s": rounded(statistics.median(run["cpu_s"] for run in by[v])) for v in by},
        "load_range": [min(run["load_before"] for run in runs), max(run["load_before"] for run in runs)],
    }
    emit(result, args.json, [(k, v) for k, v in result.items() if k not in ("machine", "runs")]
         + [(f"{run['variant']} #{i}", f"{run['wall_s']} s wall, {run['cpu_s']} s CPU, load {run['load_before']}, "
             f"{run['threads']}") for i, run in enumerate(runs)])
    return result


if __name__ == "__main__":
    main()
