"""A run's checkpoint: everything needed to continue it from its last finished step.

``checkpoint.pt`` in the run directory holds the trainer's state (model, optimizer, data and
corruption generators, the global CPU generator dropout draws from, the attribution scores, the
step to run next) and the probe records so far. It is rewritten after every finished step through
a synced temporary file and an atomic rename, so it is either the previous step's or this one's,
never half written: a killed run loses at most the step in flight.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from objreg.analysis.atomic import atomic_file
from objreg.core.errors import DataError

CHECKPOINT = "checkpoint.pt"
FORMAT = 1


def save_checkpoint(out_dir: Path, trainer_state: dict[str, Any], records: list[dict[str, Any]]) -> None:
    """Write ``checkpoint.pt`` in ``out_dir`` atomically."""
    path = Path(out_dir) / CHECKPOINT
    with atomic_file(path) as f:
        torch.save({"format": FORMAT, "trainer": trainer_state, "records": records}, f)


def load_checkpoint(out_dir: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The trainer state and the probe records of ``out_dir``'s checkpoint.

    Raises:
        DataError: the checkpoint is missing, unreadable or not one this version wrote.
    """
    path = Path(out_dir) / CHECKPOINT
    if not path.is_file():
        raise DataError(f"cannot resume {str(out_dir)!r}: no {CHECKPOINT} (the run stopped before finishing a step); "
                        f"start it again")
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for a truncated or foreign file
        raise DataError(f"cannot resume {str(out_dir)!r}: {CHECKPOINT} is unreadable ({type(e).__name__})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not {"trainer", "records"} <= set(data):
        raise DataError(f"cannot resume {str(out_dir)!r}: {CHECKPOINT} is not an objreg checkpoint of format {FORMAT}")
    return data["trainer"], data["records"]


def remove_checkpoint(out_dir: Path) -> None:
    """Drop the checkpoint of a finished run (its report holds everything)."""
    (Path(out_dir) / CHECKPOINT).unlink(missing_ok=True)
