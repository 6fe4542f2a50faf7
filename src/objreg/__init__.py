"""objreg: a plugin registry of Transformer pre-training objectives and a gradient-alignment
analyzer for pre-training to downstream transfer.

The public API. Plugin authors import from here alone::

    import objreg

    @objreg.hookimpl
    def objreg_objective_info():
        return objreg.ObjectiveInfo(name="myobjective", description="...")
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from objreg import experiments
from objreg.analysis.config import AnalysisConfig
from objreg.analysis.report import AlignmentReport
from objreg.analysis.run import analyze
from objreg.core import heads, masking, masks, spans
from objreg.core.cache import cache_dir
from objreg.core.errors import (
    DataError,
    DeviceError,
    InvalidParameterError,
    NonFiniteLossError,
    ObjregError,
    PluginError,
    UnknownNameError,
    UnknownObjectiveError,
)
from objreg.core.hookspecs import hookimpl, hookspec
from objreg.core.manager import get_plugin_manager
from objreg.core.randomness import uniform
from objreg.core.registry import Objective, Registry
from objreg.core.tokenizer import TokenizedCorpus, Tokenizer, split_sentences
from objreg.core.types import (
    IGNORE_INDEX,
    Corpus,
    CorruptedBatch,
    HeadSpec,
    ModelOutputs,
    ObjectiveInfo,
    Param,
    ProviderInfo,
    TokenBatch,
    Vocabulary,
)

try:
    __version__ = version("objreg")
except PackageNotFoundError:  # an uninstalled checkout
    __version__ = "0+unknown"

__all__ = [
    "IGNORE_INDEX",
    "AlignmentReport",
    "AnalysisConfig",
    "Corpus",
    "CorruptedBatch",
    "DataError",
    "DeviceError",
    "HeadSpec",
    "InvalidParameterError",
    "ModelOutputs",
    "NonFiniteLossError",
    "Objective",
    "ObjectiveInfo",
    "ObjregError",
    "Param",
    "PluginError",
    "ProviderInfo",
    "Registry",
    "TokenBatch",
    "TokenizedCorpus",
    "Tokenizer",
    "UnknownNameError",
    "UnknownObjectiveError",
    "Vocabulary",
    "analyze",
    "cache_dir",
    "default_tokenizer",
    "experiments",
    "get_objective",
    "get_plugin_manager",
    "get_task",
    "heads",
    "hookimpl",
    "hookspec",
    "list_objectives",
    "list_tasks",
    "masking",
    "masks",
    "split_sentences",
    "spans",
    "tokenize",
    "uniform",
]


def list_objectives(registry: Registry | None = None) -> list[str]:
    """Sorted names of every pre-training objective, built-in and installed."""
    return (registry or Registry.load()).objectives()


def list_tasks(registry: Registry | None = None) -> list[str]:
    """Sorted names of every downstream task, built-in and installed."""
    return (registry or Registry.load()).tasks()


def get_objective(name: str, vocab: Vocabulary | None = None, registry: Registry | None = None, **params: Any) -> Objective:
    """The objective ``name`` with ``params`` overriding its reference defaults.

    Raises:
        UnknownObjectiveError: no objective of that name (the message suggests close matches).
        UnknownNameError / InvalidParameterError: a parameter it does not have, or a bad value.
    """
    return (registry or Registry.load()).get(name, vocab=vocab, **params)


def get_task(name: str, registry: Registry | None = None, **params: Any) -> Objective:
    """The downstream task ``name`` with ``params`` overriding its defaults."""
    return (registry or Registry.load()).get_task(name, **params)


def default_tokenizer(registry: Registry | None = None, cache: Path | None = None) -> Tokenizer:
    """The WordPiece tokenizer trained on the built-in default corpus (trained once, then cached)."""
    registry = registry or Registry.load()
    directory = cache or cache_dir()
    corpus = registry.load_corpus("default", directory)
    return registry.load_tokenizer("default", corpus, directory)


def tokenize(texts: list[str], seq_len: int | None = None, tokenizer: Tokenizer | None = None) -> TokenBatch:
    """Tokenise texts into a :class:`TokenBatch`, one row per text (default tokenizer unless given)."""
    return (tokenizer or default_tokenizer()).batch_from_texts(texts, seq_len)
