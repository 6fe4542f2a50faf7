"""The power of the between-seed test: how many seeds a verdict needs, and the smallest effect the
seeds that were run can detect.

An overall verdict is decided when the two-sided 95% Student-t interval of the mean over ``n``
seeds excludes the claim's threshold. With seeds whose effects are normal with mean ``μ`` and
standard deviation ``σ``, the interval excludes the threshold ``θ`` exactly when the t statistic
``(mean − θ) / (s / √n)`` lies beyond ``±t₀.₉₇₅(n − 1)``; that statistic follows a noncentral t
distribution with ``n − 1`` degrees of freedom and noncentrality ``δ = √n (μ − θ) / σ``. So the
chance of a decided verdict (the power) is ``P(|T| > t₀.₉₇₅)`` under that distribution.

Taking ``μ`` and ``σ`` as the observed mean and between-seed standard deviation (a plug-in: the
true effect is unknown, so ``n80`` is an estimate, itself uncertain with few seeds):

* ``n80``: the fewest seeds whose power reaches 80% at the observed standardised effect
  ``d = (mean − θ) / s``;
* ``mde``: the smallest ``|μ − θ|`` that the seeds actually run detect with 80% power, at the
  observed ``s``.

An equivalence claim (the effect inside a margin) is read against the margin's nearer bound:
the interval must exclude that bound either way for a verdict, so the figures are those of the
test against it (a lower bound on the seeds needed to confirm, since the far bound must be
excluded as well).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import optimize, stats

#: The power a sufficient number of seeds must reach, and the test's two-sided level.
TARGET = 0.8
LEVEL = 0.95
#: n80 is searched up to this many seeds; beyond it the effect is reported as undetectable.
MAX_N80 = 1_000_000


def decision_power(seeds: int, noncentrality: float) -> float:
    """The chance that the two-sided 95% t-interval over ``seeds`` seeds excludes the threshold
    when ``√seeds (μ − θ)/σ = noncentrality``: ``P(|T| > t₀.₉₇₅(seeds − 1))``, ``T`` noncentral t."""
    if seeds < 2:
        raise ValueError(f"power needs at least 2 seeds, got {seeds}")
    df = seeds - 1
    critical = stats.t.ppf(0.5 + LEVEL / 2, df)
    delta = abs(noncentrality)
    wrong_side = float(stats.nct.cdf(-critical, df, delta))
    if not math.isfinite(wrong_side):  # scipy underflows to NaN where this tail is below ~1e-17
        wrong_side = 0.0
    return float(stats.nct.sf(critical, df, delta)) + wrong_side


def seeds_for_power(standardised: float, target: float = TARGET) -> int | None:
    """The fewest seeds (at least 2) whose power reaches ``target`` at the standardised effect
    ``|μ − θ|/σ``; None when the effect is 0 or needs more than :data:`MAX_N80` seeds."""
    d = abs(standardised)
    if d == 0.0 or not math.isfinite(d):
        return None if d == 0.0 else 2
    z = stats.norm.ppf(0.5 + LEVEL / 2) + stats.norm.ppf(target)
    # The normal approximation ((z₀.₉₇₅ + z₀.₈)/d)² is a lower bound; the t's heavier tails add a few seeds.
    n = max(2, int(math.floor((z / d) ** 2)) - 2)
    if n > MAX_N80:
        return None
    while decision_power(n, d * math.sqrt(n)) < target:
        n += 1
        if n > MAX_N80:
            return None
    while n > 2 and decision_power(n - 1, d * math.sqrt(n - 1)) >= target:  # in case the start overshot
        n -= 1
    return n


def detectable_noncentrality(seeds: int, target: float = TARGET) -> float:
    """The noncentrality at which ``seeds`` seeds reach power ``target``."""
    high = 1.0
    while decision_power(seeds, high) < target:  # bracket the root; scipy's noncentral t is NaN beyond ~40
        high *= 2.0
    return float(optimize.brentq(lambda delta: decision_power(seeds, delta) - target, 0.0, high, xtol=1e-10))


def minimum_detectable_effect(seeds: int, sd: float, target: float = TARGET) -> float:
    """The smallest ``|μ − θ|`` that ``seeds`` seeds detect with power ``target`` when the seeds'
    standard deviation is ``sd``."""
    return detectable_noncentrality(seeds, target) * sd / math.sqrt(seeds)


def power_of(values: Sequence[float], threshold: float) -> dict[str, Any]:
    """The power figures of per-seed ``values`` tested against ``threshold``: their mean and
    between-seed standard deviation, the standardised effect, the power at this many seeds, ``n80``
    and ``mde``. With one seed (no spread) or a spread of 0, the figures that need a spread are None."""
    x = np.asarray(values, dtype=np.float64)
    n = int(x.size)
    mean = float(x.mean())
    sd = float(x.std(ddof=1)) if n > 1 else None
    out: dict[str, Any] = {"seeds": n, "mean": mean, "threshold": float(threshold), "sd": sd,
                           "standardised_effect": None, "power": None, "n80": None, "mde": None}
    if sd is None or sd == 0.0 or not math.isfinite(sd):
        return out
    d = (mean - threshold) / sd
    out.update(standardised_effect=d, power=decision_power(n, d * math.sqrt(n)), n80=seeds_for_power(d),
               mde=minimum_detectable_effect(n, sd))
    return out


def _threshold(test: dict[str, Any], mean: float) -> float:
    """The threshold a test's interval must exclude: its threshold, or its margin's nearer bound."""
    if test["direction"] != "inside":
        return float(test["threshold"])
    lower, upper = test["margin"]
    return float(lower if abs(mean - lower) < abs(mean - upper) else upper)


def _against_claim(test: dict[str, Any], mean: float) -> bool:
    """Whether ``mean`` lies on the side of the test's threshold that would refute it."""
    if test["direction"] == "inside":
        lower, upper = test["margin"]
        return not lower <= mean <= upper
    return mean < test["threshold"] if test["direction"] == "above" else mean > test["threshold"]


