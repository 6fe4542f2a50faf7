"""Every input of a run checked before any work: types (the library API too), ranges, sizes that
cannot fit, and paths that are not regular files. A bad value fails in milliseconds with one line
that names it.

:func:`check_call` checks the arguments of :func:`objreg.analyze`; :func:`check_settings` the
fields of an :class:`~objreg.analysis.run.config.AnalysisConfig` (called first thing in its
``__post_init__``). docs/reliability.md lists the limits and why each is what it is.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from objreg.core.errors import InvalidParameterError

#: Longest run: every step's weights are listed in the report, and a run longer than this would
#: not finish anyway (each probe step costs seconds).
MAX_STEPS = 1_000_000
#: Seeds are 32-bit, as numpy's are: larger ones would alias in the seeded bootstrap streams.
MAX_SEED = 2**32 - 1
#: Top eigenvalues a spectrum may ask for: Lanczos keeps 2k+1 vectors of every shared parameter.
MAX_SPECTRUM = 64
MAX_SEQ_LEN = 65_536
#: Tokens of one objective's batch (``batch_size × seq_len``): beyond this the activations of a
#: single step cannot fit in memory on any machine objreg targets.
MAX_BATCH_TOKENS = 2**22
#: Tokens of the downstream sets (``(eval_size + head_fit_size) × seq_len``), held as tensors.
MAX_DOWNSTREAM_TOKENS = 2**26
MAX_EXAMPLES = 1_000_000
MAX_HEAD_WARMUP_STEPS = 1_000_000
MAX_ATTRIBUTION_TOP = 10_000

_INTEGERS: dict[str, tuple[int, int]] = {
    "steps": (1, MAX_STEPS),
    "batch_size": (1, MAX_BATCH_TOKENS),
    "probe_every": (1, MAX_STEPS),
    "eval_size": (1, MAX_EXAMPLES),
    "head_fit_size": (1, MAX_EXAMPLES),
    "seq_len": (8, MAX_SEQ_LEN),
    "seed": (0, MAX_SEED),
    "head_warmup_steps": (0, MAX_HEAD_WARMUP_STEPS),
    "spectrum": (0, MAX_SPECTRUM),
    "attribution_top": (0, MAX_ATTRIBUTION_TOP),
}
_NAMES = ("downstream", "optimizer", "device", "dtype", "per_sample_method", "hvp_method")
_PATHS = ("corpus", "model", "downstream_data")


def _type(value: Any) -> str:
    return "None" if value is None else type(value).__name__


def check_integer(name: str, value: Any, low: int, high: int | None = None) -> None:
    """``value`` must be an ``int`` (not a bool) in ``[low, high]``."""
    wanted = "a positive integer" if low == 1 else f"an integer ≥ {low}"
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidParameterError(f"{name} must be {wanted}, got {_type(value)} {value!r}")
    if value < low:
        if name == "seq_len":
            raise InvalidParameterError(f"seq_len must be at least {low} tokens, got {value!r}")
        raise InvalidParameterError(f"{name} must be {wanted}, got {value!r}")
    if high is not None and value > high:
        raise InvalidParameterError(f"{name} must be at most {high:,}, got {value:,}")


def check_schedules(steps: int, weights: Mapping[str, float], schedules: Mapping[str, Any]) -> None:
    """A user's schedule (a callable) is evaluated at every step, so a bad one fails before
    anything is loaded; the built-in shapes need no evaluation (their numbers were checked when
    parsed, and they interpolate between them), so a long run does not wait for them."""
    from objreg.analysis.run.schedules import Adaptive, Constant, Cosine, Linear, Step, weights_at

    custom = {name: s for name, s in schedules.items() if type(s) not in (Adaptive, Constant, Linear, Cosine, Step)}
    if not custom:
        return
    only = {name: weights[name] for name in custom}
    for step in range(steps):
        weights_at(step, steps, only, custom)


def check_settings(config: Any) -> None:
    """Types and ranges of every field of an ``AnalysisConfig`` (before any value is used).
    Path fields given as ``os.PathLike`` become ``str``.

    Raises:
        InvalidParameterError: the first bad field, named.
    """
    pretrain = config.pretrain
    if isinstance(pretrain, str) or not isinstance(pretrain, Sequence):
        raise InvalidParameterError(
            f"pretrain must be a list of objective names, got {_type(pretrain)} {_short(pretrain)}"
        )
    for name in pretrain:
        if not isinstance(name, str) or not name.strip():
            raise InvalidParameterError(f"pretrain must hold objective names (non-empty str), got {name!r}")
    for name, (low, high) in _INTEGERS.items():
        check_integer(name, getattr(config, name), low, high)
    tokens = config.batch_size * config.seq_len
    if tokens > MAX_BATCH_TOKENS:
        raise InvalidParameterError(
            f"--batch-size {config.batch_size} × --seq-len {config.seq_len} = {tokens:,} tokens per objective per step "
            f"cannot fit in memory (at most {MAX_BATCH_TOKENS:,}); lower --batch-size or --seq-len"
        )
    downstream_tokens = (config.eval_size + config.head_fit_size) * config.seq_len
    if downstream_tokens > MAX_DOWNSTREAM_TOKENS:
        raise InvalidParameterError(
            f"(--eval-size {config.eval_size} + --head-fit-size {config.head_fit_size}) × --seq-len {config.seq_len} = "
            f"{downstream_tokens:,} downstream tokens cannot fit in memory (at most {MAX_DOWNSTREAM_TOKENS:,}); "
            f"lower one of them"
        )
    for name in _NAMES:
        value = getattr(config, name)
        if not isinstance(value, str) or not value.strip():
            raise InvalidParameterError(f"{name} must be a non-empty string, got {_type(value)} {value!r}")
    for name in _PATHS:
        value = getattr(config, name)
        if value is None and name == "downstream_data":
            continue
        if isinstance(value, os.PathLike):
            value = os.fspath(value)
            object.__setattr__(config, name, value)
        if not isinstance(value, str):
            raise InvalidParameterError(f"{name} must be a name or a path (str), got {_type(value)} {value!r}")
        option = f"--{name.replace('_', '-')}"
        if not value.strip():
            raise InvalidParameterError(f"{option} is empty: give a name or a path")
        if "\0" in value:
            raise InvalidParameterError(f"{option} {value!r} holds a NUL character")
        check_not_special_file(value, option)
        if name == "downstream_data" and _looks_like_path(value) and not os.path.lexists(os.path.expanduser(value)):
            raise InvalidParameterError(f"{option} {value!r} does not exist; give the task's data file")
    lr = config.lr
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not math.isfinite(lr) or lr <= 0:
        raise InvalidParameterError(f"lr must be a positive finite number, got {lr!r}")
    weights = config.weights
    if weights is not None and not isinstance(weights, (str, Mapping)):
        raise InvalidParameterError(f"weights must be a mapping or a string like 'mlm=1,sop=0.5', got {_type(weights)}")
    params = config.objective_params
    if not isinstance(params, Mapping):
        raise InvalidParameterError(f"objective_params must be a mapping of name → parameters, got {_type(params)}")
    for owner, values in params.items():
        if not isinstance(owner, str) or not isinstance(values, Mapping):
            raise InvalidParameterError(
                f"objective_params must map names to parameter mappings, got {owner!r}: {_type(values)}"
            )
        for key in values:
            if not isinstance(key, str):
                raise InvalidParameterError(f"objective_params[{owner!r}] has a parameter name that is not a str: {key!r}")


def _looks_like_path(value: str) -> bool:
    return os.sep in value or (os.altsep or os.sep) in value or Path(value).suffix.lower() in (
        ".json", ".jsonl", ".txt", ".csv", ".tsv")


def check_not_special_file(value: str, option: str) -> None:
    """A path that exists must be a regular file or a directory: a FIFO would block, a pipe
    (``<(cat file)``) can be read only once, and a device never ends. Checked with ``stat``,
    which never blocks."""
    path = os.path.expanduser(value)
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return  # absent (a name, or a missing file the loader reports) or not accessible
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return
    kind = ("a pipe or FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file")
    example = ", e.g. cat ... > corpus.txt" if option == "--corpus" else ""
    raise InvalidParameterError(
        f"{option} {value!r} is {kind}, not a regular file: objreg reads its inputs more than once (and again on "
        f"--resume); save it to a regular file first{example}"
    )


def check_call(
    *, pretrain: Any, downstream: Any, registry: Any, out_dir: Any, resume: Any, on_step: Any, on_status: Any,
    cache: Any, writer: Any, settings: Mapping[str, Any], fields: Sequence[str], checkpoint_every: Any = 1,
) -> None:
    """The arguments of :func:`objreg.analyze`, before anything is built.

    Raises:
        InvalidParameterError: the first bad argument, named.
    """
    from objreg.core.registry import Registry

    if pretrain is not None and not isinstance(pretrain, str):
        if not isinstance(pretrain, Sequence) or not all(isinstance(p, str) for p in pretrain):
            raise InvalidParameterError(
                f"pretrain must be objective names: a list of str or a string like 'mlm,sop', got {_type(pretrain)} "
                f"{_short(pretrain)}"
            )
    if downstream is not None and not isinstance(downstream, str):
        raise InvalidParameterError(f"downstream must be a task name (str), got {_type(downstream)} {downstream!r}")
    if registry is not None and not isinstance(registry, Registry):
        raise InvalidParameterError(f"registry must be an objreg.Registry, got {_type(registry)}")
    for name, value in (("out_dir", out_dir), ("resume", resume), ("cache", cache)):
        check_directory_argument(name, value)
    if isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, int) or checkpoint_every < 1:
        raise InvalidParameterError(f"checkpoint_every must be a positive integer (steps between two checkpoints), "
                                    f"got {_type(checkpoint_every)} {checkpoint_every!r}")
    for name, value in (("on_step", on_step), ("on_status", on_status)):
        if value is not None and not callable(value):
            raise InvalidParameterError(f"{name} must be callable, got {_type(value)}")
    if not callable(writer):
        raise InvalidParameterError(f"writer must be callable (a factory of RunWriter), got {_type(writer)}")
    unknown = [name for name in settings if name not in fields or name == "pretrain" or name == "downstream"]
    if unknown:
        name = unknown[0]
        close = difflib.get_close_matches(name, fields, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise InvalidParameterError(f"analyze() got an unknown setting {name!r}{hint} (settings: see AnalysisConfig)")


def check_directory_argument(name: str, value: Any) -> None:
    """``None``, or a non-empty ``str`` / ``os.PathLike`` path."""
    if value is None:
        return
    if not isinstance(value, (str, os.PathLike)):
        raise InvalidParameterError(f"{name} must be a directory path (str or Path), got {_type(value)} {value!r}")
    text = os.fspath(value)
    if isinstance(text, bytes):
        raise InvalidParameterError(f"{name} must be a str path, not bytes")
    option = {"out_dir": "--out", "resume": "--resume"}.get(name, name)
    if not text.strip():
        raise InvalidParameterError(f"{option} is empty: give a directory path (use . for this directory)")
    if "\0" in text:
        raise InvalidParameterError(f"{option} {text!r} holds a NUL character")
    if Path(text).exists() and not Path(text).is_dir():
        raise InvalidParameterError(f"{option} {text!r} exists and is not a directory")


def fields_of(cls: Any) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:39] + "…"


def check_providers(config: Any, registry: Any) -> None:
    """The corpus and the model must have a provider (a name nothing answers to fails here, in
    milliseconds, not after the corpus and the tokenizer are loaded).

    Raises:
        UnknownNameError: no provider takes the name (the message lists those that exist).
    """
    registry.provider("corpus", config.corpus)
    registry.provider("model", config.model)
