"""How far the run's counterfactual can be trusted: predicted gains of other weights against
re-running the steps with them.

    python -m benchmarks.counterfactual [--json] [--steps 16] [--quick]

One run of ``objreg analyze``'s trainer (``mlm`` + ``sop`` against ``qa``, the default model in
float64, every step probed, uniform weights ``α_u``), then, for each of eight other constant weight
vectors ``α′`` in the trust region around ``α_u`` (radius 0.25, total held), the same steps
re-run with ``α′`` from the same start (same seed: the same initial model, fitted head, batches
and corruption). After ``n`` = 1, 4 and 16 steps:

* **predicted gain** of ``α′`` over ``α_u``: the run-level prediction (the sum of the first ``n``
  probed steps' one-step predictions at their recorded parameters) at ``α′`` minus at ``α_u``,
  first + second order: under SGD the exact quadratic (``model``); under Adam the exact
  first-order terms at the grid's points, where the run's optimum is chosen (``grid``: the eight
  vectors are grid points), the quadratic fitted through them (``model``), and the model before
  the exact counterfactual (each Shapley part scaled by its weight ratio, ``old_adam_model``);
* **realised gain**: ``D_n(α_u) − D_n(α′)`` of the two re-runs (float64 ``D``);
* the error ``|predicted − realised| / |realised|`` (median and largest over the eight) and how
  many of the eight predicted the wrong sign;
* the trust-region optimum of the first ``n`` records (``summary.counterfactual.best``): its
  ``gain_over_used`` against re-running ``n`` steps with its weights, with the trust radius as
  given (0.25) and shrunk with the horizon (:func:`objreg.analysis.math.trust_region.horizon_radius`).

For SGD (lr 5e-3, the default) and Adam (lr 1e-4). docs/analysis.md quotes its table.
"""

from __future__ import annotations

import copy
import sys
from typing import Any

import numpy as np

from benchmarks.common import apply_threads, base_parser, emit, machine, rounded
from objreg.analysis.math.mixture import counterfactual, exact_candidates
from objreg.analysis.math.trust_region import horizon_radius
from objreg.analysis.math.weight_model import run_model
from objreg.analysis.run.config import AnalysisConfig
from objreg.analysis.run.prepare import prepare
from objreg.core.registry import Registry
from objreg.toolkit.cache import cache_dir

NAMES = ["mlm", "sop"]
USED = {"mlm": 1.0, "sop": 1.0}
#: Eight constant weight vectors in the trust region of radius 0.25 around the uniform weights.
OTHERS = [{"mlm": m, "sop": 2.0 - m} for m in (0.5, 0.625, 0.75, 0.875, 1.125, 1.25, 1.375, 1.5)]
HORIZONS = (1, 4, 16)
SETTINGS = {"sgd": 5e-3, "adam": 1e-4}


def build(optimizer: str, lr: float, steps: int, quick: bool) -> Any:
    config = AnalysisConfig(
        pretrain=tuple(NAMES), downstream="qa", optimizer=optimizer, lr=lr, steps=steps, dtype="float64",
        batch_size=8 if quick else 16, seq_len=64 if quick else 128, eval_size=16 if quick else 64,
 head_fit_size=64 if quick else 1024, attribution_top=0,
        device="cpu",
    )
    trainer, _ = prepare(config, Registry.load(load_entrypoints=False), cache_dir())
    return trainer


def downstream_by_step(trainer: Any, start: dict, weights: dict[str, float], steps: int) -> list[float]:
    """``D`` after each of ``steps`` steps with constant ``weights`` from the state ``start``."""
    trainer.load_state_dict(copy.deepcopy(start))
    trainer.weights_by_step = [dict(weights)] * steps
    out = []
    for t in range(steps):
        trainer.step(t, probe=False)
        out.append(trainer.probe.downstream.loss(trainer.model))
    return out


def measure(optimizer: str, lr: float, steps: int, quick: bool) -> dict[str, Any]:
    trainer = build(optimizer, lr, steps, quick)
    start = copy.deepcopy(trainer.state_dict())
    records = trainer.run()  # every step probed, uniform weights
    used = [records[t]["downstream_loss_after"] for t in range(steps)]
    reruns = [downstream_by_step(trainer, start, w, steps) for w in OTHERS]
    def quadratic(rs: list) -> Any:
        model = run_model(rs, optimizer, lr, NAMES)
        return lambda w: model.improvement(w)["first_plus_second_order"]

    def grid(rs: list) -> Any:  # Adam's run-level figure: exact first order at the grid's points
        values = {tuple(w): v["first_plus_second_order"] for w, v in exact_candidates(rs, optimizer, lr, NAMES)}
        return lambda w: values[tuple(round(w[n], 12) for n in NAMES)]

    def old(rs: list) -> Any:  # before the exact counterfactual: Shapley parts scaled by their weight ratio
        return quadratic([{k: v for k, v in r.items() if k != "counterfactual"} for r in rs])

    models = {"model": quadratic} if optimizer == "sgd" else {"grid": grid, "model": quadratic, "old_adam_model": old}
    out: dict[str, Any] = {"optimizer": optimizer, "lr": lr, "horizons": {}}
    for n in (h for h in HORIZONS if h <= steps):
        row: dict[str, Any] = {}
        for label, make in models.items():
            improvement = make(records[:n])
            base = improvement(USED)
            predicted = [improvement(w) - base for w in OTHERS]
            realised = [used[n - 1] - rerun[n - 1] for rerun in reruns]
            errors = [abs(p - r) / abs(r) for p, r in zip(predicted, realised)]
            row[label] = {
                "median_error": rounded(float(np.median(errors))), "max_error": rounded(max(errors)),
                "wrong_sign": sum(p * r < 0 for p, r in zip(predicted, realised)),
                "predicted": [rounded(p) for p in predicted], "realised": [rounded(r) for r in realised],
            }
        for label, radius in (("optimum", 0.25), ("optimum_shrunk", horizon_radius(0.25, n))):
            summary = counterfactual(records[:n], NAMES, optimizer, lr, radius=radius, horizon=False)
            best = summary["best"]
            again = downstream_by_step(trainer, start, best["weights"], n)[-1]
            realised = used[n - 1] - again
            row[label] = {"radius": rounded(radius), "weights": {k: rounded(v) for k, v in best["weights"].items()},
                          "gain_over_used": rounded(best["gain_over_used"]), "realised": rounded(realised),
                          "ratio": rounded(best["gain_over_used"] / realised) if realised else None}
        out["horizons"][str(n)] = row
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = base_parser(__doc__.splitlines()[0], threads_default=1)
    parser.add_argument("--steps", type=int, default=max(HORIZONS), help="steps of each run (default 16)")
    args = parser.parse_args(argv)
    apply_threads(args.threads)
    import torch

    result = {"machine": machine(torch.device("cpu")), "steps": args.steps, "weights": OTHERS,
              "runs": [measure(o, lr, args.steps, args.quick) for o, lr in SETTINGS.items()]}
    rows = []
    for run in result["runs"]:
        for n, row in run["horizons"].items():
            for label, cell in row.items():
                if "median_error" in cell:
                    rows.append((f"{run['optimizer']} {n:>2} steps {label}",
                                 f"gain error median {cell['median_error']:.3g}, max {cell['max_error']:.3g}, "
                                 f"wrong sign {cell['wrong_sign']}/8"))
                else:
                    rows.append((f"{run['optimizer']} {n:>2} steps {label} (radius {cell['radius']:.3g})",
                                 f"gain_over_used {cell['gain_over_used']:.3g}, realised {cell['realised']:.3g}"))
    emit(result, args.json, rows)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