def decisive_part(parts: dict[str, dict[str, Any]], verdict: str) -> str:
    """The part whose test decided ``verdict`` (``parts``: each part's :func:`power_of` figures
    with its ``verdict`` and whether its mean lies against the claim):

    * confirmed (every part confirmed): the weakest part, the smallest standardised effect;
    * refuted (some part refuted): the strongest refuted part, the largest standardised effect;
    * inconclusive: among the undecided parts, the one whose decision would decide the claim
      soonest: a part whose mean lies against the claim can refute it alone, so the largest
      standardised effect among those; otherwise every part must be confirmed, so the smallest.
    """
    def size(key: str) -> float:
        d = parts[key]["standardised_effect"]
        return math.inf if d is None else abs(d)

    keys = list(parts)
    if verdict == "confirmed":
        return min(keys, key=size)
    if verdict == "refuted":
        refuted = [k for k in keys if parts[k]["verdict"] == "refuted"] or keys
        return max(refuted, key=size)
    undecided = [k for k in keys if parts[k]["verdict"] not in ("confirmed", "refuted")] or keys
    against = [k for k in undecided if parts[k]["against_claim"]]
    return max(against, key=size) if against else min(undecided, key=size)


def summary(tests: dict[str, dict[str, Any]], verdict: str) -> dict[str, Any]:
    """The power figures of a result: those of the part that decided ``verdict`` (``part``, its
    ``n80`` and ``mde``, …), and under ``parts`` every part's, when the claim has several."""
    parts = {}
    for key, test in tests.items():
        mean = float(np.mean(test["per_seed"]))
        parts[key] = {**power_of(test["per_seed"], _threshold(test, mean)), "direction": test["direction"],
                      "verdict": test["verdict"], "against_claim": _against_claim(test, mean)}
        if test["direction"] == "inside":
            parts[key]["margin"] = list(test["margin"])
    part = decisive_part(parts, verdict)
    out = {"part": part, **parts[part]}
    if len(parts) > 1:
        out["parts"] = parts
    return out
