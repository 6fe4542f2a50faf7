"""The end of ``objreg screen``'s output: what the ranking tells, what it cannot, what to run next.

Read off the report alone (its ``config``, ``candidates`` and ``validity``), so it says the same as
the JSON; each suggestion is a command to run.
"""

from __future__ import annotations

import shlex
from typing import Any

#: How much longer than the screen the suggested outcome runs train (the validity experiment's
#: outcome trains at least 10× the screen's compute).
OUTCOME_FACTOR = 10


def assess(report: dict[str, Any]) -> list[tuple[str, list[str]]]:
    """``[(heading, [statement, ...]), ...]``: what the ranking tells, what it cannot tell, what next."""
    ranked = [e for e in report["candidates"] if e["runnable"]]
    return [("What the ranking tells", _tells(report, ranked)), ("What it cannot tell", _cannot(report, ranked)),
            ("What to run next", _next(report, ranked))]


def _first_group(ranked: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in ranked if e["rank"] == 1]


def _tells(report: dict[str, Any], ranked: list[dict[str, Any]]) -> list[str]:
    if not ranked:
        return ["Nothing: no candidate was ranked (the reasons are listed above)."]
    task, budget = report["downstream"], report["budget"]
    first = _first_group(ranked)
    tells = []
    if len(ranked) == 1:
        tells.append(f"{ranked[0]['candidate']} alone was ranked: there is nothing to compare it with.")
    elif len(first) == len(ranked):
        tells.append(f"Nothing about the order: the score intervals of all {len(ranked)} candidates overlap after "
                     f"{budget} each, so this budget does not separate them.")
    else:
        names = ", ".join(e["candidate"] for e in first)
        below = len(ranked) - len(first)
        s = first[0]["score"]
        leader = first[0]["candidate"]
        tells.append(f"{names} {'ranks' if len(first) == 1 else 'tie for'} first ({leader}: a predicted drop of "
                     f"{task}'s D* per step of {s['mean']:+.3g} [{s['low']:+.3g}, {s['high']:+.3g}]); the {below} "
                     f"candidate(s) ranked below lie wholly under {leader}'s interval, over {budget} from one start "
                     f"and one seed.")
    by_lookahead = max(ranked, key=lambda e: e["lookahead"]["mean"])
    by_score = ranked[0]
    if len(ranked) > 1:
        agree = "agrees" if by_lookahead is by_score else "does not agree"
        tells.append(f"The short run itself {agree}: the largest actual drop of D* per step (lookahead) is "
                     f"{by_lookahead['candidate']}'s, {by_lookahead['lookahead']['mean']:+.3g}.")
    return tells


def _cannot(report: dict[str, Any], ranked: list[dict[str, Any]]) -> list[str]:
    task, config = report["downstream"], report["config"]
    cannot = [f"Which candidate gives the better {task} model after pre-training: the ranking is of a short run's "
              f"predicted drop of D* (a re-fitted probe's loss), not of the fine-tuned metric after longer training."]
    if report["validity"].startswith("validity: not validated"):
        cannot.append("How often such a ranking picks the better objective in this setting: it is not validated "
                      "here (the validity line above), so no accuracy can be quoted for it.")
    if config.get("model") in ("default", None):
        cannot.append("How a real model ranks them: the default backbone is a small Transformer trained from scratch "
                      "(--model DIR screens a Hugging Face one, e.g. all-MiniLM-L6-v2, docs/finetune.md).")
    cannot.append(f"Whether the order holds for another seed or start: one seed ({config['seed']}).")
    return cannot


def _command(program: str, options: dict[str, Any]) -> str:
    """``program`` (already quoted) with ``--key value`` for every option that is set."""
    return program + "".join(f" --{key.replace('_', '-')} {shlex.quote(str(value))}"
                             for key, value in options.items() if value is not None)


def _weights(candidate: dict[str, Any]) -> str | None:
    """A mixture's equal weights as the screen trained it (analyze's default is 1 each)."""
    names = candidate["objectives"]
    return None if len(names) == 1 else ",".join(f"{n}={1 / len(names):.6g}" for n in names)


