"""What a run loads, hashed as it is loaded (:class:`RunInputs`, through the registry it wraps):
the corpus, the tokenizer, the downstream data and the model directory. A fresh run records the
hashes in its fingerprint and keeps its tokenizer (``tokenizer.json``); a resumed run reads the
tokenizer from there and refuses an input whose hash changed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from objreg.analysis.run.digests import directory_digest, documents_digest, tensors_digest, text_digest
from objreg.analysis.run.fingerprint import TOKENIZER, read_fingerprint
from objreg.core.errors import DataError
from objreg.core.registry import Registry
from objreg.toolkit.atomic import atomic_file
from objreg.toolkit.tokenizer import Tokenizer


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
            self.record("tokenizer", text_digest(text), f"the tokenizer kept in {TOKENIZER}")
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
        self.record("tokenizer", text_digest(text), "the tokenizer")
        self.found["tokenizer_layout"] = layout
        if self.keep:
            assert self.run_dir is not None
            with atomic_file(self.run_dir / TOKENIZER, "w") as f:
                f.write(text)
        return tokenizer


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
