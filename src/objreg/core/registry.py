"""The registry: validated access to the objectives, tasks, providers and head kinds of one
plugin manager.

Validation covers what pluggy does not check: unknown hook names (``check_pending``), objectives
that lack a compute hook, an info name that differs from the registration name, per-objective
hooks in a plugin that declares no objective, and name clashes between objectives or providers.
All problems are reported in one :class:`objreg.PluginError`, each naming the plugin, the hook
and the distribution.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from objreg.core.errors import InvalidParameterError, PluginError, UnknownNameError, UnknownObjectiveError
from objreg.core.guard import attributed
from objreg.core.handles import Objective, Task
from objreg.core.heads import build_heads
from objreg.core.hookspecs import CUSTOM_ATTENTION_HOOK, DOWNSTREAM_HOOKS, PER_OBJECTIVE_HOOKS, PRETRAIN_HOOKS
from objreg.core.manager import ObjregPluginManager, get_plugin_manager
from objreg.core.model import ObjregModel
from objreg.core.providers import CorpusLoader, HeadKind, ModelLoader, Provider, TokenizerLoader
from objreg.core.tokenizer import Tokenizer
from objreg.core.types import Corpus, HeadSpec, ObjectiveInfo, Vocabulary

#: The registration hooks and the kind of thing each registers.
_REGISTRATIONS = {
    "objreg_register_models": "model",
    "objreg_register_corpora": "corpus",
    "objreg_register_tokenizers": "tokenizer",
    "objreg_register_heads": "head",
}


class Registry:
    """Objectives, tasks, providers and head kinds of one plugin manager, validated on construction."""

    def __init__(self, pm: ObjregPluginManager):
        self.pm = pm
        problems = list(pm.load_problems) + _unknown_hooks(pm)
        self._infos: dict[str, ObjectiveInfo] = {}
        self._objective_plugins: dict[str, object] = {}
        self._collect_infos(problems)
        self._check_stray_hooks(problems)
        self._registered: dict[str, list[tuple[Provider | HeadKind, str]]] = {kind: [] for kind in _REGISTRATIONS.values()}
        self._collect_registrations(problems)
        if problems:
            raise PluginError(problems)
        self._hook_cache: dict[str, dict[str, Any]] = {}

    @classmethod
    def load(cls, *, load_entrypoints: bool = True) -> Registry:
        """Built-ins plus installed plugins, validated."""
        return cls(get_plugin_manager(load_entrypoints=load_entrypoints))

    # -- validation -------------------------------------------------------------------------------

    def _collect_infos(self, problems: list[str]) -> None:
        info_impls = self.pm.hook.objreg_objective_info.get_hookimpls()
        info_plugins = [impl.plugin for impl in info_impls]
        for impl in info_impls:
            name = impl.plugin_name
            where = f"plugin {name!r} ({self.pm.origin(name)})"
            others = [p for p in info_plugins if p is not impl.plugin]
            try:
                answers = self.pm.subset_hook_caller("objreg_objective_info", remove_plugins=others)()
            except Exception as e:  # noqa: BLE001 - a broken plugin must not hide the others
                problems.append(f"{where}: objreg_objective_info raised {type(e).__name__}: {e}")
                continue
            if len(answers) != 1 or not isinstance(answers[0], ObjectiveInfo):
                problems.append(f"{where}: objreg_objective_info must return one ObjectiveInfo, got {answers!r}")
                continue
            info = answers[0]
            if info.name != name:
                problems.append(
                    f"{where}: objreg_objective_info names the objective {info.name!r}, but the plugin is "
                    f"registered as {name!r} (the entry-point name must equal the objective name)"
                )
                continue
            implemented = {caller.name for caller in self.pm.get_hookcallers(impl.plugin) or ()}
            required = PRETRAIN_HOOKS if info.kind == "pretrain" else DOWNSTREAM_HOOKS
            for hook in required:
                if hook not in implemented:
                    problems.append(f"{where}: {info.kind} objective {name!r} does not implement required hook {hook}")
            if info.pattern == "custom" and CUSTOM_ATTENTION_HOOK not in implemented:
                problems.append(
                    f"{where}: {info.kind} objective {name!r} does not implement required hook {CUSTOM_ATTENTION_HOOK} "
                    f"(it declares custom attention {info.attention!r}; the host builds only bidirectional, causal "
                    f"and prefix masks)"
                )
            self._infos[name] = info
            self._objective_plugins[name] = impl.plugin

    def _check_stray_hooks(self, problems: list[str]) -> None:
        # Every plugin with an info hook counts, accepted or not: a rejected info is reported once,
        # not again for each of its compute hooks.
        objective_plugins = {id(impl.plugin) for impl in self.pm.hook.objreg_objective_info.get_hookimpls()}
        for hook in PER_OBJECTIVE_HOOKS:
            for impl in getattr(self.pm.hook, hook).get_hookimpls():
                if id(impl.plugin) in objective_plugins or impl.wrapper or impl.hookwrapper:
                    continue
                problems.append(
                    f"plugin {impl.plugin_name!r} ({self.pm.origin(impl.plugin_name)}) implements {hook} but no "
                    f"objreg_objective_info, so no objective name reaches it"
                )

    def _collect_registrations(self, problems: list[str]) -> None:
        """Call every plugin's registration hooks, remembering which plugin registered what."""
        for hook, kind in _REGISTRATIONS.items():
            names: dict[str, str] = {}  # exact name -> who registered it
            # In plugin registration order (the order pluggy stores them; it calls them in reverse).
            for impl in getattr(self.pm.hook, hook).get_hookimpls():
                origin = f"plugin {impl.plugin_name!r} ({self.pm.origin(impl.plugin_name)})"
                try:
                    impl.function(partial(self._register, kind, hook, origin, names, problems))
                except Exception as e:  # noqa: BLE001 - a broken plugin must not hide the others
                    problems.append(f"{origin}: {hook} raised {type(e).__name__}: {e}")

    def _register(self, kind: str, hook: str, origin: str, names: dict[str, str], problems: list[str],
                  item: Provider | HeadKind) -> None:
        """What ``register(item)`` does inside a plugin's registration hook."""
        expected = HeadKind if kind == "head" else Provider
        if not isinstance(item, expected) or (kind != "head" and item.kind != kind):
            of_kind = "" if kind == "head" else f" of kind {kind!r}"
            problems.append(f"{origin}: {hook} registered {item!r}; it takes {expected.__name__} objects{of_kind}")
            return
        if kind == "head" or (item.accepts is None and not item.fallback):  # an exact name: one owner
            if item.name in names:
                problems.append(f"{origin} and {names[item.name]} both register the {kind} {item.name!r}")
                return
            names[item.name] = origin
        self._registered[kind].append((item, origin))

    # -- objectives and tasks -----------------------------------------------------------------------

    def _hooks_for(self, name: str) -> dict[str, Any]:
        if name not in self._hook_cache:
            others = [p for n, p in self._objective_plugins.items() if n != name]
            self._hook_cache[name] = {
                hook: self.pm.subset_hook_caller(hook, remove_plugins=others) for hook in PER_OBJECTIVE_HOOKS
            }
        return self._hook_cache[name]

    def origin(self, name: str) -> str:
        return self.pm.origin(name)

    def objectives(self) -> list[str]:
        """Sorted names of the pre-training objectives."""
        return sorted(n for n, i in self._infos.items() if i.kind == "pretrain")

    def tasks(self) -> list[str]:
        """Sorted names of the downstream tasks."""
        return sorted(n for n, i in self._infos.items() if i.kind == "downstream")

    def info(self, name: str) -> ObjectiveInfo:
        _check_name(name, "objective or task")
        if name not in self._infos:
            raise UnknownObjectiveError(name, self._infos, kind="objective or task")
        return self._infos[name]

    def get(self, name: str, vocab: Vocabulary | None = None, **params: Any) -> Objective:
        """The pre-training objective ``name`` with ``params`` overriding its defaults."""
        _check_name(name, "objective")
        if vocab is not None and not isinstance(vocab, Vocabulary):
            raise InvalidParameterError(f"vocab must be an objreg.Vocabulary (tokenizer.vocab), got {type(vocab).__name__}")
        if name in self._infos and self._infos[name].kind != "pretrain":
            raise InvalidParameterError(
                f"{name!r} is a downstream task, not a pre-training objective; objectives: {', '.join(self.objectives())}"
            )
        if name not in self._infos:
            raise UnknownObjectiveError(name, self.objectives())
        return Objective(self._infos[name], self._resolve(name, params, vocab), self._hooks_for(name), self.origin(name),
                         vocab)

    def get_task(self, name: str, **params: Any) -> Task:
        """The downstream task ``name`` with ``params`` overriding its defaults."""
        _check_name(name, "task")
        if name in self._infos and self._infos[name].kind != "downstream":
            raise InvalidParameterError(
                f"{name!r} is a pre-training objective, not a downstream task; tasks: {', '.join(self.tasks())}"
            )
        if name not in self._infos:
            raise UnknownObjectiveError(name, self.tasks(), kind="downstream task")
        return Task(self._infos[name], self._resolve(name, params), self._hooks_for(name), self.origin(name))

    def _resolve(self, name: str, overrides: Mapping[str, Any], vocab: Vocabulary | None = None) -> Mapping[str, Any]:
        params = self._infos[name].resolve_params(overrides)
        self._hooks_for(name)["objreg_check_params"](params=params, vocab=vocab)
        return params

    # -- providers and head kinds -------------------------------------------------------------------

    def providers(self, kind: str | None = None) -> list[Provider]:
        """The registered models, corpora and tokenizers (of ``kind``), sorted by kind and name."""
        found = [p for k in ("model", "corpus", "tokenizer") for p, _ in self._registered[k] if kind in (None, k)]
        return sorted(found, key=lambda p: (p.kind, p.name))

    def provider_origin(self, provider: Provider | HeadKind) -> str:
        """Which plugin registered ``provider``."""
        kind = "head" if isinstance(provider, HeadKind) else provider.kind
        return next(origin for item, origin in self._registered[kind] if item is provider)

    def head_kinds(self) -> dict[str, HeadKind]:
        return {kind.name: kind for kind, _ in self._registered["head"]}

    def provider(self, kind: str, name: str) -> Provider:
        """The provider of ``kind`` for ``name``: the one registered under that exact name, else the
        first whose ``accepts`` takes it, fallbacks last. Raises :class:`UnknownNameError`, or
        :class:`InvalidParameterError` for a name that is neither a string nor a path."""
        if not isinstance(name, str):
            raise InvalidParameterError(f"a {kind} is named by a string (a name or a path), got "
                                        f"{type(name).__name__} {name!r}: pass str(...)")
        registered = [p for p, _ in self._registered[kind]]
        for candidates in ([p for p in registered if p.accepts is None and not p.fallback],
                           [p for p in registered if p.accepts is not None and not p.fallback],
                           [p for p in registered if p.fallback]):
            for provider in candidates:
                if attributed(self.pm, f"the accepts of {kind} provider {provider.name!r}", provider.handles, name):
                    return provider
        raise UnknownNameError(kind if kind != "tokenizer" else "tokenizer for model", name,
                               [p.name for p in registered])

    def load_corpus(self, name: str | os.PathLike, cache_dir: Path) -> Corpus:
        name = _named(name)
        provider = self.provider("corpus", name)
        load = cast(CorpusLoader, provider.load)
        return attributed(self.pm, f"the corpus provider {provider.name!r}", load, name, cache_dir)

    def load_tokenizer(self, model: str | os.PathLike, corpus: Corpus, cache_dir: Path) -> Tokenizer:
        model = _named(model)
        provider = self.provider("tokenizer", model)
        load = cast(TokenizerLoader, provider.load)
        return attributed(self.pm, f"the tokenizer provider {provider.name!r}", load, model, corpus, cache_dir)

    def load_model(
        self,
        model: str | os.PathLike,
        vocab: Vocabulary,
        heads: Sequence[HeadSpec],
        config: Mapping[str, Any],
        generator: torch.Generator,
    ) -> ObjregModel:
        """The backbone ``model`` with the ``heads`` built on it; every weight drawn from
        ``generator`` (the backbone's first, then the heads' in order)."""
        kinds = self.head_kinds()
        for spec in heads:  # before the backbone is built: a bad head fails in milliseconds
            if spec.kind not in kinds:
                raise InvalidParameterError(
                    f"head {spec.name!r} has unknown kind {spec.kind!r}; registered kinds: {', '.join(sorted(kinds))}"
                )
        model = _named(model)
        provider = self.provider("model", model)
        load = cast(ModelLoader, provider.load)
        backbone: nn.Module = attributed(self.pm, f"the model provider {provider.name!r}", load, model, vocab,
                                         dict(config or {}), generator)
        return ObjregModel(backbone, attributed(self.pm, "the build of a head kind", build_heads, heads, backbone,
                                                kinds, generator))


