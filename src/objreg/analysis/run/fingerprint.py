"""What a run's numbers depend on, recorded before its first step and checked on resume.

``run.json`` (the fingerprint) holds the resolved settings (paths absolute), the ``config.json``
the run wrote, content hashes of the corpus, the downstream data, the model directory and the
tokenizer, the objreg and torch versions, and every plugin with the distribution (and version)
it came from and a hash of its module's source (a plugin edited in place keeps its version).
``tokenizer.json`` is the tokenizer the run used (the ``tokenizers`` JSON; its special-token
layout is in ``run.json``): a resumed run reads it from there, never from a cache or by training
again.

A resumed run is checked in stages, each as early as its inputs allow: the settings in
``config.json`` (:func:`check_config_unchanged`), then versions, plugins and the tokenizer file,
before anything is loaded (:func:`check_resumable`); the checkpoint's checksum as it is read
(:mod:`objreg.analysis.run.resume`); the corpus, the downstream data and the model as each is
loaded (:mod:`objreg.analysis.run.run_inputs`); and last the run's ``config`` section as rebuilt
(vocabulary size, data sizes, device, parameter counts), which must equal the one it started
with (:func:`check_same_config`). The hashes: :mod:`objreg.analysis.run.digests`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from objreg.analysis.run.digests import source_digest, text_digest
from objreg.core.errors import DataError
from objreg.core.registry import Registry
from objreg.toolkit.atomic import atomic_file

if TYPE_CHECKING:
    from objreg.analysis.run.run_inputs import RunInputs

FINGERPRINT = "run.json"
TOKENIZER = "tokenizer.json"
FORMAT = 1


# -- paths ------------------------------------------------------------------------------------------


def absolute_paths(config: Any, registry: Registry) -> Any:
    """``config`` (an :class:`AnalysisConfig`) with the corpus, model and downstream-data paths made
    absolute, so the run reads the same files when it is resumed from another directory. Names a
    provider registers exactly (``default``) stay names, even where a file of that name exists."""
    changes: dict[str, str] = {}
    for field, kind in (("corpus", "corpus"), ("model", "model"), ("downstream_data", None)):
        value = getattr(config, field)
        if not isinstance(value, str) or not value:
            continue
        if kind is not None and _exact_name(registry, kind, value):
            continue
        path = os.path.expanduser(value)
        if os.path.lexists(path):
            absolute = os.path.abspath(path)
            if absolute != value:
                changes[field] = absolute
    return dataclasses.replace(config, **changes) if changes else config


def _exact_name(registry: Registry, kind: str, name: str) -> bool:
    return any(p.name == name and p.accepts is None and not p.fallback for p in registry.providers(kind))


# -- the fingerprint ----------------------------------------------------------------------------------


def environment(registry: Registry) -> dict[str, Any]:
    """The software a run's numbers depend on: objreg, torch, and every plugin with its origin
    (the distribution and version it came from, or ``objreg (built-in)``)."""
    pm = registry.pm
    names = sorted({*pm.origins, *registry.objectives(), *registry.tasks()})
    return {
        "objreg": objreg_version(),
        "torch": torch.__version__,
        "python": ".".join(map(str, sys.version_info[:3])),
        "plugins": {name: registry.origin(name) for name in names},
    }


def plugin_code(registry: Registry) -> dict[str, str]:
    """Every plugin's name → SHA-256 of its module's source file (``unknown`` where it has none)."""
    pm = registry.pm
    names = sorted({*pm.origins, *registry.objectives(), *registry.tasks()})
    return {name: source_digest(pm.get_plugin(name)) for name in names}


def objreg_version() -> str:
    """objreg's version as the facade reports it (``0+unknown`` in an uninstalled checkout)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("objreg")
    except PackageNotFoundError:
        return "0+unknown"


def write_fingerprint(run_dir: Path, config: Any, report_config: Mapping[str, Any], inputs: RunInputs,
                      registry: Registry) -> None:
    """Write ``run.json`` (atomically) for a fresh run about to take its first step."""
    record = {
        "format": FORMAT,
        **environment(registry),
        "plugin_code": plugin_code(registry),
        "settings": _plain(config.to_dict()),
        "config": _plain(dict(report_config)),
        "inputs": inputs.found,
    }
    with atomic_file(Path(run_dir) / FINGERPRINT, "w") as f:
        f.write(json.dumps(record, indent=2, sort_keys=True, allow_nan=False))