def _params(candidate: dict[str, Any]) -> str:
    return "".join(f" --param {shlex.quote(f'{o}.{k}={v}')}" for o, given in candidate["params"].items()
                   for k, v in given.items())


def _next(report: dict[str, Any], ranked: list[dict[str, Any]]) -> list[str]:
    config, task = report["config"], report["downstream"]
    common = {"downstream": task, "downstream_data": config.get("downstream_data"),
              "model": None if config.get("model") in ("default", None) else config["model"],
              "corpus": None if config.get("corpus") in ("default", None) else config["corpus"],
              "optimizer": config["optimizer"], "lr": config["lr"],
              **{k: config.get(k) for k in ("batch_size", "seq_len", "eval_size", "head_fit_size", "seed")}}
    steps = [e["steps"] for e in ranked]
    suggestions = []
    if any(e.get("diverged_at") is not None for e in report["candidates"]):
        suggestions.append("A smaller learning rate, under which no run diverges: " + _command(
            "objreg screen", {"candidates": ",".join(e["candidate"] for e in report["candidates"]), **common,
                              "lr": config["lr"] / 10, "budget": report["budget"].split()[0]}))
    if len(ranked) > 1 and len(_first_group(ranked)) == len(ranked):
        budget = 2 * max(steps)
        candidates = ",".join(e["candidate"] for e in ranked)
        suggestions.append("A longer screen, whose intervals are narrower: " + _command(
            "objreg screen", {"candidates": candidates, **common, "budget": budget}))
    top = ranked[:2]
    if not top:
        return suggestions
    longer = OUTCOME_FACTOR * max(steps)
    fine_tunable = common["model"] is not None and common["downstream_data"] is not None
    if not fine_tunable:
        why = ("the default model is not saved for a fine-tune" if common["model"] is None
               else "a fine-tune needs the task's data, --downstream-data")
        suggestions.append(f"The outcome the screen predicts, for the top {len(top)}: each trained {OUTCOME_FACTOR}× "
                           f"longer, comparing D* at the end ({why}):")
    else:
        suggestions.append(f"The outcome the screen predicts, for the top {len(top)}: continued pre-training "
                           f"{OUTCOME_FACTOR}× longer with each, then objreg finetune of each run and of the model "
                           f"as it is (the baseline):")
    fine_tune = {"downstream": task, "downstream_data": common["downstream_data"]}
    for e in top:
        out = "run-" + e["candidate"].replace("+", "-").replace(":", "-").replace("=", "")
        suggestions.append(_command("objreg analyze", {
            "pretrain": ",".join(e["objectives"]), "weights": _weights(e), **common, "steps": longer,
            "out": out if fine_tunable else None}) + _params(e))
        if fine_tunable:
            suggestions.append(_command(f"objreg finetune {shlex.quote(out)}", fine_tune))
    if fine_tunable:
        suggestions.append(_command(f"objreg finetune {shlex.quote(common['model'])}", fine_tune))
    return suggestions
    longer = OUTCOME_FACTOR * max(steps)
    if common["model"] is None:
        suggestions.append(f"The outcome the screen predicts, for the top {len(top)}: each trained {OUTCOME_FACTOR}× "
                           f"longer, comparing D* at the end (the default model is not saved for a fine-tune):")
        for e in top:
            suggestions.append(_command("objreg analyze", {"pretrain": ",".join(e["objectives"]), **common,
                                                           "steps": longer}) + _params(e))
    else:
        suggestions.append(f"The outcome the screen predicts, for the top {len(top)}: continued pre-training "
                           f"{OUTCOME_FACTOR}× longer with each, then objreg finetune of each run (and of the model "
                           f"as it is, the baseline):")
        for e in top:
            out = "run-" + e["candidate"].replace("+", "-").replace(":", "-").replace("=", "")
            suggestions.append(_command("objreg analyze", {"pretrain": ",".join(e["objectives"]), **common,
                                                           "steps": longer, "out": out}) + _params(e))
            suggestions.append(_command(f"objreg finetune {shlex.quote(out)}",
                                        {"downstream": task, "downstream_data": common["downstream_data"]}))
    return suggestions
