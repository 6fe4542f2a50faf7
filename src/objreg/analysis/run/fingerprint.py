"""What a run's numbers depend on, recorded before its first step and checked on resume.

``run.json`` (the fingerprint) holds the resolved settings (paths absolute), the ``config.json``
the run wrote, content hashes of the corpus, the downstream data, the model directory and the
tokenizer, the objreg and torch versions, and every plugin with the distribution (and version)
it came from and a hash of its module's source (a plugin edited in place keeps its version). ``tokenizer.json`` is the tokenizer the run used (the ``tokenizers`` JSON; its
special-token layout is in ``run.json``): a resumed run reads it from there, never from a cache
or by training again.

A resumed run is checked in stages, each as early as its inputs allow: the settings in
``config.json`` (:func:`check_config_unchanged`), then versions, plugins and the tokenizer file,
before anything is loaded (:func:`check_resumable`); the checkpoint's checksum as it is read
(:mod:`objreg.analysis.run.resume`); the corpus, the downstream data and the model as each is loaded
(:class:`RunInputs`); and last the run's ``config`` section as rebuilt (vocabulary size, data
sizes, device, parameter counts), which must equal the one it started with
(:func:`check_same_config`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import types
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from objreg.core.errors import DataError
from objreg.core.registry import Registry
from objreg.toolkit.atomic import atomic_file
from objreg.toolkit.tokenizer import Tokenizer

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
    return {name: _source_digest(pm.get_plugin(name)) for name in names}


def _source_digest(plugin: Any) -> str:
    module = plugin if isinstance(plugin, types.ModuleType) else sys.modules.get(type(plugin).__module__)
    path = getattr(module, "__file__", None)
    try:
        return file_digest(Path(path)) if path else "unknown"
    except OSError:
        return "unknown"


def objreg_version() -> str:
    """objreg's version as the facade reports it (``0+unknown`` in an uninstalled checkout)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("objreg")
    except PackageNotFoundError:
        return "0+unknown"


def documents_digest(documents: Any) -> str:
    """SHA-256 of a corpus's documents (sentence and document boundaries included)."""
    digest = hashlib.sha256(b"objreg-corpus-v1\n")
    for document in documents:
        for sentence in document:
            digest.update(sentence.encode("utf-8", "surrogatepass"))
            digest.update(b"\x1f")
        digest.update(b"\x1e")
    return digest.hexdigest()


def tensors_digest(batch: Any, extra: str = "") -> str:
    """SHA-256 of a batch's tensors (each field's name, dtype, shape and values)."""
    digest = hashlib.sha256(b"objreg-batch-v1\n" + extra.encode())
    fields = batch._asdict() if hasattr(batch, "_asdict") else dict(vars(batch))
    extras = fields.pop("extras", {}) or {}
    for name, value in [*sorted(fields.items()), *sorted((f"extras.{k}", v) for k, v in extras.items())]:
        if isinstance(value, torch.Tensor):
            tensor = value.detach().cpu().contiguous()
            digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}\n".encode())
            digest.update(tensor.numpy().tobytes() if tensor.dtype != torch.bfloat16 else tensor.float().numpy().tobytes())
    return digest.hexdigest()


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def directory_digest(path: Path) -> str:
    """SHA-256 over the names and contents of the regular files directly in ``path``."""
    digest = hashlib.sha256(b"objreg-directory-v1\n")
    for entry in sorted(path.iterdir()):
        if entry.is_file():
            digest.update(entry.name.encode("utf-8", "surrogatepass") + b"\0" + file_digest(entry).encode() + b"\n")
    return digest.hexdigest()


def tokenizer_layout(tokenizer: Any) -> tuple[str, dict[str, Any]] | None:
    """``(tokenizers JSON, special-token layout)`` of an objreg :class:`Tokenizer` (what
    :func:`tokenizer_from` rebuilds it from); None for another kind of tokenizer."""
    backend = getattr(tokenizer, "backend", None)
    if type(tokenizer) is not Tokenizer or not hasattr(backend, "to_str"):
        return None
    vocab = tokenizer.vocab

    def token(i: int) -> str:
        return backend.id_to_token(i)

    layout = {
        "name": tokenizer.name,
        **{k: token(getattr(vocab, f"{k}_id")) for k in ("pad", "unk", "cls", "sep", "mask")},
        "sentinels": [token(i) for i in vocab.sentinel_ids],
        "named": {k: token(i) for k, i in vocab.named_ids.items()},
    }
    return backend.to_str(), layout


def tokenizer_from(text: str, layout: Mapping[str, Any]) -> Tokenizer:
    from tokenizers import Tokenizer as Backend

    return Tokenizer(
        Backend.from_str(text), pad=layout["pad"], unk=layout["unk"], cls=layout["cls"], sep=layout["sep"],
        mask=layout["mask"], sentinels=tuple(layout["sentinels"]), named=dict(layout["named"]), name=layout["name"],
    )