def read_fingerprint(run_dir: Path) -> dict[str, Any]:
    """The run's ``run.json``.

    Raises:
        DataError: absent (a run of an objreg that kept none, or one stopped before its first
            step), unreadable or not a fingerprint of this format.
    """
    path = Path(run_dir) / FINGERPRINT
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(f"cannot resume {str(run_dir)!r}: it has no {FINGERPRINT} recording the run's inputs "
                        f"(written by an older objreg?); start a new run") from None
    except (OSError, ValueError, RecursionError) as e:
        raise DataError(f"cannot resume {str(run_dir)!r}: {FINGERPRINT} is unreadable ({_reason(e)})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("inputs"), dict) \
            or not isinstance(data.get("config"), dict) or not isinstance(data.get("plugins"), dict):
        raise DataError(f"cannot resume {str(run_dir)!r}: {FINGERPRINT} is not an objreg run fingerprint of format {FORMAT}")
    return data


def _reason(error: BaseException) -> str:
    if isinstance(error, RecursionError):
        return "nested too deeply"
    if isinstance(error, OSError):
        return error.strerror or type(error).__name__
    return str(error).splitlines()[0] if str(error) else type(error).__name__


def check_config_unchanged(run_dir: Path, saved: Mapping[str, Any]) -> None:
    """``config.json`` (``saved``) must be the one the run wrote (kept in ``run.json``).

    Raises:
        DataError: no fingerprint, or config.json was edited (the first differences named).
    """
    recorded = read_fingerprint(run_dir)["config"]
    differences = _differences(recorded, saved)
    if differences:
        raise DataError(
            f"cannot resume {str(run_dir)!r}: config.json was edited after the run started ({'; '.join(differences)}); "
            f"a run resumes with the settings it started with: restore config.json, or start a new run"
        )


def check_resumable(run_dir: Path, registry: Registry) -> None:
    """Before anything is loaded: the software (objreg, torch, plugins) and the kept tokenizer
    file must be those the run started with.

    Raises:
        DataError: the first difference, named.
    """
    fingerprint = read_fingerprint(run_dir)
    now = environment(registry)
    shown = str(run_dir)
    for package in ("objreg", "torch"):
        if fingerprint.get(package) != now[package]:
            raise DataError(
                f"cannot resume {shown!r}: it was started with {package} {fingerprint.get(package)} and this is "
                f"{package} {now[package]}; the numbers would differ: resume with {package} "
                f"{fingerprint.get(package)}, or start a new run"
            )
    before, after = fingerprint["plugins"], now["plugins"]
    for name in sorted({*before, *after}):
        if before.get(name) == after.get(name):
            continue
        if name not in after:
            change = f"plugin {name!r} ({before[name]}) is no longer installed"
        elif name not in before:
            change = (f"plugin {name!r} ({after[name]}) was not installed when the run started "
                      f"(OBJREG_LOAD_PLUGINS selects the installed plugins to load)")
        else:
            change = f"plugin {name!r} was {before[name]} when the run started and is {after[name]} now"
        raise DataError(f"cannot resume {shown!r}: {change}; resume with the plugins it started with, or start a new run")
    _check_plugin_code(fingerprint, registry, shown)
    inputs = fingerprint["inputs"]
    if inputs.get("tokenizer_layout") is not None:
        path = Path(run_dir) / TOKENIZER
        try:
            digest = text_digest(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as e:
            raise DataError(f"cannot resume {shown!r}: its {TOKENIZER} cannot be read ({_reason(e)})") from None
        if digest != inputs.get("tokenizer"):
            raise DataError(f"cannot resume {shown!r}: {TOKENIZER} was changed after the run started "
                            f"(its content hash differs); restore it, or start a new run")


def _check_plugin_code(fingerprint: Mapping[str, Any], registry: Registry, shown: str) -> None:
    """Each plugin's source must be the one the run started with, even under the same version
    (run.json files written before the hashes were kept are not checked)."""
    before = fingerprint.get("plugin_code")
    if not isinstance(before, dict):
        return
    now = plugin_code(registry)
    for name in sorted(before):
        if name in now and "unknown" not in (before[name], now[name]) and before[name] != now[name]:
            raise DataError(
                f"cannot resume {shown!r}: the code of plugin {name!r} ({registry.origin(name)}) changed since the run "
                f"started, under the same version; the numbers would differ: resume with the code it started with, "
                f"or start a new run")


def check_same_config(run_dir: Path, rebuilt: Mapping[str, Any]) -> None:
    """The ``config`` section rebuilt on resume must equal the one the run started with: the
    report then describes the run that happened (vocabulary, data sizes, device, counts).

    Raises:
        DataError: the first differences, named.
    """
    recorded = read_fingerprint(run_dir)["config"]
    differences = _differences(recorded, _plain(dict(rebuilt)))
    if differences:
        raise DataError(
            f"cannot resume {str(run_dir)!r}: this machine rebuilds a different run ({'; '.join(differences)}, "
            f"as started → now); resume where the run started, or start a new run"
        )


def _plain(value: Any) -> Any:
    """``value`` as JSON would give it back (tuples as lists, keys as strings)."""
    return json.loads(json.dumps(value, allow_nan=False, default=str))


def _differences(before: Any, after: Any, prefix: str = "", limit: int = 3) -> list[str]:
    """Up to ``limit`` differing fields, ``name: old → new`` (or added / removed)."""
    found: list[str] = []

    def walk(a: Any, b: Any, key: str) -> None:
        if len(found) >= limit or a == b:
            return
        if isinstance(a, dict) and isinstance(b, dict):
            for k in sorted({*a, *b}, key=str):
                name = f"{key}.{k}" if key else str(k)
                if k not in b:
                    found.append(f"{name} removed")
                elif k not in a:
                    found.append(f"{name} added")
                else:
                    walk(a[k], b[k], name)
                if len(found) >= limit:
                    return
            return
        found.append(f"{key or 'the whole file'}: {_short(a)} → {_short(b)}")

    walk(before, after, prefix)
    return found


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 40 else text[:39] + "…"
