"""Where a probed step's memory goes: resident memory per phase of ``TransferProbe``'s measure and finish.

Runs one ``objreg.analyze`` in this process with the probe's phases wrapped (each objective's
gradient, ``D``, the step's split, the counterfactual's steps, ``∇D`` and the Hessian-vector
products, the per-sample dots, ...). A thread samples the process's resident memory (``/proc/self/statm``)
and keeps, per phase (named by the phases enclosing it, ``measure/hvp/...``), the highest
sample taken inside it and the resident memory when that call began. Figures are also given in
units of the shared parameters' bytes (``P``). docs/performance.md, "A probed step's peak memory",
quotes runs of::

    MALLOC_MMAP_THRESHOLD_=65536 OMP_NUM_THREADS=1 python -m benchmarks.probe_memory --json \\
        --hidden 256 --layers 4 --optimizer adamw --pretrain mlm,sop,clm

``MALLOC_MMAP_THRESHOLD_`` makes glibc give every large block back to the system when it is
freed, so resident memory follows the live tensors (without it, freed blocks stay resident and
the phases after a peak look as large as the peak). Linux only (``/proc``).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import sys
import threading
import time
from typing import Any

import objreg
from objreg.analysis.math import counterfactual, curvature, refit_curvature
from objreg.analysis.probe import engine, transfer_probe
from objreg.plugins.models.transformer import PRESETS

GIB = float(1 << 30)
PAGE = os.sysconf("SC_PAGE_SIZE")


def resident() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


class Phases:
    """The phase stack and, per phase path, the highest resident memory seen inside it."""

    def __init__(self, interval: float = 0.002):
        self.stack: list[str] = []
        self.cpu: dict[str, float] = {}  # CPU seconds (user + system, this process) inside each phase path
        self.peaks: dict[str, dict[str, int]] = {}
        self.interval = interval
        self._entry: list[int] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _note(self, rss: int) -> None:
        with self._lock:
            for depth in range(1, len(self.stack) + 1):
                path = "/".join(self.stack[:depth])
                peak = self.peaks.setdefault(path, {"peak": 0, "entry": 0, "calls": 0})
                if rss > peak["peak"]:
                    peak["peak"], peak["entry"] = rss, self._entry[depth - 1]

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            self._note(resident())

    def wrap(self, owner: Any, attribute: str, name: str) -> None:
        original = getattr(owner, attribute)

        @functools.wraps(original)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            rss, cpu = resident(), time.process_time()
            with self._lock:
                self.stack.append(name)
                self._entry.append(rss)
                path = "/".join(self.stack)
                self.peaks.setdefault(path, {"peak": 0, "entry": 0, "calls": 0})["calls"] += 1
            self._note(rss)
            try:
                return original(*args, **kwargs)
            finally:
                self._note(resident())
                with self._lock:
                    path = "/".join(self.stack)
                    self.cpu[path] = self.cpu.get(path, 0.0) + time.process_time() - cpu
                    self.stack.pop()
                    self._entry.pop()

        static = isinstance(vars(owner).get(attribute), staticmethod)
        setattr(owner, attribute, staticmethod(wrapped) if static else wrapped)

    def __enter__(self) -> Phases:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


#: (owner, attribute, phase name): what is wrapped.
WRAPPED: list[tuple[Any, str, str]] = [
    (transfer_probe.TransferProbe, "measure", "measure"),
    (transfer_probe.TransferProbe, "finish", "finish"),
    (transfer_probe.TransferProbe, "track", "track"),
    (transfer_probe.TransferProbe, "_gradients", "gradients"),
    (transfer_probe, "advance", "moments"),
    (engine.Probe, "downstream_loss", "D"),
    (engine, "downstream_resolution", "resolution"),
    (engine, "decompose", "split"),
    (counterfactual.AdamCounterfactual, "step", "counterfactual_step"),
    (curvature.Curvature, "gradient_and_products", "hvp"),
    (curvature.Curvature, "gradient_and_dots", "hvp"),
    (refit_curvature.RefitCurvature, "gradient_and_dots", "hvp_refit"),  # its products go through it too
    (refit_curvature.FeatureChunk, "moved", "features_moved"),
    (engine.Probe, "_per_sample", "per_sample"),
    (engine.Probe, "_first_order_errors", "shapley_errors"),
    (engine.Probe, "_spectrum", "spectrum"),
]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--optimizer", default="adamw")
    parser.add_argument("--pretrain", default="mlm,sop,clm")
    parser.add_argument("--downstream-head", default="refit")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--eval-size", type=int, default=8)
    parser.add_argument("--head-fit-size", type=int, default=16)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    phases = Phases()
    for owner, attribute, name in WRAPPED:
        phases.wrap(owner, attribute, name)
    if args.model == "default":  # objreg.analyze takes no model config: the preset is resized here
        PRESETS["default"] = {"hidden_size": args.hidden, "num_layers": args.layers,
                              "num_heads": max(1, args.hidden // 64), "intermediate_size": 4 * args.hidden}
    start_rss = resident()
    with phases:
        report = objreg.analyze(
            [p for p in args.pretrain.split(",") if p], "qa", model=args.model,
            optimizer=args.optimizer, steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len,
            eval_size=args.eval_size, head_fit_size=args.head_fit_size, downstream_head=args.downstream_head,
            device="cpu")
    parameters = int(report.config.get("shared_parameters") or 0)
    unit = 4 * parameters if parameters else None
    result = {
        "settings": vars(args),
        "shared_parameters": parameters,
        "model_parameters": report.config.get("model_parameters"),
        "parameter_bytes": unit,
        "start_rss_gib": start_rss / GIB,
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB,
        "phases": {path: {"peak_gib": p["peak"] / GIB, "entry_gib": p["entry"] / GIB,
                          "held_P": (p["peak"] - p["entry"]) / unit if unit else None,
                          "peak_P": p["peak"] / unit if unit else None, "calls": p["calls"]}
                   for path, p in sorted(phases.peaks.items())},
    }
    print(json.dumps(result, indent=2) if args.json else result)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
