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
from objreg.experiments.ownership import claim_output
from objreg.experiments.replication import check_seeds, run_seeds

#: Experiment name → module, in the order they are listed.
EXPERIMENTS: dict[str, str] = {
    "nsp-vs-sop": "objreg.experiments.nsp_vs_sop",
    "span-length-qa": "objreg.experiments.span_length_qa",
    "entropy-masking": "objreg.experiments.entropy_masking",
    "inverse-frequency": "objreg.experiments.inverse_frequency",
    "label-smoothing-bias": "objreg.experiments.label_smoothing_bias",
    "fim-attention": "objreg.experiments.fim_attention",
    "weight-tying": "objreg.experiments.weight_tying",
    "rtd-efficiency": "objreg.experiments.rtd_efficiency",
    "char-noise-robustness": "objreg.experiments.char_noise_robustness",
    "consistency-collapse": "objreg.experiments.consistency_collapse",
    "hard-negatives": "objreg.experiments.hard_negatives",
    "adaptive-mixture": "objreg.experiments.adaptive_mixture",
    "screen-validity": "objreg.experiments.screen_validity",
    "tapt": "objreg.experiments.tapt",
    # Software checks (KIND = "software check") after the claims of the literature.
    "taylor-transfer": "objreg.experiments.taylor_transfer",
}


def names() -> list[str]:
    """Every experiment's name, in listing order."""
    return list(EXPERIMENTS)


def module(name: str) -> ModuleType:
    """The experiment module called ``name``."""
    if name not in EXPERIMENTS:
        raise UnknownNameError("experiment", name, EXPERIMENTS)
    return importlib.import_module(EXPERIMENTS[name])


def describe() -> list[dict[str, str]]:
    """Every experiment's name, claim, source, verdict rule and kind (``claim``: a claim of the
    literature; ``software check``: the library computing what it should, not evidence about the
    literature), in listing order."""
    return [{"name": name, "claim": m.CLAIM, "source": m.SOURCE, "rule": m.RULE, "kind": getattr(m, "KIND", "claim")}
            for name, m in ((name, module(name)) for name in EXPERIMENTS)]


def default_seeds(quick: bool) -> int:
    """Seeds run when none are asked for: 1 in the quick setting, 3 in the full one."""
    return 1 if quick else 3


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


def _out_path(out_dir: str | Path) -> Path:
    """``out_dir`` checked and created before any experiment runs."""
    if not str(out_dir).strip():  # before Path(), which reads "" as "."
        raise InvalidParameterError("--out is empty: give a directory path (use . for this directory)")
    path = Path(out_dir)
    if path.exists() and not path.is_dir():
        raise InvalidParameterError(f"--out {str(out_dir)!r} exists and is not a directory")
    check_writable_directory(path)  # before the experiment runs, not after
    return path


def run(name: str, *, seeds: int | None = None, seed: int = 0, quick: bool = False,
        out_dir: str | Path | None = None, device: str = "auto", status=None) -> ExperimentResult:
    """Run the experiment ``name`` for ``seeds`` seeds (``seed``, ``seed``+1, …; default
    :func:`default_seeds`) and combine them into the overall result, whose ``replicates`` hold
    each seed's result. With ``out_dir``, write ``result.json``, the per-seed plot and each
    seed's plots (in ``seed-S/``) there.

    Raises:
        UnknownNameError: No experiment has that name.
        InvalidParameterError: ``seeds`` or ``seed`` is out of range, or ``out_dir`` is not a
            writable directory, holds an earlier result or someone else's files, or another
            experiment is running in it (:mod:`objreg.experiments.ownership`; checked before
            anything runs).
    """
    experiment = module(name)
    seeds = default_seeds(quick) if seeds is None else seeds
    check_seeds(seeds, seed)
    if out_dir is None:
        return run_seeds(experiment, seeds=seeds, seed=seed, quick=quick, out_dir=None, device=device,
                         status=status or (lambda _message: None))
    path = _out_path(out_dir)
    with claim_output(path):
        return run_seeds(experiment, seeds=seeds, seed=seed, quick=quick, out_dir=path, device=device,
                         status=status or (lambda _message: None))


def run_all(out_dir: str | Path, *, seeds: int | None = None, seed: int = 0, quick: bool = False,
            device: str = "auto", status=None) -> dict[str, ExperimentResult]:
    """Run every experiment, writing each one's result and plots to ``out_dir/NAME``."""
    seeds = default_seeds(quick) if seeds is None else seeds
    check_seeds(seeds, seed)
    root = _out_path(out_dir)
    for name in EXPERIMENTS:  # every directory checked before the first experiment runs
        claim_output(root / name, option="--out").release()
    status = status or (lambda _message: None)
    results = {}
    for name in EXPERIMENTS:
        tell = (lambda message, name=name: status(f"{name}: {message}"))
        results[name] = run(name, seeds=seeds, seed=seed, quick=quick, out_dir=root / name, device=device,
                            status=tell)
    return results


__all__ = ["EXPERIMENTS", "ExperimentResult", "Setting", "default_seeds", "describe", "module", "names",
           "run", "run_all"]
