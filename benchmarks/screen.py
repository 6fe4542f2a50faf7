"""What ``objreg screen`` costs: 8 candidates on the default model with the default budget.

    python -m benchmarks.screen [--quick] [--json] [--threads N] [--device cpu]

The candidates are ``mlm``, ``mlm:mask_prob=0.4``, ``wwm``, ``span``, ``t5``, ``clm``, ``sop`` and
``mlm+sop`` against ``qa`` (the built-in set), everything else at the screen's defaults. Reported:
the whole call's wall and CPU seconds (loading included) and each candidate's seconds (its model
build, its probed steps, and its final ``D*``). ``--quick``: two candidates, 2 steps, small rows.
The target is at most 5 minutes for the default on a 2-core CPU (docs/performance.md).
"""

from __future__ import annotations

import sys
import time
from typing import Any

import objreg
from benchmarks.common import apply_threads, base_parser, emit, machine
from objreg.analysis.parallel.devices import resolve_device

CANDIDATES = ("mlm", "mlm:mask_prob=0.4", "wwm", "span", "t5", "clm", "sop", "mlm+sop")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = base_parser(__doc__.splitlines()[0], threads_default=None)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    apply_threads(args.threads)
    device = resolve_device(args.device)
    candidates = CANDIDATES[:2] if args.quick else CANDIDATES
    sizes = {"budget": 2, "batch_size": 4, "seq_len": 48, "eval_size": 8, "head_fit_size": 16} if args.quick else {}
    wall, cpu = time.perf_counter(), time.process_time()
    report = objreg.screen(list(candidates), "qa", device=str(device), **sizes)
    result = {
        "machine": machine(device),
        "candidates": len(candidates),
        "budget": report.budget,
        "wall_s": time.perf_counter() - wall,
        "cpu_s": time.process_time() - cpu,
        "per_candidate_s": {e["candidate"]: e["seconds"] for e in report.candidates},
        "per_probe_s": {e["candidate"]: e["seconds"] / max(e["probes"], 1) for e in report.candidates},
    }
    emit(result, args.json, [("wall_s", result["wall_s"]), ("cpu_s", result["cpu_s"]),
                             *[(f"{name} s", s) for name, s in result["per_candidate_s"].items()]])
    return result


if __name__ == "__main__":
    main()
