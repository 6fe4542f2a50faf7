"""What ``objreg analyze --out`` costs per checkpoint: bytes, seconds, and the run's peak memory.

Runs one ``objreg.analyze`` in this process with ``out_dir`` and times every checkpoint it writes
(``save_checkpoint`` wrapped: its duration and the payload's size). The peak resident memory of
the whole process is ``ru_maxrss``; run it under ``/usr/bin/time -v`` for the same figure from
outside. docs/performance.md, "Attribution memory and checkpoints", quotes a run of::

    OMP_NUM_THREADS=1 nice -n 10 /usr/bin/time -v python -m benchmarks.checkpoint_cost --json \\
        --model bert-base --optimizer adamw --pretrain mlm,sop,clm --steps 3

Without ``--out`` (``--no-out``) the same run writes nothing, for the peak memory without checkpoints.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

import torch

import objreg
from objreg.analysis.run import analyze as analyze_module

GIB = float(1 << 30)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bert-base")
    parser.add_argument("--optimizer", default="adamw")
    parser.add_argument("--pretrain", default="mlm,sop,clm")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--eval-size", type=int, default=8)
    parser.add_argument("--head-fit-size", type=int, default=16)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--no-out", action="store_true", help="write nothing (no checkpoints)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    writes: list[dict] = []
    original = analyze_module.save_checkpoint

    def timed(out_dir: Path, state: dict) -> int:
        start = time.perf_counter()
        size = original(out_dir, state)
        writes.append({"seconds": time.perf_counter() - start, "bytes": size})
        return size

    analyze_module.save_checkpoint = timed
    pretrain = [p for p in args.pretrain.split(",") if p]
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        objreg.analyze(pretrain, "qa", out_dir=None if args.no_out else Path(tmp) / "run",
                                model=args.model, optimizer=args.optimizer, steps=args.steps,
                                batch_size=args.batch_size, seq_len=args.seq_len, eval_size=args.eval_size,
                                head_fit_size=args.head_fit_size, device=args.device)
        wall = time.perf_counter() - start
    analyze_module.save_checkpoint = original
    result = {
        "settings": vars(args),
        "wall_seconds": wall,
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB,
        "checkpoints": writes,
        "objectives": len(pretrain),
        "peak_cuda_gib": (torch.cuda.max_memory_allocated() / GIB if args.device.startswith("cuda") else None),
        "torch": torch.__version__,
    }
    print(json.dumps(result, indent=2) if args.json else result)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