class RunInputs:
    """What a run loads, fingerprinted as it is loaded, through :meth:`registry`.

    Fresh (``expected`` None): records the hashes; with ``keep``, writes the tokenizer into the run
    directory. Resumed: the tokenizer comes from the run directory, and each hash must equal the
    one the run recorded, else :class:`DataError` names what changed.
    """

    def __init__(self, run_dir: Path | None, expected: Mapping[str, Any] | None = None, keep: bool = False):
        self.run_dir = run_dir
        self.expected = expected
        self.keep = keep and run_dir is not None
        self.found: dict[str, Any] = {}

    @classmethod
    def resumed(cls, run_dir: Path) -> RunInputs:
        return cls(run_dir, read_fingerprint(run_dir)["inputs"])

    def registry(self, registry: Registry) -> Registry:
        """``registry`` with its corpus, tokenizer, task data and model loads going through this."""
        return _RecordingRegistry(registry, self)

    def record(self, key: str, value: Any, what: str) -> None:
        self.found[key] = value
        if self.expected is None or key not in self.expected or self.expected[key] == value:
            return
        raise DataError(
            f"cannot resume {str(self.run_dir)!r}: {what} changed since the run started (its content hash differs); "
            f"resume with the original, or start a new run"
        )

    def tokenizer(self, load: Callable[[], Any]) -> Any:
        if self.expected is not None and self.expected.get("tokenizer_layout") is not None:
            assert self.run_dir is not None
            path = self.run_dir / TOKENIZER
            try:
                text = path.read_text(encoding="utf-8")
            except OSError as e:
                raise DataError(f"cannot resume {str(self.run_dir)!r}: cannot read {TOKENIZER}: {e.strerror}") from None
            self.record("tokenizer", _text_digest(text), f"the tokenizer kept in {TOKENIZER}")
            self.found["tokenizer_layout"] = self.expected["tokenizer_layout"]
            try:
                return tokenizer_from(text, self.expected["tokenizer_layout"])
            except Exception as e:  # noqa: BLE001 - tokenizers raises plain Exception for a bad file
                raise DataError(f"cannot resume {str(self.run_dir)!r}: {TOKENIZER} cannot be read ({e})") from None
        tokenizer = load()
        kept = tokenizer_layout(tokenizer)
        if kept is None:
            self.found["tokenizer"] = self.found["tokenizer_layout"] = None
            return tokenizer
        text, layout = kept
        self.record("tokenizer", _text_digest(text), "the tokenizer")
        self.found["tokenizer_layout"] = layout
        if self.keep:
            assert self.run_dir is not None
            with atomic_file(self.run_dir / TOKENIZER, "w") as f:
                f.write(text)
        return tokenizer


def _text_digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class _RecordingRegistry(Registry):
    """A registry that loads through its original and tells a :class:`RunInputs` what it loaded.
    It shares the original's state (a shallow copy), so validation is not repeated."""

    def __init__(self, registry: Registry, inputs: RunInputs):  # noqa: D107 - no Registry.__init__: no revalidation
        self.__dict__.update(vars(registry))
        self._inputs = inputs

    def load_corpus(self, name: str, cache_dir: Path) -> Any:
        corpus = super().load_corpus(name, cache_dir)
        self._inputs.record("corpus", documents_digest(corpus.documents), f"the corpus {name!r}")
        return corpus

    def load_tokenizer(self, model: str, corpus: Any, cache_dir: Path) -> Any:
        return self._inputs.tokenizer(lambda: Registry.load_tokenizer(self, model, corpus, cache_dir))

    def load_model(self, model: str, vocab: Any, heads: Any, config: Mapping[str, Any], generator: Any) -> Any:
        path = Path(model).expanduser()
        if path.is_dir():
            self._inputs.record("model", directory_digest(path), f"the model directory {model!r}")
        return super().load_model(model, vocab, heads, config, generator)

    def get_task(self, name: str, **params: Any) -> Any:
        task = super().get_task(name, **params)
        original = task.task_data
        inputs = self._inputs
        calls = iter(range(1 << 30))

        def task_data(source: str | None, *args: Any, **kwargs: Any) -> Any:
            # Building the evaluation and head-fit sets may ask for task data several times, always
            # in the same order: each call's result is recorded under its own key.
            data = original(source, *args, **kwargs)
            what = f"the downstream data {source!r}" if source else f"the built-in data of task {name!r}"
            n = next(calls)
            inputs.record("downstream" if n == 0 else f"downstream.{n}",
                          tensors_digest(data.batch, repr(data.heads)), what)
            return data

        task.task_data = task_data  # type: ignore[method-assign]
        return task


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
            digest = _text_digest(path.read_text(encoding="utf-8"))
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
