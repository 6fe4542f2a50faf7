"""The alignment report and its durable outputs.

``steps.jsonl`` gets one line per finished probe, flushed and fsynced as it is written, so a
crash keeps every finished step; ``report.json`` is written to a temporary file and renamed into
place, so it is either absent or complete.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from objreg.analysis.stats import mean_ci95
from objreg.core.errors import DataError


@dataclass
class AlignmentReport:
    """What ``objreg.analyze`` returns. ``to_dict()`` gives the JSON shape the CLI prints:
    ``{"pretrain", "downstream", "config", "steps": [...], "summary": {...}}``."""

    pretrain: list[str]
    downstream: str
    config: dict[str, Any]
    steps: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "pretrain": list(self.pretrain),
            "downstream": self.downstream,
            "config": self.config,
            "steps": self.steps,
            "summary": self.summary,
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)


def summarise(pretrain: list[str], steps: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-objective alignment over the probes, and the run's first-order term vs what happened.

    ``first_order_term`` is ``Σ_t −∇D(θ_t)·Δθ_t`` over the probed steps: the improvement of the
    downstream loss that first-order Taylor predicts for the updates actually taken; with plain
    SGD it equals ``η Σ_t Σ_k α_k(t) c_k(t)``. ``actual_improvement`` is ``Σ_t −(D(θ_{t+1}) −
    D(θ_t))`` over the same steps. The first and the last step are always probed, so their records
    hold the downstream loss before training and after it.
    """
    alignment = {}
    for name in pretrain:
        dots = [s["alignment"][name]["dot"] for s in steps]
        mean, low, high = mean_ci95(dots)
        alignment[name] = {
            "dot": mean,
            "cosine": _mean(s["alignment"][name]["cosine"] for s in steps),
            "ci95": [low, high],
            "conflict_fraction": _mean(s["alignment"][name]["conflict_fraction"] for s in steps),
            "grad_norm": _mean(s["alignment"][name]["grad_norm"] for s in steps),
            "first_order_contribution": sum(s["first_order_by_objective"].get(name, 0.0) for s in steps),
        }
    predicted = sum(-s["predicted_delta"]["first_order"] for s in steps)
    actual = sum(-s["actual_delta"] for s in steps)
    return {
        "alignment": alignment,
        "first_order_term": predicted,
        "predicted_improvement": predicted,
        "actual_improvement": actual,
        "taylor_relative_error": abs(predicted - actual) / abs(actual) if actual != 0 else None,
        "initial_downstream_loss": steps[0]["downstream_loss"],
        "final_downstream_loss": steps[-1]["downstream_loss_after"],
        "probes": len(steps),
    }


def _mean(values: Any) -> float:
    values = list(values)
    return sum(values) / len(values) if values else 0.0


class RunWriter:
    """Writes a run's outputs into ``out_dir`` as they become available."""

    def __init__(self, out_dir: Path | str):
        self.out_dir = Path(out_dir)
        try:
            self.out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise DataError(f"cannot create output directory {str(self.out_dir)!r}: {e.strerror}") from None
        if not os.access(self.out_dir, os.W_OK):
            raise DataError(f"output directory {str(self.out_dir)!r} is not writable")
        self.steps_path = self.out_dir / "steps.jsonl"

    def write_config(self, config: dict[str, Any]) -> None:
        write_atomic(self.out_dir / "config.json", json.dumps(config, indent=2, allow_nan=False))

    def start_steps(self) -> None:
        """Begin a fresh ``steps.jsonl`` for this run."""
        with open(self.steps_path, "w", encoding="utf-8"):
            pass

    def append_step(self, step: dict[str, Any]) -> None:
        with open(self.steps_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(step, allow_nan=False) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def write_report(self, report: AlignmentReport) -> None:
        write_atomic(self.out_dir / "report.json", report.to_json())


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a synced temporary file and an atomic rename."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
