"""The 40-step change of the downstream loss per objective, frozen head against re-fitted head.

    python -m benchmarks.refit_pilot [--steps 40] [--seeds 0,1] [--json PATH]

Each objective trains alone from the same start (one seed's backbone), on WikiText-2 with SQuAD
v1.1 as ``qa`` (``$OBJREG_SHARED_DATA`` or shared/data beside the checkout), probed at the first
and the last step only: the change is ``D(θ_40) − D(θ_0)``, read through the head fitted once
before training (``frozen``) and through the head re-fitted at both points (``refit``, ``D*``).
docs/analysis.md quotes the table this prints.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import objreg
from objreg.experiments._support import shared_data

OBJECTIVES = ("mlm", "span", "t5", "clm", "sop", "rtd")


def change(objective: str, head: str, seed: int, steps: int) -> dict[str, float]:
    data = shared_data()
    report = objreg.analyze([objective], "qa", corpus=str(data / "wikitext-2" / "valid.txt"),
                            downstream_data=str(data / "squad_v1.1" / "dev-v1.1.half-a.json"), steps=steps,
                            probe_every=steps, seed=seed, downstream_head=head).to_dict()
    first, last = report["steps"][0], report["steps"][-1]
    return {"before": first["downstream_loss"], "after": last["downstream_loss_after"],
            "change": last["downstream_loss_after"] - first["downstream_loss"]}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--objectives", default=",".join(OBJECTIVES))
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    seeds = [int(s) for s in args.seeds.split(",")]
    rows, started = [], time.perf_counter()
    for objective in args.objectives.split(","):
        for seed in seeds:
            for head in ("frozen", "refit"):
                rows.append({"objective": objective, "seed": seed, "head": head,
                             **change(objective, head, seed, args.steps)})
                print(json.dumps(rows[-1]), flush=True)
    result = {"steps": args.steps, "seeds": seeds, "rows": rows, "cpu_s": round(time.process_time(), 1),
              "wall_s": round(time.perf_counter() - started, 1), "torch": torch.__version__}
    print(table(result))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return result


def table(result: dict) -> str:
    """The markdown table of docs/analysis.md: per objective and seed, D's change under each head."""
    by = {(r["objective"], r["seed"], r["head"]): r for r in result["rows"]}
    objectives = list(dict.fromkeys(r["objective"] for r in result["rows"]))
    lines = ["| objective | seed | frozen: D₀ → D₄₀ (change) | refit: D*₀ → D*₄₀ (change) |", "|---|---|---|---|"]
    for objective in objectives:
        for seed in result["seeds"]:
            cells = []
            for head in ("frozen", "refit"):
                r = by[(objective, seed, head)]
                cells.append(f"{r['before']:.4f} → {r['after']:.4f} ({r['change']:+.4f})")
            lines.append(f"| {objective} | {seed} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
