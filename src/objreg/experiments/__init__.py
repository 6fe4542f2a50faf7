"""Runnable experiments that check the quantitative claims of the objective literature.

Each experiment is one module here (see :mod:`objreg.experiments.base` for the contract) listed
in :data:`EXPERIMENTS`, run with :func:`run` or ``objreg experiment run NAME``.
"""

from __future__ import annotations

import importlib
import tempfile
from pathlib import Path
from types import ModuleType

from objreg import InvalidParameterError, UnknownNameError
from objreg.experiments.base import ExperimentResult, Setting

#: Experiment name → module, in the order they are listed.
EXPERIMENTS: dict[str, str] = {
    "nsp-vs-sop": "objreg.experiments.nsp_vs_sop",
    "span-length-qa": "objreg.experiments.span_length_qa",
    "entropy-masking": "objreg.experiments.entropy_masking",
    "inverse-frequency": "objreg.experiments.inverse_frequency",
    "label-smoothing-bias": "objreg.experiments.label_smoothing_bias",
    "fim-attention": "objreg.experiments.fim_attention",
    "weight-tying": "objreg.experiments.weight_tying",
    "taylor-transfer": "objreg.experiments.taylor_transfer",
    "rtd-efficiency": "objreg.experiments.rtd_efficiency",
    "char-noise-robustness": "objreg.experiments.char_noise_robustness",
    "consistency-collapse": "objreg.experiments.consistency_collapse",
    "hard-negatives": "objreg.experiments.hard_negatives",
}


def names() -> list[str]:
    """Every experiment's name, in listing order."""
    return list(EXPERIMENTS)


def module(name: str) -> ModuleType:
    """The experiment module called ``name``."""
    if name not in EXPERIMENTS:
        raise UnknownNameError("experiment", name, EXPERIMENTS)
    return importlib.import_module(EXPERIMENTS[name])


def claims() -> dict[str, str]:
    """Every experiment's name → the claim it tests."""
    return {name: module(name).CLAIM for name in EXPERIMENTS}


def check_writable_directory(out_dir: Path) -> None:
    """Create ``out_dir`` and write a scratch file in it, so an unwritable ``--out`` fails before
    minutes of work rather than after.

    Raises:
        InvalidParameterError: it cannot be created or written.
    """
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out_dir):
            pass
    except OSError as e:
        raise InvalidParameterError(f"--out {str(out_dir)!r} cannot be written: {e.strerror or e}") from None


def run(name: str, *, quick: bool = False, seed: int = 0, out_dir: str | Path | None = None,
        device: str = "auto", status=None) -> ExperimentResult:
    """Run the experiment ``name``; with ``out_dir``, also write ``result.json`` and its plots there.

    Raises:
        UnknownNameError: No experiment has that name.
        InvalidParameterError: ``out_dir`` exists and is not a directory.
    """
    experiment = module(name)
    if out_dir is not None:
        if not str(out_dir).strip():  # before Path(), which reads "" as "."
            raise InvalidParameterError("--out is empty: give a directory path (use . for this directory)")
        out_dir = Path(out_dir)
        if out_dir.exists() and not out_dir.is_dir():
            raise InvalidParameterError(f"--out {str(out_dir)!r} exists and is not a directory")
        check_writable_directory(out_dir)  # before the experiment runs, not after
    setting = Setting(quick=quick, seed=seed, out_dir=out_dir, device=device,
                      status=status or (lambda _message: None))
    result = experiment.run(setting)
    if out_dir is not None:
        result.write(out_dir)
    return result


__all__ = ["EXPERIMENTS", "ExperimentResult", "Setting", "claims", "module", "names", "run"]
