"""Replication across seeds: run one experiment for seeds S, S+1, …, S+N−1 and combine the
per-seed results into the overall verdict.

Each seed trains its own models from its own initialisation and draws its own data and
evaluation rows, so the spread of the per-seed effects is the between-seed variability the
claim is about. The default combine reports the mean effect with a two-sided 95% Student-t
interval over the seeds (N−1 degrees of freedom) and applies the experiment's ``THRESHOLD`` and
``DIRECTION`` to that interval. The intervals a seed reports inside its own figures describe one
model on one evaluation set; they are never pooled into the overall interval.
"""

from __future__ import annotations

import copy
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from objreg import InvalidParameterError
from objreg.analysis.math.stats import mean_ci95
from objreg.analysis.run.validation import MAX_SEED, check_integer
from objreg.experiments import power, preconditions
from objreg.experiments._support import equivalence_verdict
from objreg.experiments.base import ExperimentResult, Setting, save_figure, verdict_from_interval

#: Most seeds one call may run: each seed trains models for up to minutes.
MAX_SEEDS = 64


def check_seeds(seeds: Any, seed: Any) -> None:
    """``seeds`` must be an int in 1..MAX_SEEDS and ``seed … seed+seeds−1`` valid 32-bit seeds."""
    check_integer("seeds", seeds, 1, MAX_SEEDS)
    check_integer("seed", seed, 0, MAX_SEED)
    if seed + seeds - 1 > MAX_SEED:
        raise InvalidParameterError(f"seed + seeds − 1 must be at most {MAX_SEED:,}, got {seed + seeds - 1:,}")


def effect_of(result: ExperimentResult) -> float:
    """The per-seed ``figures["effect"]``, refusing a result without one (a broken experiment)."""
    effect = result.figures.get("effect")
    if isinstance(effect, bool) or not isinstance(effect, (int, float)):
        raise ValueError(f"experiment {result.name!r} gave no numeric figures['effect'] (got {effect!r})")
    return float(effect)


def test_of(per_seed: list[float], threshold: float | list[float], direction: str, verdict: str | None) -> dict:
    """What one tested part of a claim records for the power computation: the per-seed values,
    the threshold (or the margin ``[lower, upper]`` with direction ``inside``) and its verdict
    over seeds (None with one seed)."""
    key = "margin" if direction == "inside" else "threshold"
    return {"per_seed": [float(v) for v in per_seed], key: threshold, "direction": direction, "verdict": verdict}


def default_combine(results: list[ExperimentResult], setting: Setting, threshold: float = 0.0,
                    direction: str = "above") -> ExperimentResult:
    """The overall result: mean effect over seeds, its between-seed 95% t-interval, and the
    verdict of that interval against ``threshold`` in ``direction``. With one seed, that seed's
    own verdict, and a reason that says only one seed was run."""
    first = results[0]
    effects = [effect_of(r) for r in results]
    mean, low, high = mean_ci95(effects)
    verdict = verdict_from_interval(low, high, threshold, direction) if len(results) > 1 else None
    figures = {"effect": mean, "effect_ci95_between_seeds": [low, high], "per_seed_effect": effects,
               "seeds": len(results), "threshold": threshold, "direction": direction,
               "tests": {"effect": test_of(effects, threshold, direction, verdict)}}
    if len(results) == 1:
        return ExperimentResult(first.name, first.claim, first.verdict,
                                f"only one seed was run (no between-seed interval): {first.reason}", figures)
    reason = (f"mean effect {mean:.4g} over {len(results)} seeds, 95% between-seed t-interval "
              f"[{low:.4g}, {high:.4g}], {verdict} against {direction} {threshold:g}; per-seed verdicts: "
              + ", ".join(r.verdict for r in results))
    return ExperimentResult(first.name, first.claim, verdict, reason, figures)


def combine_equivalence(results: list[ExperimentResult], setting: Setting, lower: float,
                        upper: float) -> ExperimentResult:
    """Like :func:`default_combine`, but the claim is that the effect lies in ``[lower, upper]``:
    ``confirmed`` when the between-seed interval lies inside, ``refuted`` when wholly outside,
    ``inconclusive`` otherwise (two one-sided checks)."""
    overall = default_combine(results, setting)
    overall.figures.pop("threshold")
    overall.figures.pop("direction")
    overall.figures["margin"] = [lower, upper]
    low, high = overall.figures["effect_ci95_between_seeds"]
    verdict = equivalence_verdict(low, high, lower, upper) if len(results) > 1 else None
    overall.figures["tests"] = {"effect": test_of(overall.figures["per_seed_effect"], [lower, upper], "inside",
                                                  verdict)}
    if len(results) == 1:
        return overall
    overall.verdict = verdict
    overall.reason = (f"mean effect {overall.figures['effect']:.4g} over {len(results)} seeds, 95% between-seed "
                      f"t-interval [{low:.4g}, {high:.4g}], {overall.verdict} against the margin [{lower:g}, {upper:g}]; "
                      "per-seed verdicts: " + ", ".join(r.verdict for r in results))
    return overall


