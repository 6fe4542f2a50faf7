"""Which setting a screen ran in, and what the committed validation says about that setting.

A screen's ranking is validated only where experiment ``screen-validity`` measured it: the same
model, corpus, task, task data, rows and set sizes, optimizer, learning rate and budget.
:func:`describe` names a screen's setting; files and model directories are named by their name
and a digest of their content, so a built-in set never passes for a file and one file never
for another of the same name. :func:`line` is the report's validity line: the committed figure
for a setting the experiment ran, else "not validated for this setting" with the settings it did
run (never a figure measured on other data).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from objreg.analysis.run.config import AnalysisConfig

#: The sizes a validated setting fixes.
VALIDATED_SIZES = ("batch_size", "seq_len", "eval_size", "head_fit_size")
NOT_VALIDATED = "validity: not validated for this setting"


def identity(value: str | None, builtin: str = "built-in") -> str:
    """``value`` as a setting names it: ``built-in`` for None, a name as given, and an existing file
    or directory as its name and the first 12 hex digits of a SHA-256 of its content (a directory's:
    of its top-level files' names and bytes, in name order)."""
    if value is None:
        return builtin
    path = Path(value)
    if not path.exists():
        return value
    digest = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.iterdir() if p.is_file())
    for file in files:
        digest.update(file.name.encode() if file is not path else b"")
        with file.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return f"{path.name} sha256:{digest.hexdigest()[:12]}"


def describe(config: AnalysisConfig, budget: str, probe_every: int = 1) -> dict[str, Any]:
    """What a screen's validity depends on, each value comparable across machines."""
    return {"model": identity(config.model), "corpus": identity(config.corpus),
            "downstream": config.downstream, "downstream_data": identity(config.downstream_data),
            **{key: getattr(config, key) for key in VALIDATED_SIZES},
            "optimizer": config.optimizer, "lr": config.lr, "dtype": config.dtype, "budget": budget,
            "probe_every": probe_every}


def validated(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The settings a committed result validated: ``[{"task", "label", "setting"}]`` (``task``: its
    key in ``figures.per_task``), as the redesign records them in ``figures.validated``. A result
    of the first design (2026-11-27), which recorded its data by path only, is read through
    :func:`describe` of what it ran: its data file named by its content where this machine holds
    it, else by its path (then nothing matches it)."""
    setting = result["setting"]
    if "validated" in result["figures"]:  # the redesign: every seed's and task's setting
        return result["figures"]["validated"]
    defaults = AnalysisConfig(pretrain=("mlm",))
    found = []
    for task in result["figures"]["per_task"]:
        sizes = {k: setting.get(f"{task}_{k}") or setting.get(k) for k in VALIDATED_SIZES}
        datas = {r["figures"]["per_task"][task].get("downstream_data") for r in result.get("replicates", [])} or {None}
        for data in sorted(datas, key=str):
            config = AnalysisConfig(pretrain=("mlm",), model=setting["model"], corpus=setting["corpus"],
                                    downstream=task, **sizes)
            described = {**describe(config, f"{setting['budget']} steps"), "downstream_data": identity(data)}
            found.append({"task": task, "label": f"{task} on {'the built-in set' if data is None else Path(data).name}",
                          "setting": {**described, "optimizer": defaults.optimizer, "lr": defaults.lr}})
    return found


def _shown(setting: dict[str, Any]) -> str:
    return (f"model {setting['model']}, corpus {setting['corpus']}, {setting['downstream']} data "
            f"{setting['downstream_data']}, " + ", ".join(f"{k} {setting[k]}" for k in VALIDATED_SIZES)
            + f", {setting['optimizer']} lr {setting['lr']:g}, budget {setting['budget']}")


def _figure(result: dict[str, Any], task: str) -> str:
    found = result["figures"]["per_task"][task]
    if "rho" in found:  # the first design: the score's Spearman ρ with D* after 20× the steps
        rho = found["rho"]["screen"]
        return (f"Spearman ρ {rho['mean']:+.2f} [{rho['low']:+.2f}, {rho['high']:+.2f}] between the screen and "
                f"D* after {result['setting'].get('outcome_factor')}× the steps over {rho['seeds']} seeds")
    signal = result["setting"]["signal"]
    figures = found["outcomes"][result["setting"]["outcome"]]["signals"][signal]
    accuracy, rho = figures["pairwise_accuracy"], figures["spearman"]
    if accuracy["mean"] is None:  # no pair of candidates differed in outcome
        shown = "no pairwise decision accuracy (no two candidates' outcomes differed)"
    else:
        shown = f"pairwise decision accuracy {accuracy['mean']:.2f} [{accuracy['low']:.2f}, {accuracy['high']:.2f}]"
    return (f"{shown} and Spearman ρ {rho['mean']:+.2f} of its {signal} ranking against "
            f"{result['setting']['outcome']} over {result['setting']['candidates_count']} candidates and "
            f"{len(result['setting']['seeds'])} seeds")


def line(result: dict[str, Any], config: AnalysisConfig, budget: str, probe_every: int = 1) -> str:
    """The validity line for a screen in ``config`` at ``budget`` (module docstring)."""
    try:
        settings = validated(result)
    except (KeyError, TypeError, ValueError):
        return f"{NOT_VALIDATED} (the committed result of experiment screen-validity is not readable)"
    ours = describe(config, budget, probe_every)
    for entry in settings:
        if entry["setting"] == ours:
            return (f"validity: experiment screen-validity ran this setting ({entry['label']}, model {ours['model']}, "
                    f"budget {budget}) and measured {_figure(result, entry['task'])} (its verdict: "
                    f"{result.get('verdict')})")
    ran = "; ".join(f"{e['label']}: {_shown(e['setting'])}" for e in settings)
    return f"{NOT_VALIDATED} (experiment screen-validity ran only {ran})"
