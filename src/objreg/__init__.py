"""objreg: a plugin registry of Transformer pre-training objectives and a gradient-alignment
analyzer for pre-training to downstream transfer.

The public API. Plugin authors import from here (and from :mod:`objreg.toolkit`)::

    import objreg

    @objreg.hookimpl
    def objreg_objective_info():
        return objreg.ObjectiveInfo(name="myobjective", description="...")

Importing objreg loads the hook markers, the errors and the plugin manager only. Everything else
loads on first use: the contract's types and the toolkit (they need torch), the analyzer
(``analyze``, ``AnalysisConfig``, ``AlignmentReport``, ``make_probe``, ``ProbeSettings``, ``TransferProbe``,
``InRunAlignment``, ``RunWriter``,
``TensorBoardScalars``, ``ProbeCallback``) and the experiments.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

from objreg.core.errors import (
    DataError,
    DeviceError,
    DistributedError,
    InvalidParameterError,
    NonFiniteLossError,
    ObjregError,
    PluginError,
    PluginFailure,
    ProbeStateError,
    ResourceError,
    UnknownNameError,
    UnknownObjectiveError,
)
from objreg.core.hookspecs import hookimpl, hookspec
from objreg.core.manager import get_plugin_manager
from objreg.toolkit.cache import cache_dir

if TYPE_CHECKING:
    from objreg.analysis.probe.hf_callback import ProbeCallback
    from objreg.analysis.probe.in_run import InRunAlignment
    from objreg.analysis.probe.make import make_probe
    from objreg.analysis.probe.report import AlignmentReport
    from objreg.analysis.probe.settings import ProbeSettings
    from objreg.analysis.probe.tensorboard import TensorBoardScalars
    from objreg.analysis.probe.transfer_probe import TransferProbe
    from objreg.analysis.probe.writer import RunWriter
    from objreg.analysis.run.analyze import analyze
    from objreg.analysis.run.config import AnalysisConfig
    from objreg.analysis.run.finetune import FineTuneReport, finetune
    from objreg.analysis.run.finetune import Schedule as FineTuneSchedule
    from objreg.analysis.run.prepare import prepare
    from objreg.analysis.run.screen import ScreenReport, screen
    from objreg.core import masks
    from objreg.core.handles import Objective, Task
    from objreg.core.masks import AttentionMask
    from objreg.core.model import Backbone, Model
    from objreg.core.providers import HeadKind, Provider
    from objreg.core.registry import Registry
    from objreg.core.types import (
        IGNORE_INDEX,
        Corpus,
        CorruptedBatch,
        HeadSpec,
        ModelOutputs,
        ObjectiveInfo,
        Param,
        TaskData,
        TokenBatch,
        Vocabulary,
    )
    from objreg.toolkit.randomness import uniform
    from objreg.toolkit.tokenizer import TokenizedCorpus, Tokenizer, split_sentences

try:
    __version__ = version("objreg")
except PackageNotFoundError:  # an uninstalled checkout
    __version__ = "0+unknown"

#: Loaded on first use, so that ``import objreg`` (and every plugin) stays light: the contract's
#: types, which need torch, too, so that a command that needs no torch (``objreg --version``)
#: does not load it.
_LAZY = {
    "masks": ("objreg.core.masks", None),
    "AttentionMask": ("objreg.core.masks", "AttentionMask"),
    "Objective": ("objreg.core.handles", "Objective"),
    "Task": ("objreg.core.handles", "Task"),
    "Backbone": ("objreg.core.model", "Backbone"),
    "Model": ("objreg.core.model", "Model"),
    "HeadKind": ("objreg.core.providers", "HeadKind"),
    "Provider": ("objreg.core.providers", "Provider"),
    "Registry": ("objreg.core.registry", "Registry"),
    **{name: ("objreg.core.types", name) for name in (
        "IGNORE_INDEX", "Corpus", "CorruptedBatch", "HeadSpec", "ModelOutputs", "ObjectiveInfo", "Param", "TaskData",
        "TokenBatch", "Vocabulary")},
    "uniform": ("objreg.toolkit.randomness", "uniform"),
    "TokenizedCorpus": ("objreg.toolkit.tokenizer", "TokenizedCorpus"),
    "Tokenizer": ("objreg.toolkit.tokenizer", "Tokenizer"),
    "split_sentences": ("objreg.toolkit.tokenizer", "split_sentences"),
    "analyze": ("objreg.analysis.run.analyze", "analyze"),
    "prepare": ("objreg.analysis.run.prepare", "prepare"),
    "AnalysisConfig": ("objreg.analysis.run.config", "AnalysisConfig"),
    "screen": ("objreg.analysis.run.screen", "screen"),
    "ScreenReport": ("objreg.analysis.run.screen", "ScreenReport"),
    "finetune": ("objreg.analysis.run.finetune", "finetune"),
    "FineTuneReport": ("objreg.analysis.run.finetune", "FineTuneReport"),
    "FineTuneSchedule": ("objreg.analysis.run.finetune", "Schedule"),
    "AlignmentReport": ("objreg.analysis.probe.report", "AlignmentReport"),
    "make_probe": ("objreg.analysis.probe.make", "make_probe"),
    "ProbeSettings": ("objreg.analysis.probe.settings", "ProbeSettings"),
    "TransferProbe": ("objreg.analysis.probe.transfer_probe", "TransferProbe"),
    "InRunAlignment": ("objreg.analysis.probe.in_run", "InRunAlignment"),
    "ProbeCallback": ("objreg.analysis.probe.hf_callback", "ProbeCallback"),
    "RunWriter": ("objreg.analysis.probe.writer", "RunWriter"),
    "TensorBoardScalars": ("objreg.analysis.probe.tensorboard", "TensorBoardScalars"),
    "experiments": ("objreg.experiments", None),
    "toolkit": ("objreg.toolkit", None),
}


def __dir__() -> list[str]:
    """The public names, the lazily loaded ones included (``dir(objreg)`` lists ``TransferProbe``)."""
    return sorted(set(globals()) | set(__all__))


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'objreg' has no attribute {name!r}")
    module_name, attribute = _LAZY[name]
    module = importlib.import_module(module_name)
    value = module if attribute is None else getattr(module, attribute)
    globals()[name] = value
    return value


__all__ = [
    "IGNORE_INDEX",
    "AlignmentReport",
    "AnalysisConfig",
    "AttentionMask",
    "Backbone",
    "Corpus",
    "CorruptedBatch",
    "DataError",
    "DeviceError",
    "DistributedError",
    "FineTuneReport",
    "FineTuneSchedule",
    "HeadKind",
    "HeadSpec",
    "InRunAlignment",
    "InvalidParameterError",
    "Model",
    "ModelOutputs",
    "NonFiniteLossError",
    "Objective",
    "ObjectiveInfo",
    "ObjregError",
    "Param",
    "PluginError",
    "PluginFailure",
    "ProbeCallback",
    "ProbeSettings",
    "ProbeStateError",
    "Provider",
    "Registry",
    "ResourceError",
    "RunWriter",
    "ScreenReport",
    "Task",
    "TaskData",
    "TensorBoardScalars",
    "TokenBatch",
    "TokenizedCorpus",
    "Tokenizer",
    "TransferProbe",
    "UnknownNameError",
    "UnknownObjectiveError",
    "Vocabulary",
    "analyze",
    "cache_dir",
    "default_tokenizer",
    "experiments",
    "finetune",
    "get_objective",
    "get_plugin_manager",
    "get_task",
    "hookimpl",
    "hookspec",
    "list_objectives",
    "list_tasks",
    "make_probe",
    "masks",
    "prepare",
    "screen",
    "split_sentences",
    "tokenize",
    "toolkit",
    "uniform",
]


def list_objectives(registry: Registry | None = None) -> list[str]:
    """Sorted names of every pre-training objective, built-in and installed."""
    from objreg.core.registry import Registry

    return (registry or Registry.load()).objectives()


def list_tasks(registry: Registry | None = None) -> list[str]:
    """Sorted names of every downstream task, built-in and installed."""
    from objreg.core.registry import Registry

    return (registry or Registry.load()).tasks()


def get_objective(name: str, vocab: Vocabulary | None = None, registry: Registry | None = None, **params: Any) -> Objective:
    """The objective ``name`` with ``params`` overriding its reference defaults.

    Raises:
        UnknownObjectiveError: no objective of that name (the message suggests close matches).
        UnknownNameError / InvalidParameterError: a parameter it does not have, or a bad value.
    """
    from objreg.core.registry import Registry

    return (registry or Registry.load()).get(name, vocab=vocab, **params)


def get_task(name: str, registry: Registry | None = None, **params: Any) -> Task:
    """The downstream task ``name`` with ``params`` overriding its defaults."""
    from objreg.core.registry import Registry

    return (registry or Registry.load()).get_task(name, **params)


def default_tokenizer(registry: Registry | None = None, cache: Path | None = None) -> Tokenizer:
    """The WordPiece tokenizer of the built-in default corpus (shipped with objreg)."""
    from objreg.core.registry import Registry

    registry = registry or Registry.load()
    directory = cache or cache_dir()
    corpus = registry.load_corpus("default", directory)
    return registry.load_tokenizer("default", corpus, directory)


def tokenize(texts: list[str], seq_len: int | None = None, tokenizer: Tokenizer | None = None) -> TokenBatch:
    """Tokenise texts into a :class:`TokenBatch`, one row per text (default tokenizer unless given)."""
    return (tokenizer or default_tokenizer()).batch_from_texts(texts, seq_len)