def combine_parts(results: list[ExperimentResult], setting: Setting,
                  parts: dict[str, tuple[float, str]]) -> ExperimentResult:
    """The overall result of a claim with several parts (e.g. both halves of a finding): each
    part ``key`` is the per-seed ``figures["parts"][key]``, tested like the default combine's
    effect against its own ``(threshold, direction)``. ``confirmed`` when every part is,
    ``refuted`` when any part is, ``inconclusive`` otherwise. ``figures["effect"]`` is the mean
    effect with its between-seed interval, as in :func:`default_combine`. With one seed, that
    seed's own verdict, and a reason that says only one seed was run."""
    overall = default_combine(results, setting)
    overall.figures.pop("threshold")
    overall.figures.pop("direction")
    verdicts, summaries = {}, {}
    for key, (threshold, direction) in parts.items():
        values = [float(r.figures["parts"][key]) for r in results]
        mean, low, high = mean_ci95(values)
        verdicts[key] = verdict_from_interval(low, high, threshold, direction)
        summaries[key] = {"mean": mean, "ci95_between_seeds": [low, high], "per_seed": values,
                          "threshold": threshold, "direction": direction,
                          "verdict": verdicts[key] if len(results) > 1 else None}
    overall.figures["parts"] = summaries
    overall.figures["tests"] = {key: test_of(s["per_seed"], s["threshold"], s["direction"], s["verdict"])
                                for key, s in summaries.items()}
    if len(results) == 1:
        return overall
    if all(v == "confirmed" for v in verdicts.values()):
        overall.verdict = "confirmed"
    elif any(v == "refuted" for v in verdicts.values()):
        overall.verdict = "refuted"
    else:
        overall.verdict = "inconclusive"
    overall.reason = f"over {len(results)} seeds (95% between-seed t-intervals): " + "; ".join(
        f"{key} {s['mean']:.4g} [{s['ci95_between_seeds'][0]:.4g}, {s['ci95_between_seeds'][1]:.4g}] "
        f"{verdicts[key]} against {s['direction']} {s['threshold']:g}" for key, s in summaries.items())
    return overall


def seeds_plot(result: ExperimentResult, path: Path) -> str:
    """Each seed's effect, their mean with its between-seed interval, and the threshold."""
    from matplotlib.figure import Figure

    effects = [r["figures"]["effect"] for r in result.replicates]
    seeds = [r["setting"].get("seed", i) for i, r in enumerate(result.replicates)]
    figure = Figure(figsize=(5, 3.2))
    axes = figure.add_subplot()
    axes.plot(range(len(effects)), effects, "o", label="one seed")
    mean = result.figures.get("effect")
    interval = result.figures.get("effect_ci95_between_seeds")
    if isinstance(mean, (int, float)) and interval:
        axes.axhspan(interval[0], interval[1], alpha=0.2, label="95% between-seed interval")
        axes.axhline(mean, label="mean")
    if "threshold" in result.figures:
        axes.axhline(result.figures["threshold"], color="grey", linestyle="--", label="threshold")
    axes.set_xticks(range(len(effects)), [str(s) for s in seeds])
    axes.set_xlabel("seed")
    axes.set_ylabel("effect")
    axes.set_title(f"{result.name}: {result.verdict}", fontsize=9)
    axes.legend(fontsize=7)
    figure.tight_layout()
    return save_figure(figure, path)