def _check_name(name: object, kind: str) -> None:
    if not isinstance(name, str):
        raise InvalidParameterError(f"{kind} name must be a str, got {type(name).__name__} {name!r}")


def _unknown_hooks(pm: ObjregPluginManager) -> list[str]:
    """What ``pm.check_pending()`` checks (hook functions that match no spec, e.g. a misspelled
    ``objreg_corupt``), but every one of them rather than the first."""
    problems = []
    for name, caller in sorted(vars(pm.hook).items()):
        if name.startswith("_") or caller.has_spec():
            continue
        for impl in caller.get_hookimpls():
            if not impl.optionalhook:
                problems.append(
                    f"plugin {impl.plugin_name!r} ({pm.origin(impl.plugin_name)}): unknown hook {name!r} "
                    f"(objreg hooks are listed in docs/hooks.md)"
                )
    return problems


def merge_heads(owners: Mapping[str, Sequence[HeadSpec]]) -> list[HeadSpec]:
    """The heads a set of objectives and tasks needs (owner name → its heads), one per name; a name
    declared with two different specs is an error naming both owners."""
    heads: dict[str, tuple[HeadSpec, str]] = {}
    for owner, specs in owners.items():
        for spec in specs:
            if spec.name in heads and heads[spec.name][0] != spec:
                other = heads[spec.name][1]
                raise PluginError(
                    [f"{other!r} and {owner!r} declare head {spec.name!r} differently: {heads[spec.name][0]} vs {spec}"]
                )
            heads.setdefault(spec.name, (spec, owner))
    return [spec for spec, _ in heads.values()]


def _named(name: Any) -> Any:
    """A path given for a corpus or a model, as the string every provider takes."""
    return os.fspath(name) if isinstance(name, os.PathLike) else name
