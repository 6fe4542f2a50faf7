"""The end of ``objreg analyze``'s report: what this run can tell, what it cannot, what to run next.

Read off the report alone (its ``config`` and ``summary``), so it says the same as the JSON. Each
statement names the numbers it rests on; each suggestion is options to add to the same command.
"""

from __future__ import annotations

from typing import Any

from objreg.analysis.run.overfit import memorising_head

#: The command line's names of the head-fit settings (the run's warning names them so too).
CLI_NAMES = {"head_fit_size": "--head-fit-size", "head_warmup_steps": "--head-warmup-steps"}

#: The built-in model's shape, as README.md describes it.
DEFAULT_MODEL = "a 2-layer, 128-wide Transformer trained from scratch"


def _names(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def assess(report: dict[str, Any]) -> list[tuple[str, list[str]]]:
    """``[(heading, [statement, ...]), ...]``: what the run tells, what it cannot tell, what next."""
    config, summary = report["config"], report["summary"]
    return [("What this run tells", _tells(report)), ("What it cannot tell", _cannot(report)),
            ("What to run next", _next(config, summary, report["pretrain"]))]


def _tells(report: dict[str, Any]) -> list[str]:
    config, summary, task = report["config"], report["summary"], report["downstream"]
    before, after = summary["initial_downstream_loss"], summary["final_downstream_loss"]
    moved = "fell" if after < before else "rose" if after > before else "stayed"
    mix = "+".join(report["pretrain"])
    helps_or_not = {"fell": "helped", "rose": "did not help", "stayed": "did not change"}[moved]
    head = (f"of a probe re-fitted at each step on {config['head_fit_size']:,} others"
            if config.get("downstream_head", "frozen") == "refit" else "through the head fitted before training")
    tells = [f"D, the {task} loss on {config['downstream_examples']} held-out examples {head}, {moved} from "
             f"{before:.4f} to {after:.4f} over {config['steps']} steps: here {mix} pre-training {helps_or_not} "
             f"{task}."]
    alignment = summary["alignment"]
    above = [n for n, a in alignment.items() if a["ci95"][0] > 0]
    below = [n for n, a in alignment.items() if a["ci95"][1] < 0]
    spans = [n for n in alignment if n not in above and n not in below]
    sgd = config["optimizer"] == "sgd"
    effect = "" if sgd else (f" (under {config['optimizer']} the step is not the gradient: the predicted gain column "
                             f"gives each objective's part of the steps taken)")
    if above:
        tells.append(f"{_names(above)}: the dot's 95% interval is above zero, so the gradient points downhill for D "
                     f"and training on it lowers D, to first order{effect}.")
    if below:
        tells.append(f"{_names(below)}: the dot's 95% interval is below zero, so the gradient points uphill for D "
                     f"and training on it raises D, to first order{effect}.")
    if spans:
        share = ", ".join(f"{alignment[n]['conflict_fraction']:.0%}" for n in spans)
        tells.append(f"{_names(spans)}: the dot's 95% interval spans zero, so over {summary['probes']} probes "
                     f"{'it is not' if len(spans) == 1 else 'none is'} measurably aligned with {task} or opposed to it "
                     f"(conflicting examples: {share}).")
    regime, error = summary.get("taylor_regime") or {"inside": True}, summary["taylor_relative_error"]
    if not regime["inside"]:
        outside = len(regime["steps_outside"])
        tells.append(f"{outside} of {summary['probes']} probed steps {'is' if outside == 1 else 'are'} outside the "
                     f"Taylor regime: there the predicted parts do not account for what the step did to D.")
    elif error is not None:
        tells.append(f"The Taylor prediction holds: with its second-order term it is {error:.1%} off the actual "
                     f"change of D, so the parts in the tables account for what the steps did.")
    else:
        tells.append("Every probed step is inside the Taylor regime (the steps' changes cancel over the run, so the "
                     "total has no relative error).")
    return tells


def _cannot(report: dict[str, Any]) -> list[str]:
    config, task, names = report["config"], report["downstream"], report["pretrain"]
    cannot = []
    memorising = memorising_head(config, report["steps"][0], CLI_NAMES) if report.get("steps") else None
    if memorising is not None:
        cannot.append(f"What the task's gradient is: {memorising}.")
    bidirectional = [n for n in names if (config.get("objective_attention") or {}).get(n) == "bidirectional"]
    if config.get("architecture") == "decoder" and bidirectional:
        cannot.append(f"How {_names(bidirectional)} {'runs' if len(bidirectional) == 1 else 'run'} on this decoder "
                      f"as it was pre-trained: a decoder-only model runs {_names(bidirectional)} bidirectionally "
                      f"(a 4-D mask, docs/models.md), not causally, so the alignment is that of the decoder made "
                      f"bidirectional.")
    cannot.append(f"What longer pre-training does: {config['steps']} steps from one starting point and one seed "
                  f"({config['seed']}) show how the gradients meet now; alignment changes as training goes on.")
    if config.get("model") in ("default", None):
        cannot.append(f"How a real model behaves: the default backbone is {DEFAULT_MODEL} (--model DIR loads a "
                      f"Hugging Face one).")
    if not config.get("downstream_data"):
        cannot.append(f"How {_names(names)} {'transfers' if len(names) == 1 else 'transfer'} to a real {task} "
                      f"benchmark: D is objreg's built-in {task} set "
                      f"from held-out corpus text (--downstream-data takes real data).")
    if len(names) > 1:
        cannot.append("What other weights would do over the whole run: the counterfactual is a local estimate "
                      "along this trajectory; only a run with those weights says.")
    return cannot


def _next(config: dict[str, Any], summary: dict[str, Any], names: list[str]) -> list[str]:
    steps, alignment = config["steps"], summary["alignment"]
    suggestions = []
    regime = summary.get("taylor_regime") or {"inside": True}
    if not regime["inside"]:
        suggestions.append(f"A smaller step, so that the Taylor parts hold: --lr {config['lr'] / 2:g}.")
    if any(a["ci95"][0] <= 0 <= a["ci95"][1] for a in alignment.values()):
        every = max(1, config.get("probe_every") or 1)
        suggestions.append(f"More probes narrow the intervals: --steps {4 * steps} (with --probe-every {4 * every} "
                           f"the probing costs what it did here).")
    if len(names) == 1:
        suggestions.append(f"A second objective to compare with: --pretrain {names[0]},OTHER (objreg list names "
                           f"them).")
    else:
        best = (summary.get("counterfactual") or {}).get("best")
        if best is not None and best["gain_over_used"] > 0:
            weights = ",".join(f"{k}={v:.3g}" for k, v in best["weights"].items())
            suggestions.append(f"Check the counterfactual's weights by running them: --weights {weights}.")
    suggestions.append(f"Another seed, to see whether this holds: --seed {config['seed'] + 1}.")
    if not config.get("out_dir"):
        suggestions.append("Keep every probe's record and the plots: --out DIR.")
    return suggestions
