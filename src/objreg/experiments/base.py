"""What every experiment shares: its setting, its result, and the rule that turns data into a
verdict.

An experiment is a module with ``NAME`` (str), ``CLAIM`` (the literature's claim, both halves
where a finding has two), ``SOURCE`` (the citation), ``RULE`` (the verdict rule over seeds, one
sentence fixed before running), optionally ``THRESHOLD`` (float, default 0.0) and ``DIRECTION``
(``above`` or ``below``, default ``above``) for the default combine, and
``run(setting: Setting) -> ExperimentResult`` for ONE seed, whose ``figures["effect"]`` is the
quantity the rule is about. An optional ``combine(results, setting) -> ExperimentResult`` gives
the overall verdict over seeds; without it :func:`objreg.experiments.replication.default_combine`
does. Every verdict is computed from measurements, never written in: usually with
:func:`verdict_from_interval`, which asks whether a confidence interval of the effect lies on the
claim's side of a threshold.

Intervals inside one seed's figures describe that seed's model and evaluation set only (their
keys say ``within_seed``); the overall interval is between seeds.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from objreg.toolkit.atomic import atomic_file

CONFIRMED, REFUTED, INCONCLUSIVE = "confirmed", "refuted", "inconclusive"
VERDICTS = (CONFIRMED, REFUTED, INCONCLUSIVE)


@dataclass(frozen=True)
class Setting:
    """How to run an experiment.

    Args:
        quick: The small setting (under a minute on a 2-core CPU) rather than the full one.
        seed: Seeds every generator the experiment uses; the same seed gives the same figures.
        out_dir: Where to write ``result.json`` and plots (None: nothing is written).
        device: ``cpu``, ``cuda[:N]`` or ``auto``, for experiments that train.
        status: Called with a short line as each stage starts.
    """

    quick: bool = False
    seed: int = 0
    out_dir: Path | None = None
    device: str = "auto"
    status: Callable[[str], None] = field(default=lambda _message: None, compare=False)

    def size(self, quick: int, full: int) -> int:
        """``quick`` in the quick setting, else ``full``."""
        return quick if self.quick else full


@dataclass
class ExperimentResult:
    """An experiment's outcome. ``to_dict()`` is the JSON the CLI prints:
    ``{"name", "claim", "source", "rule", "verdict", "reason", "figures", "setting", "plots",
    "replicates", "timing", "preconditions", "power"}``.

    Args:
        verdict: ``confirmed``, ``refuted`` or ``inconclusive``, computed from ``figures``.
        reason: One sentence saying which figures decided the verdict, with their values.
        figures: The measurements (JSON-serialisable: numbers, strings, lists, dicts).
        setting: What was run (sizes, steps, seed), so the figures can be reproduced.
        plots: Paths of the PNG files written (empty without an output directory).
        source, rule: The experiment's ``SOURCE`` and ``RULE`` (filled in by the framework).
        replicates: In the overall result, each seed's ``to_dict()``; empty in one seed's.
        timing: ``wall_s`` and ``cpu_s`` (this process's CPU time, all threads) of the run,
            filled in by the framework; the only entry that differs between identical runs.
        preconditions: Each precondition's check (:mod:`objreg.experiments.preconditions`),
            filled in by the framework; one that failed made the verdict inconclusive.
        power: In the overall result, the power of the between-seed test of the part that
            decided (:mod:`objreg.experiments.power`): ``n80``, ``mde`` and how they were
            computed; None in one seed's result.
    """

    name: str
    claim: str
    verdict: str
    reason: str
    figures: dict[str, Any]
    setting: dict[str, Any] = field(default_factory=dict)
    plots: list[str] = field(default_factory=list)
    source: str = ""
    rule: str = ""
    replicates: list[dict[str, Any]] = field(default_factory=list)
    timing: dict[str, float] = field(default_factory=dict)
    preconditions: list[dict[str, Any]] = field(default_factory=list)
    power: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict {self.verdict!r} is not one of {', '.join(VERDICTS)}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "claim": self.claim, "source": self.source, "rule": self.rule,
            "verdict": self.verdict, "reason": self.reason, "figures": self.figures, "setting": self.setting,
            "plots": list(self.plots), "replicates": list(self.replicates),
            "timing": dict(self.timing), "preconditions": list(self.preconditions), "power": self.power,
        }

    def write(self, out_dir: Path) -> Path:
        """``out_dir/result.json``, written atomically."""
        path = Path(out_dir) / "result.json"
        with atomic_file(path, "w") as f:
            json.dump(self.to_dict(), f, indent=2, allow_nan=False)
        return path


def verdict_from_interval(low: float, high: float, threshold: float = 0.0, claim: str = "above") -> str:
    """The verdict on "the effect is ``claim`` ``threshold``" from a confidence interval of it.

    ``confirmed`` when the whole interval is on the claim's side, ``refuted`` when the whole
    interval is on the other side, ``inconclusive`` when it straddles the threshold.

    Args:
        low, high: The interval's ends.
        threshold: The value the claim compares the effect with.
        claim: ``above`` (the effect exceeds ``threshold``) or ``below``.
    """
    if claim not in ("above", "below"):
        raise ValueError(f"claim must be 'above' or 'below', not {claim!r}")
    if claim == "below":
        low, high, threshold = -high, -low, -threshold
    if low > threshold:
        return CONFIRMED
    if high < threshold:
        return REFUTED
    return INCONCLUSIVE


def save_figure(figure: Any, path: Path) -> str:
    """Write a matplotlib ``Figure`` (built without pyplot) to ``path`` as PNG, atomically."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(figure)
    with atomic_file(Path(path)) as f:
        figure.savefig(f, format="png", dpi=110)
    return str(path)
