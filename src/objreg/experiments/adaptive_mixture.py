"""Adaptive mixture: weights chosen during training from the measured transfer lower the
downstream loss more than fixed weights of the same total.

**Claim.** Setting the objective weights during pre-training from the end task's measured
transfer lowers the end-task loss after training compared with static weights (META-TARTAN,
Dery et al., ICLR 2022: weights that follow the meta-gradient of the end-task loss beat a fixed
multitask mixture). Here the weights follow the analyzer's probes: the trust-region optimum of
the second-order model (``adaptive:quadratic``) and a META-TARTAN-style multiplicative update
(``adaptive:tartan``).

**Setting.** ``mlm`` + ``sop`` against ``qa`` with SGD, the same seed for every condition (same
initial model, fitted probe, data and corruption), the same number of steps, and the same total
weight 2 at every step. Conditions: (a) uniform weights ``mlm = sop = 1``; (b) the best fixed
weights of a grid ``mlm ∈ {0, 0.5, 1, 1.5, 2}`` (quick: ``{0.5, 1, 1.5}``; ``sop = 2 − mlm``),
chosen by the final downstream loss on a *separate seed* (``seed + 1000``), so the choice is not
fitted to the seed it is judged on; (c) ``adaptive:quadratic`` and ``adaptive:tartan``, probing every
``probe_every`` steps. Quick: the built-in corpus and cloze ``qa`` set, small sizes. Full:
WikiText-2 (valid split) pre-training with SQuAD v1.1 (half a) as the ``qa`` data, from
``$OBJREG_SHARED_DATA`` or ``shared/data`` beside the checkout (the built-in setting at full size where that folder is absent).

**Measured.** Per condition the downstream loss after training (float64, the fixed evaluation
set) through the head re-fitted to the trained features, ``D*`` (``downstream_head="refit"``,
the analyzer's default since issue 27; the seeds committed before 2026-11-27 22:00 read the head
frozen at the start), and the CPU seconds per training step (this process's CPU time between
finished steps, so that other load on a shared machine does not count; the first and the last
step, probed in every condition, left out): the cost of the probes an adaptive rule needs.

**Verdict** (pre-declared): the effect of one seed is ``D(best fixed) − D(adaptive:quadratic)``
(positive: the adaptive rule ends lower). Over seeds: ``confirmed`` when the 95% t-interval of
its mean lies above 0, ``refuted`` when it lies below 0, ``inconclusive`` otherwise. The
other differences (each rule against uniform and against the best fixed weights) are reported
with their intervals but do not decide.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from objreg import Registry
from objreg.analysis.math.stats import mean_ci95
from objreg.analysis.parallel.devices import resolve_device
from objreg.analysis.run.analyze import analyze
from objreg.experiments import _support
from objreg.experiments.base import ExperimentResult, Setting, save_figure, verdict_from_interval
from objreg.experiments.preconditions import Precondition
from objreg.experiments.replication import test_of

NAME = "adaptive-mixture"
CLAIM = ("Objective weights set during pre-training from the end task's measured transfer lower the end-task "
         "loss after training compared with fixed weights of the same total (as META-TARTAN's meta-learned "
         "weights beat a static multitask mixture).")
SOURCE = ("Dery et al. 2022: Should We Be Pre-training? An Argument for End-task Aware Training as "
          "an Alternative, ICLR 2022, section 5 and table 2 (META-TARTAN against MT-TARTAN)")
RULE = ("effect = D(best fixed grid weights, chosen on seed + 1000) − D(adaptive:quadratic) after training; "
        "confirmed when the 95% t-interval of its mean over seeds is above 0, refuted when below 0, else "
        "inconclusive")
THRESHOLD = 0.0
DIRECTION = "above"

TOTAL = 2.0
#: The manipulation check: an adaptive rule that never left the uniform weights is the uniform condition.
PRECONDITIONS = (Precondition(
    "rule_moved_weights", "the mean over steps of |mlm's weight - 1| under adaptive:quadratic", 0.1, "above",
    lambda figures, setting: float(np.mean(np.abs(np.asarray(figures["adaptive_weights"]["adaptive_quadratic"]["mlm"])
                                                  - TOTAL / 2)))),)
SEARCH_SEED_OFFSET = 1000
SQUAD = "squad_v1.1/dev-v1.1.half-a.json"


@dataclass(frozen=True)
class Config:
    steps: int
    probe_every: int
    lr: float
    batch_size: int
    seq_len: int
    eval_size: int
    head_warmup_steps: int
    head_fit_size: int
    grid: tuple[float, ...] = (0.0, 0.5, 1.0, 1.5, 2.0)  # mlm's weight; sop gets the rest of the total
    corpus: str = "default"
    downstream_data: str | None = None
    #: Named, not left to the analyzer's default, so a result records which loss it read: the
    #: seeds run before the default became the re-fitted head read the frozen one.
    downstream_head: str = "refit"


QUICK = Config(steps=12, probe_every=2, lr=5e-3, batch_size=8, seq_len=64, eval_size=16, head_warmup_steps=20,
               head_fit_size=64, grid=(0.5, 1.0, 1.5))
FULL = Config(steps=32, probe_every=4, lr=5e-3, batch_size=16, seq_len=128, eval_size=32, head_warmup_steps=50,
              head_fit_size=256)


def config_for(setting: Setting) -> Config:
    if setting.quick:
        return QUICK
    corpus, squad = _support.shared_data() / _support.WIKITEXT, _support.shared_data() / SQUAD
    if corpus.is_file() and squad.is_file():
        return Config(**{**asdict(FULL), "corpus": str(corpus), "downstream_data": str(squad)})
    return FULL


def _train(config: Config, setting: Setting, registry: Registry, seed: int, **how: Any) -> dict[str, Any]:
    """One run of ``config`` (``how``: weights, or an adaptive schedule with its probe interval);
    the final downstream loss, the weights used and the seconds per step."""
    finished: list[float] = []
    report = analyze(
        ["mlm", "sop"], "qa", registry=registry, steps=config.steps, lr=config.lr, optimizer="sgd",
        batch_size=config.batch_size, seq_len=config.seq_len, eval_size=config.eval_size,
        # A re-fitted head is solved at every probe and takes no warm-up (the field is a frozen head's).
        head_warmup_steps=config.head_warmup_steps if config.downstream_head == "frozen" else None,
        head_fit_size=config.head_fit_size, seed=seed,
        device=str(resolve_device(setting.device)), corpus=config.corpus, downstream_data=config.downstream_data,
        downstream_head=config.downstream_head,
        attribution_top=0, on_step=lambda step, record: finished.append(time.process_time()),
        **{"probe_every": config.steps, **how},
    )
    summary = report.summary
    return {
        "final_downstream_loss": summary["final_downstream_loss"],
        "initial_downstream_loss": summary["initial_downstream_loss"],
        "weights_by_step": summary["weights_by_step"],
        # Mean CPU time between finished steps, the first and the last step (probed in every
        # condition) left out: the training step plus the probes the condition needs.
        "seconds_per_step": float(np.mean(np.diff(finished)[:-1])) if len(finished) > 2 else None,
        "counterfactual_best": (summary["counterfactual"]["best"] or {}).get("weights"),
        # Adaptive runs: did the rule beat the best constant weights of its own run's local model,
        # and did its weights oscillate (summary.adaptive)?
        "adaptive": summary.get("adaptive"),
    }


def best_weight(search: dict[float, float]) -> float:
    """The grid weight with the lowest final loss (ties: the one nearest uniform)."""
    return min(search, key=lambda w: (search[w], abs(w - TOTAL / 2)))


def run(setting: Setting) -> ExperimentResult:
    config = config_for(setting)
    registry = Registry.load()
    search_seed = setting.seed + SEARCH_SEED_OFFSET
    search = {}
    for w in config.grid:
        setting.status(f"grid search on seed {search_seed}: mlm={w:g}, sop={TOTAL - w:g}")
        search[w] = _train(config, setting, registry, search_seed,
                           weights={"mlm": w, "sop": TOTAL - w})["final_downstream_loss"]
    best_w = best_weight(search)
    conditions = {
        "uniform": {"weights": {"mlm": 1.0, "sop": 1.0}},
        "best_fixed": {"weights": {"mlm": best_w, "sop": TOTAL - best_w}},
        "adaptive_quadratic": {"schedule": "adaptive:quadratic", "probe_every": config.probe_every},
        "adaptive_tartan": {"schedule": "adaptive:tartan", "probe_every": config.probe_every},
    }
    runs = {}
    for name, how in conditions.items():
        setting.status(f"training {name} on seed {setting.seed}")
        runs[name] = _train(config, setting, registry, setting.seed, **how)
    final = {name: r["final_downstream_loss"] for name, r in runs.items()}
    effect = final["best_fixed"] - final["adaptive_quadratic"]
    uniform_time = runs["uniform"]["seconds_per_step"]
    figures = {
        "effect": effect,
        "final_downstream_loss": final,
        "initial_downstream_loss": runs["uniform"]["initial_downstream_loss"],
        "grid_search": {"seed": search_seed, "final_downstream_loss_by_mlm_weight": {f"{w:g}": v for w, v in
                                                                                      search.items()},
                        "best_mlm_weight": best_w},
        "differences": {
            f"{rule}_vs_{base}": final[base] - final[rule]
            for rule in ("adaptive_quadratic", "adaptive_tartan") for base in ("uniform", "best_fixed")
        },
        "seconds_per_step": {name: r["seconds_per_step"] for name, r in runs.items()},
        "overhead": {name: (runs[name]["seconds_per_step"] / uniform_time if uniform_time else None)
                     for name in ("adaptive_quadratic", "adaptive_tartan")},
        "adaptive_weights": {name: runs[name]["weights_by_step"] for name in ("adaptive_quadratic",
                                                                               "adaptive_tartan")},
        "uniform_counterfactual_best": runs["uniform"]["counterfactual_best"],
        "adaptive_report": {name: {key: runs[name]["adaptive"][key] for key in
                                   ("beat_best_constant", "predicted_improvement",
                                    "best_constant_predicted_improvement", "reversals", "oscillating")}
                            for name in ("adaptive_quadratic", "adaptive_tartan")},
    }
    verdict, reason = seed_verdict(figures)
    plots = [plot([figures], setting.out_dir / f"{NAME}.png")] if setting.out_dir is not None else []
    return ExperimentResult(NAME, CLAIM, verdict, reason, figures, _setting(config, setting), plots)


def _setting(config: Config, setting: Setting) -> dict[str, Any]:
    return {**asdict(config), "seed": setting.seed, "quick": setting.quick, "pretrain": ["mlm", "sop"],
            "downstream": "qa", "optimizer": "sgd", "total_weight": TOTAL, "grid": list(config.grid)}


def combine(results: list[ExperimentResult], setting: Setting) -> ExperimentResult:
    """The verdict of :data:`RULE` over seeds, with t-intervals of every condition's final loss,
    of every difference, and of the overhead."""
    figures = [r.figures for r in results]
    effects = [f["effect"] for f in figures]

    def interval(values: list[float]) -> dict[str, Any]:
        if len(values) < 2:
            return {"mean": float(values[0]) if values else None, "ci95": None, "values": values}
        mean, low, high = mean_ci95(values)
        return {"mean": mean, "ci95": [low, high], "values": values}

    overall = interval(effects)
    if overall["ci95"] is None:
        verdict = results[0].verdict
        reason = f"only one seed was run: {results[0].reason}"
        tested = None
    else:
        low, high = overall["ci95"]
        verdict = tested = verdict_from_interval(low, high, THRESHOLD, DIRECTION)
        reason = (f"D(best fixed) − D(adaptive:quadratic) = {overall['mean']:+.4g}, 95% t-interval "
                  f"[{low:+.4g}, {high:+.4g}] over {len(results)} seeds (confirmed above 0, refuted below 0)")
    names = list(figures[0]["final_downstream_loss"])
    combined = {
        "effect": overall["mean"],
        "effect_interval": overall,
        "effect_ci95_between_seeds": overall["ci95"],
        "tests": {"effect": test_of(effects, THRESHOLD, DIRECTION, tested)},
        "final_downstream_loss": {n: interval([f["final_downstream_loss"][n] for f in figures]) for n in names},
        "differences": {k: interval([f["differences"][k] for f in figures]) for k in figures[0]["differences"]},
        "overhead": {k: interval([f["overhead"][k] for f in figures if f["overhead"][k] is not None])
                     for k in figures[0]["overhead"]},
        "seconds_per_step": {n: interval([f["seconds_per_step"][n] for f in figures
                                          if f["seconds_per_step"][n] is not None]) for n in names},
        "best_mlm_weight_by_seed": [f["grid_search"]["best_mlm_weight"] for f in figures],
        # Per rule, over seeds: how often it beat its run's best constant weights (by the run's own
        # local model), and how often its weights oscillated.
        "adaptive_report": {rule: {"beat_best_constant": sum(f["adaptive_report"][rule]["beat_best_constant"]
                                                             for f in figures),
                                   "oscillated": sum(bool(f["adaptive_report"][rule]["oscillating"]) for f in figures),
                                   "seeds": len(figures)}
                            for rule in figures[0]["adaptive_report"]},
    }
    plots = [plot(figures, setting.out_dir / f"{NAME}.png")] if setting.out_dir is not None else []
    return ExperimentResult(NAME, CLAIM, verdict, reason, combined,
                            {**results[0].setting, "seeds": [r.setting["seed"] for r in results]}, plots)


def plot(figures: list[dict[str, Any]], path: Path) -> str:
    """Left: each seed's final downstream loss per condition, relative to its uniform run. Right:
    ``mlm``'s weight over the run under each adaptive rule, one line per seed."""
    from matplotlib.figure import Figure

    names = list(figures[0]["final_downstream_loss"])
    figure = Figure(figsize=(11, 4.2), layout="constrained")
    losses, weights = figure.subplots(1, 2)
    for i, f in enumerate(figures):
        final = f["final_downstream_loss"]
        losses.plot(range(len(names)), [final[n] - final["uniform"] for n in names], "o-", alpha=0.7,
                    label=f"seed {i}")
        for rule, style in (("adaptive_quadratic", "-"), ("adaptive_tartan", "--")):
            mlm = f["adaptive_weights"][rule]["mlm"]
            weights.plot(range(len(mlm) + 1), [*mlm, mlm[-1]], style, drawstyle="steps-post", color=f"C{i}",
                         label=f"{rule.split('_')[1]}, seed {i}")
    losses.axhline(0.0, color="grey", linewidth=0.8)
    losses.set_xticks(range(len(names)), [n.replace("_", "\n") for n in names])
    losses.set(ylabel="final D − final D of uniform weights (loss units)",
               title="Downstream loss after training (below 0: better than uniform)")
    losses.legend(fontsize="small")
    weights.set(xlabel="training step", ylabel="weight of mlm (sop = 2 − mlm)",
                title="mlm's weight chosen by each adaptive rule")
    weights.legend(fontsize="x-small", ncol=2)
    return save_figure(figure, path)


def seed_verdict(figures: dict[str, Any]) -> tuple[str, str]:
    """One seed's verdict and reason from its figures (``recombine`` reads them again after a rule change)."""
    final = figures["final_downstream_loss"]
    effect = final["best_fixed"] - final["adaptive_quadratic"]
    verdict = "confirmed" if effect > 0 else "refuted" if effect < 0 else "inconclusive"
    best_w = figures["grid_search"]["best_mlm_weight"]
    reason = (f"one seed: D(best fixed, mlm={best_w:g}) − D(adaptive:quadratic) = {effect:+.4g} "
              f"(final D: {', '.join(f'{k} {v:.4f}' for k, v in final.items())})")
    return verdict, reason