def run_seeds(experiment: ModuleType, *, seeds: int, seed: int, quick: bool, out_dir: Path | None, device: str,
              status: Callable[[str], None]) -> ExperimentResult:
    """Run ``experiment`` for each seed (its plots and, as soon as it finishes, its own
    ``result.json`` in ``out_dir/seed-S``, so a run stopped part way keeps the seeds it finished:
    :func:`pool` takes them), combine, and write ``out_dir/result.json`` and the per-seed plot."""
    results = []
    for s in range(seed, seed + seeds):
        seed_dir = out_dir / f"seed-{s}" if out_dir is not None else None
        if seed_dir is not None:
            seed_dir.mkdir(parents=True, exist_ok=True)
        tell = status if seeds == 1 else (lambda message, s=s: status(f"seed {s}: {message}"))
        setting = Setting(quick=quick, seed=s, out_dir=seed_dir, device=device, status=tell)
        wall, cpu = time.perf_counter(), time.process_time()
        result = experiment.run(setting)
        result.timing = {"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu}
        if seed_dir is not None:
            result.write(seed_dir)
        results.append(result)
    overall_setting = Setting(quick=quick, seed=seed, out_dir=out_dir, device=device, status=status)
    overall = conclude(experiment, results, overall_setting)
    overall.setting = {**results[0].setting, "quick": quick, "seeds": list(range(seed, seed + seeds))}
    overall.setting.pop("seed", None)
    if out_dir is not None:
        overall.plots = [seeds_plot(overall, out_dir / f"{experiment.NAME}-seeds.png")] + [
            p for r in results for p in r.plots]
        overall.write(out_dir)
    return overall


def conclude(experiment: ModuleType, results: list[ExperimentResult], setting: Setting) -> ExperimentResult:
    """The overall result of the seeds' ``results``: each seed's preconditions checked (where not
    yet), the experiment's combine, its preconditions over seeds, and the power of the part that
    decided the claim's verdict (:mod:`objreg.experiments.power`)."""
    checks = getattr(experiment, "PRECONDITIONS", ())
    for result in results:
        result.source, result.rule = experiment.SOURCE, experiment.RULE
        if not result.preconditions:
            preconditions.apply(result, [preconditions.check_seed(c, result) for c in checks])
    combine = getattr(experiment, "combine", None)
    if combine is not None:
        overall = combine(results, setting)
    else:
        overall = default_combine(results, setting, float(getattr(experiment, "THRESHOLD", 0.0)),
                                  getattr(experiment, "DIRECTION", "above"))
    overall.source, overall.rule = experiment.SOURCE, experiment.RULE
    tests = overall.figures.get("tests")
    overall.power = power.summary(tests, overall.verdict) if tests else None
    # A precondition that only exists across seeds (the outcome's own agreement between them).
    across = getattr(experiment, "preconditions_across_seeds", None)
    over_seeds = [preconditions.check_seeds(c, [c.value(r) for r in results])
                  for c in checks] + (across(results) if across is not None else [])
    if len(results) == 1:
        # One seed's checks are the overall's, and every combine carries that seed's verdict and
        # reason, which already say which check failed: applying them again would nest the reason.
        overall.preconditions = over_seeds
    else:
        preconditions.apply(overall, over_seeds)
    overall.replicates = [r.to_dict() for r in results]
    overall.timing = {key: sum(r.timing.get(key, 0.0) for r in results) for key in ("wall_s", "cpu_s")}
    return overall


def recombine(experiment: ModuleType, committed: dict[str, Any]) -> ExperimentResult:
    """The overall result of a committed ``result.json`` (its ``replicates``) under the experiment's
    current combine, preconditions and power, running nothing: for rules that read only figures
    the seeds already recorded. The seeds' figures, timing, settings and plots are kept.

    Each seed's own verdict is read again where the experiment says how (``seed_verdict(figures)
    -> (verdict, reason)``), its preconditions checked again under the current declarations, so
    a rule change reaches the per-seed verdicts too; an experiment without ``seed_verdict`` keeps
    the recorded ones, and a warning says so."""
    reread = getattr(experiment, "seed_verdict", None)
    if reread is None:
        warnings.warn(f"{experiment.NAME}: the per-seed verdicts are kept as recorded (the experiment has no "
                      f"seed_verdict to read them again); only the overall result is recomputed", stacklevel=2)
    results = []
    for r in committed["replicates"]:
        figures = copy.deepcopy(r["figures"])
        verdict, reason = reread(figures) if reread is not None else (r["verdict"], r["reason"])
        results.append(ExperimentResult(r["name"], r["claim"], verdict, reason, figures, r["setting"], list(r["plots"]),
                                        timing=dict(r["timing"]),
                                        preconditions=[] if reread is not None else list(r.get("preconditions", []))))
    seeds = [r.setting["seed"] for r in results]
    overall = conclude(experiment, results, Setting(quick=bool(committed["setting"].get("quick")), seed=seeds[0]))
    overall.setting = {**committed["setting"], "seeds": seeds}
    overall.plots = list(committed["plots"])
    overall.timing = dict(committed["timing"])
    return overall


def pool(committed: dict[str, Any], more: dict[str, Any]) -> dict[str, Any]:
    """A committed ``result.json`` with the seeds of another run of the same experiment and setting
    (``more``, e.g. ``--seed 3 --seeds 3`` after seeds 0 to 2, or one seed's ``seed-S/result.json``
    of a run stopped part way) added to its ``replicates``, its timing the sum of both; pass it to
    :func:`recombine` for the overall result over every seed.

    Raises:
        InvalidParameterError: the runs are of different experiments, settings, or share a seed.
    """
    def setting(result: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in result["setting"].items() if k != "seeds"}

    if "seeds" not in more["setting"]:  # one seed's own result: a run of that seed alone
        seed = more["setting"]["seed"]
        more = {**more, "replicates": [more],
                "setting": {**{k: v for k, v in more["setting"].items() if k != "seed"}, "seeds": [seed]}}

    if committed["name"] != more["name"] or setting(committed) != setting(more):
        raise InvalidParameterError(
            f"can only pool runs of one experiment in one setting: {committed['name']} {setting(committed)} "
            f"and {more['name']} {setting(more)}")
    shared = set(committed["setting"]["seeds"]) & set(more["setting"]["seeds"])
    if shared:
        raise InvalidParameterError(f"the runs share seeds {sorted(shared)}; pool runs of distinct seeds")
    timing = {key: committed["timing"][key] + more["timing"][key] for key in ("wall_s", "cpu_s")}
    return {**committed, "replicates": [*committed["replicates"], *more["replicates"]], "timing": timing,
            "setting": {**committed["setting"], "seeds": [*committed["setting"]["seeds"], *more["setting"]["seeds"]]}}
