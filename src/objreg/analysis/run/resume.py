"""Continuing an interrupted run: its settings and its checkpoint.

``checkpoint.pt`` in the run directory holds the trainer's state (:meth:`Trainer.state_dict`:
model, optimizer, data and corruption generators, the global CPU generator dropout draws from,
the step to run next, and the probe's own ``state_dict``, which holds the records so far). It is rewritten after
every finished step through a synced temporary file and an atomic rename, so it is either the
previous step's or this one's, never half written: a killed run loses at most the step in flight.
It carries its own SHA-256 (:mod:`objreg.analysis.run.checksum`), verified before anything in it is
parsed, so a damaged checkpoint is refused rather than resumed with wrong numbers. It is hashed
while it streams to disk and verified block by block, never held in memory as bytes (it is many
times the model under Adam). ``objreg analyze --checkpoint-every N`` writes it after every
``N``-th step (and the last) instead: a killed run then loses up to ``N`` steps.
A resumed run takes every setting from the run's ``config.json``, which must be the one the run
wrote (:mod:`objreg.analysis.run.fingerprint` keeps a copy in ``run.json``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from objreg.analysis.records import StepRecord
from objreg.analysis.run.checksum import ChecksumError, read_sealed_stream, write_sealed_stream
from objreg.analysis.run.config import AnalysisConfig
from objreg.analysis.run.fingerprint import check_config_unchanged
from objreg.analysis.run.loop import Trainer
from objreg.core.errors import DataError, InvalidParameterError

CHECKPOINT = "checkpoint.pt"
#: 4: sealed with a checksum; the probe's records and moments in the probe's own state_dict
#: (older formats are not resumed).
FORMAT = 4


def refuse_settings_beside_resume(given: Sequence[str], resume: str = "resume") -> None:
    """The one error for run settings passed beside a resume (they would change the run).
    ``given`` names them as the caller was given them, and ``resume`` the resume itself: keyword
    arguments for :func:`objreg.analyze`, ``--flags`` and ``--resume`` for the command line.

    Raises:
        InvalidParameterError: ``given`` is not empty.
    """
    if given:
        raise InvalidParameterError(f"{resume} takes every setting from the run's config.json; drop {', '.join(given)}")


def resumed_config(run_dir: Path, given: list[str]) -> AnalysisConfig:
    """The settings of the interrupted run in ``run_dir``. ``given``: the names of other run
    settings the caller passed with it (refused: they would change the run).

    Raises:
        InvalidParameterError: ``given`` is not empty, or the run already finished.
        DataError: no readable objreg run config in ``run_dir``.
    """
    refuse_settings_beside_resume(given)
    if (run_dir / "report.json").is_file():
        raise InvalidParameterError(f"the run in {str(run_dir)!r} already finished (it has report.json): nothing to resume")
    try:
        saved = json.loads((run_dir / "config.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(f"cannot resume {str(run_dir)!r}: it has no config.json (not a run directory of --out)") from None
    except (OSError, ValueError, RecursionError) as e:
        reason = "nested too deeply" if isinstance(e, RecursionError) else str(e).splitlines()[0]
        raise DataError(f"cannot resume {str(run_dir)!r}: config.json is unreadable ({reason})") from None
    fields = {f.name for f in dataclasses.fields(AnalysisConfig)}
    if not isinstance(saved, dict) or "pretrain" not in saved:
        raise DataError(f"cannot resume {str(run_dir)!r}: config.json is not an objreg run config")
    _require_checkpoint(run_dir)
    check_config_unchanged(run_dir, saved)
    if saved.get("downstream_head", "refit") == "refit":
        # Runs before the warm-up became a frozen head's alone recorded an unused count.
        saved.pop("head_warmup_steps", None)
    return AnalysisConfig(**{k: v for k, v in saved.items() if k in fields})


def restore(trainer: Trainer, state: dict[str, Any], run_dir: Path) -> None:
    """Load a checkpoint's trainer state into ``trainer`` (built from the run's config).

    Raises:
        DataError: the state does not fit the trainer.
    """
    try:
        trainer.load_state_dict(state)
    except (KeyError, RuntimeError, ValueError, TypeError) as e:
        raise DataError(f"cannot resume {str(run_dir)!r}: its checkpoint does not fit the run in its "
                        f"config.json ({type(e).__name__})") from None


def save_checkpoint(out_dir: Path, trainer_state: dict[str, Any]) -> int:
    """Write ``checkpoint.pt`` in ``out_dir`` atomically, sealed with its checksum, hashed while it
    streams to disk; returns its payload's size in bytes."""
    state = {"format": FORMAT, "trainer": trainer_state}
    return write_sealed_stream(Path(out_dir) / CHECKPOINT, lambda f: torch.save(state, f))


def _require_checkpoint(out_dir: Path) -> None:
    if not (Path(out_dir) / CHECKPOINT).is_file():
        raise DataError(f"cannot resume {str(out_dir)!r}: no {CHECKPOINT} (the run stopped before finishing a step); "
                        f"start it again")


def load_checkpoint(out_dir: Path) -> tuple[dict[str, Any], list[StepRecord]]:
    """The trainer state and the probe records of ``out_dir``'s checkpoint.

    Raises:
        DataError: the checkpoint is missing, unreadable or not one this version wrote.
    """
    path = Path(out_dir) / CHECKPOINT
    _require_checkpoint(out_dir)
    def load(f: Any) -> Any:
        try:
            return torch.load(f, map_location="cpu", weights_only=True)
        except Exception as e:  # torch raises many types for a foreign payload
            raise DataError(f"cannot resume {str(out_dir)!r}: {CHECKPOINT} is unreadable ({type(e).__name__})") from None

    try:
        data = read_sealed_stream(path, load, CHECKPOINT)
    except ChecksumError as e:
        raise ChecksumError(f"cannot resume {str(out_dir)!r}: {e}; the run cannot continue from it") from None
    except OSError as e:
        raise DataError(f"cannot resume {str(out_dir)!r}: {CHECKPOINT} is unreadable ({e.strerror})") from None
    trainer = data.get("trainer") if isinstance(data, dict) else None
    probe = trainer.get("probe") if isinstance(trainer, dict) else None
    records = probe.get("records") if isinstance(probe, dict) else None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(records, list):
        raise DataError(f"cannot resume {str(out_dir)!r}: {CHECKPOINT} is not an objreg checkpoint of format {FORMAT}")
    return data["trainer"], records


def remove_checkpoint(out_dir: Path) -> None:
    """Drop the checkpoint of a finished run (its report holds everything)."""
    (Path(out_dir) / CHECKPOINT).unlink(missing_ok=True)
