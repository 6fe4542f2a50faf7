"""Coverage of the probe's intervals by simulation: the cosine's against the noise ratio, and the
interval over probe steps against the autocorrelation.

    python -m benchmarks.intervals [--json] [--trials 1000]

* **Cosine** (``alignment.<k>.cosine_ci95``): ``B = 16`` per-example gradients
  ``g_i = μ + σ z_i`` in ``P`` dimensions (``z_i`` standard normal: the noise spread evenly over
  ``P`` directions), ``‖μ‖ = 1``, ``∇D`` at cosine ``c`` with ``μ``; the noise ratio
  ``r = tr Σ / (B ‖μ‖²) = σ² P / B``. For each ``(P, c, r)``: how often the delta-method interval
  covers ``c``, over all trials (``all``) and over the trials where the probe reports it
  (``reported``: its estimated noise ratio below :func:`objreg.analysis.math.stats.cosine_noise_bound`),
  and the share reported.
* **Over probe steps** (``summary.alignment.<k>.ci95``): 16 probes of a stationary AR(1) series
  ``x_t = ρ x_{t−1} + e_t``; how often the AR(1)-widened interval covers the mean, by ``ρ``.

docs/analysis.md quotes the tables.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
from scipy import signal

from benchmarks.common import base_parser, emit, rounded
from objreg.analysis.math.stats import autocorrelated_mean_ci95, cosine_ci95, cosine_noise_bound, gradient_noise

B = 16
DIMENSIONS = (20, 200, 2000)
COSINES = (0.2, 0.5, 0.8)
RATIOS = (0.003, 0.01, 0.03, 0.1, 0.3, 1.0)
RHOS = (0.0, 0.5, 0.7, 0.9)


def cosine_coverage(dimension: int, cosine: float, ratio: float, trials: int, rng: np.random.Generator
                    ) -> dict[str, Any]:
    mu = np.zeros(dimension)
    mu[0] = 1.0
    direction = np.zeros(dimension)
    direction[0], direction[1] = cosine, np.sqrt(1 - cosine**2)
    sigma = np.sqrt(ratio * B / dimension)
    covered = reported = reported_covered = 0
    for _ in range(trials):
        g = mu + sigma * rng.standard_normal((B, dimension))
        mean = g.mean(0)
        norm_sq = float(mean @ mean)
        c, low, high = cosine_ci95(g @ direction, g @ mean, 1.0, float(np.sqrt(norm_sq)))
        hit = low <= cosine <= high
        covered += hit
        _, estimate = gradient_noise((g * g).sum(1), norm_sq)
        if estimate is not None and estimate <= cosine_noise_bound(c, (high - low) / 2):
            reported += 1
            reported_covered += hit
    return {"all": covered / trials, "reported": reported_covered / reported if reported else None,
            "share_reported": reported / trials}


def autocorrelated_coverage(rho: float, trials: int, rng: np.random.Generator) -> float:
    series = signal.lfilter([1.0], [1.0, -rho], rng.normal(size=(trials, 16 + 200)), axis=1)[:, 200:]
    return float(np.mean([out["low"] <= 0 <= out["high"] for out in map(autocorrelated_mean_ci95, series)]))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=1000, help="simulated batches per cell (default 1000)")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    cosine = [{"dimension": p, "cosine": c, "noise_ratio": r,
               **{k: rounded(v, 3) for k, v in cosine_coverage(p, c, r, args.trials, rng).items()}}
              for p in DIMENSIONS for c in COSINES for r in RATIOS]
    ar1 = {str(rho): rounded(autocorrelated_coverage(rho, 4 * args.trials, rng), 3) for rho in RHOS}
    result = {"batch": B, "trials": args.trials, "cosine": cosine, "autocorrelated": ar1}
    rows = [(f"P={row['dimension']} c={row['cosine']} r={row['noise_ratio']}",
             f"covers {row['all']:.3f}; reported {row['share_reported']:.3f}, covering "
             f"{'—' if row['reported'] is None else format(row['reported'], '.3f')}") for row in cosine]
    rows += [(f"AR(1) rho={rho}", f"covers {value:.3f}") for rho, value in ar1.items()]
    emit(result, args.json, rows)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
