"""What re-fitting the downstream head costs a probe: ``objreg analyze``'s probed step with the
head re-fitted (``D*``) against the same step with the head frozen.

    python -m benchmarks.refit [--quick] [--json] [--threads 1] [--fit-sizes 256,1024]

The default job's setting (``mlm,sop`` against ``qa``, B=16, T=128, 64 evaluation examples),
one trainer per head and fit-set size, round-robin in one process:

* ``step_s``: an unprobed training step (the same for every head).
* ``probed_<head>_s``: a probed step: the step plus the probe's measure and finish (``D`` before
  from the previous probe, ``∇D``, the HVPs along the objectives' gradients, the dots, ``D``
  after). With ``refit`` that includes the fit at the new point, ``∇D*`` and ``∇²D*`` products.

``probe_cost`` = (probed − step) for each head; ``refit_over_frozen`` = the re-fitted probe's
cost over the frozen one's. ``--quick``: 4 steps' worth of rounds on a smaller evaluation set.
"""

from __future__ import annotations

import sys
from typing import Any

import objreg
from benchmarks.common import apply_threads, base_parser, emit, interleaved, machine, rounded
from objreg.analysis.parallel.devices import resolve_device
from objreg.analysis.run.config import AnalysisConfig
from objreg.analysis.run.prepare import prepare


def trainer(head: str, fit_size: int, quick: bool, device: str) -> Any:
    sizes = {"eval_size": 16, "batch_size": 4, "seq_len": 64} if quick else {}
    config = AnalysisConfig(pretrain=("mlm", "sop"), downstream="qa", downstream_head=head, head_fit_size=fit_size,
                            steps=10_000, device=device, **sizes)
    built, _ = prepare(config, objreg.Registry.load(), objreg.cache_dir())
    return built


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = base_parser(__doc__.splitlines()[0], threads_default=1)
    parser.add_argument("--fit-sizes", default="256,1024", help="head_fit_size values of the re-fitted head")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    apply_threads(args.threads)
    device = resolve_device(args.device)
    sizes = [int(s) for s in args.fit_sizes.split(",")]
    trainers = {"frozen": trainer("frozen", sizes[0], args.quick, str(device))}
    trainers.update({f"refit_{n}": trainer("refit", n, args.quick, str(device)) for n in sizes})
    plain = trainers["frozen"]
    counters = {name: 0 for name in trainers}

    def probed(name: str) -> Any:
        def run() -> None:
            t = trainers[name]
            t.step(counters[name], probe=True)
            counters[name] += 1

        return run

    paths = {"step": lambda: plain.step(0, probe=False), **{f"probed_{name}": probed(name) for name in trainers}}
    seconds = interleaved(paths, args.repeats or (2 if args.quick else 3), device)
    cost = {name: seconds[f"probed_{name}"] - seconds["step"] for name in trainers}
    result = {
        "machine": machine(device), "quick": args.quick, "fit_sizes": sizes,
        "seconds": {k: rounded(v) for k, v in seconds.items()},
        "probe_cost_s": {k: rounded(v) for k, v in cost.items()},
        "refit_over_frozen": {f"refit_{n}": rounded(cost[f"refit_{n}"] / cost["frozen"], 3) for n in sizes},
        "probed_step_over_step": {k: rounded(seconds[f"probed_{k}"] / seconds["step"], 3) for k in trainers},
    }
    rows = [(f"probe cost {k} s", v) for k, v in result["probe_cost_s"].items()]
    rows += [(f"{k} / frozen", v) for k, v in result["refit_over_frozen"].items()]
    emit(result, args.json, rows)
    return result


if __name__ == "__main__":
    main()
