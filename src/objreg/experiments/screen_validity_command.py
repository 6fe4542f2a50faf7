"""Experiment screen-validity's parts on the command line, the device machine's calls:
``python -m objreg.experiments.screen_validity part TASK:SEED:FIRST-LAST --out DIR`` runs one part
and writes it as one JSON file (:func:`part_path`); ``... assemble DIR --seeds 0,1,2`` builds each
whole seed's result from its parts and the overall result once every seed is whole
(:func:`assemble`).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from objreg.analysis.parallel.devices import resolve_device
from objreg.experiments import replication, screen_validity
from objreg.experiments.base import ExperimentResult, Setting
from objreg.experiments.screen_validity import seed_result
from objreg.experiments.screen_validity_setting import FULL, QUICK, TASKS, candidates, run_part
from objreg.toolkit.atomic import atomic_file


def part_path(out: Path, task: str, seed: int, first: int, last: int) -> Path:
    return out / "parts" / f"{task}-seed-{seed}-{first:03d}-{last:03d}.json"


def assemble(out: Path, seeds: Sequence[int], quick: bool = False, device: str = "cuda") -> ExperimentResult | None:
    """Every seed whose parts in ``out/parts`` hold every candidate of every task (parts of any
    slices, which must not overlap) written as ``out/seed-S/result.json``; the overall
    ``out/result.json`` once every seed in ``seeds`` is whole (then returned; else None)."""
    config = QUICK if quick else FULL
    total = len(candidates(config))
    results = []
    for seed in seeds:
        found = [json.loads(p.read_text()) for p in sorted((out / "parts").glob(f"*-seed-{seed}-*.json"))]
        held = {t: sum(p["last"] - p["first"] for p in found if p["task"] == t) for t in TASKS}
        if any(count < total for count in held.values()):
            continue
        result = seed_result(config, seed, found, quick, device)
        result.write(_mkdir(out / f"seed-{seed}"))
        results.append(result)
    if len(results) < len(seeds):
        return None
    overall = replication.conclude(screen_validity, results, Setting(quick=quick, seed=seeds[0]))
    overall.setting = {**results[0].setting, "quick": quick, "seeds": list(seeds)}
    overall.setting.pop("seed", None)
    overall.write(out)
    return overall


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def main(argv: Sequence[str] | None = None) -> None:
    """``part TASK:SEED:FIRST-LAST --out DIR`` runs one part; ``assemble DIR --seeds 0,1,2`` combines."""
    parser = argparse.ArgumentParser(prog="python -m objreg.experiments.screen_validity")
    commands = parser.add_subparsers(dest="command", required=True)
    one = commands.add_parser("part", help="one task, seed and candidate slice, e.g. sst2:0:0-2")
    one.add_argument("part")
    one.add_argument("--out", required=True, type=Path)
    one.add_argument("--quick", action="store_true")
    one.add_argument("--device", default="auto")
    every = commands.add_parser("assemble", help="the seeds' and the overall result from the parts in DIR")
    every.add_argument("out", type=Path)
    every.add_argument("--seeds", default="0,1,2")
    every.add_argument("--quick", action="store_true")
    every.add_argument("--device", default="cuda")
    args = parser.parse_args(argv)
    if args.command == "part":
        try:
            task, seed, span = args.part.split(":")
            first, last = (int(v) for v in span.split("-"))
            seed = int(seed)
        except ValueError:
            parser.error(f"a part is TASK:SEED:FIRST-LAST, e.g. sst2:0:0-2; got {args.part!r}")
        config = QUICK if args.quick else FULL
        total = len(candidates(config))
        if task not in TASKS or not 0 <= first < last <= total:
            parser.error(f"unknown part {args.part!r}: tasks {', '.join(TASKS)}, candidates 0 to {total} "
                         f"(FIRST-LAST, LAST exclusive)")
        found = run_part(config, task, seed, first, last, str(resolve_device(args.device)), print)
        path = part_path(args.out, task, seed, first, last)
        _mkdir(path.parent)
        with atomic_file(path, "w") as f:
            json.dump(found, f, indent=1)
        print(f"wrote {path} ({found['timing']['wall_s']:.0f} s)")
    else:
        seeds = [int(s) for s in args.seeds.split(",")]
        overall = assemble(args.out, seeds, args.quick, args.device)
        print("not every part is there yet" if overall is None else f"{overall.verdict}: {overall.reason}")
