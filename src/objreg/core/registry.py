"""The registry: validated access to objectives, tasks and providers on a plugin manager.

Validation covers what pluggy does not check: unknown hook names (``check_pending``), objectives
that lack a compute hook, an info name that differs from the registration name, per-objective
hooks in a plugin that declares no objective, and name clashes. All problems are reported in one
:class:`objreg.PluginError`, each naming the plugin, the hook and the distribution.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from objreg.core.errors import (
    InvalidParameterError,
    PluginError,
    UnknownNameError,
    UnknownObjectiveError,
)
from objreg.core.hookspecs import DOWNSTREAM_HOOKS, PER_OBJECTIVE_HOOKS, PRETRAIN_HOOKS
from objreg.core.manager import ObjregPluginManager, get_plugin_manager
from objreg.core.tokenizer import Tokenizer
from objreg.core.types import (
    Corpus,
    CorruptedBatch,
    HeadSpec,
    ModelOutputs,
    ObjectiveInfo,
    ProviderInfo,
    TokenBatch,
    Vocabulary,
)


class Objective:
    """One objective (or downstream task) with its parameters resolved.

    The hook callers reach only this objective's plugin (plus wrappers from non-objective
    plugins). Results are checked, so a plugin that returns nothing or the wrong type is named.
    """

    def __init__(self, registry: Registry, info: ObjectiveInfo, params: Mapping[str, Any], vocab: Vocabulary | None):
        self.info = info
        self.name = info.name
        self.params = params
        self.vocab = vocab
        self._registry = registry
        self._hooks = registry._hooks_for(info.name)

    def __repr__(self) -> str:
        return f"Objective({self.name!r}, {dict(self.params)})"

    @property
    def origin(self) -> str:
        return self._registry.origin(self.name)

    def _problem(self, hook: str, what: str) -> PluginError:
        return PluginError([f"objective {self.name!r} ({self.origin}) {what} from {hook}"])

    def corrupt(self, batch: TokenBatch, generator: torch.Generator) -> CorruptedBatch:
        if self.info.kind != "pretrain":
            raise InvalidParameterError(f"{self.name!r} is a downstream task; it has no corruption")
        if self.vocab is None:
            raise InvalidParameterError(f"objective {self.name!r} needs a vocabulary to corrupt: pass vocab=")
        result = self._hooks["objreg_corrupt"](batch=batch, generator=generator, params=self.params, vocab=self.vocab)
        if not isinstance(result, CorruptedBatch):
            raise self._problem("objreg_corrupt", f"returned {type(result).__name__} instead of a CorruptedBatch")
        if result.input_ids.shape[0] != batch.input_ids.shape[0]:
            raise self._problem(
                "objreg_corrupt",
                f"returned batch size {result.input_ids.shape[0]} for an input of {batch.input_ids.shape[0]}",
            )
        return result

    def attention_mask(self, batch: CorruptedBatch) -> torch.Tensor:
        mask = self._hooks["objreg_attention_mask"](batch=batch)
        B, T = batch.input_ids.shape
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or tuple(mask.shape) != (B, T, T):
            got = f"{tuple(mask.shape)} {mask.dtype}" if isinstance(mask, torch.Tensor) else type(mask).__name__
            raise self._problem("objreg_attention_mask", f"returned {got} instead of a bool [B, T, T] = [{B}, {T}, {T}] mask")
        return mask

    def loss(self, outputs: ModelOutputs, batch: CorruptedBatch) -> torch.Tensor:
        loss = self._hooks["objreg_loss"](outputs=outputs, batch=batch)
        B = batch.input_ids.shape[0]
        if not isinstance(loss, torch.Tensor) or tuple(loss.shape) != (B,):
            got = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
            raise self._problem("objreg_loss", f"returned {got} instead of per-sample losses of shape [{B}]")
        return loss

    def task_data(
        self, source: str | None, documents: Sequence[Sequence[str]], tokenizer: Tokenizer, seq_len: int, limit: int
    ) -> CorruptedBatch:
        if self.info.kind != "downstream":
            raise InvalidParameterError(f"{self.name!r} is a pre-training objective, not a downstream task")
        result = self._hooks["objreg_task_data"](
            source=source, documents=documents, tokenizer=tokenizer, seq_len=seq_len, limit=limit, params=self.params
        )
        if not isinstance(result, CorruptedBatch):
            raise self._problem("objreg_task_data", f"returned {type(result).__name__} instead of a CorruptedBatch")
        return result


class Registry:
    """Objectives, tasks and providers of one plugin manager, validated on construction."""

    def __init__(self, pm: ObjregPluginManager):
        self.pm = pm
        problems = list(pm.load_problems) + _unknown_hooks(pm)
        self._infos: dict[str, ObjectiveInfo] = {}
        self._objective_plugins: dict[str, object] = {}
        self._collect_infos(problems)
        self._check_stray_hooks(problems)
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

    # -- lookup -------------------------------------------------------------------------------

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
        if name not in self._infos:
            raise UnknownObjectiveError(name, self._infos, kind="objective or task")
        return self._infos[name]

    def get(self, name: str, vocab: Vocabulary | None = None, **params: Any) -> Objective:
        """The pre-training objective ``name`` with ``params`` overriding its defaults."""
        if name in self._infos and self._infos[name].kind != "pretrain":
            raise InvalidParameterError(
                f"{name!r} is a downstream task, not a pre-training objective; objectives: {', '.join(self.objectives())}"
            )
        if name not in self._infos:
            raise UnknownObjectiveError(name, self.objectives())
        return Objective(self, self._infos[name], self._resolve(name, params), vocab)

    def get_task(self, name: str, **params: Any) -> Objective:
        """The downstream task ``name`` with ``params`` overriding its defaults."""
        if name in self._infos and self._infos[name].kind != "downstream":
            raise InvalidParameterError(
                f"{name!r} is a pre-training objective, not a downstream task; tasks: {', '.join(self.tasks())}"
            )
        if name not in self._infos:
            raise UnknownObjectiveError(name, self.tasks(), kind="downstream task")
        return Objective(self, self._infos[name], self._resolve(name, params), None)

    def _resolve(self, name: str, overrides: Mapping[str, Any]) -> Mapping[str, Any]:
        params = self._infos[name].resolve_params(overrides)
        self._hooks_for(name)["objreg_check_params"](params=params)
        return params

    # -- providers ------------------------------------------------------------------------------

    def providers(self) -> list[ProviderInfo]:
        return sorted((p for answer in self.pm.hook.objreg_providers() for p in answer), key=lambda p: (p.kind, p.name))

    def _provider_names(self, kind: str) -> list[str]:
        return [p.name for p in self.providers() if p.kind == kind]

    def load_corpus(self, name: str, cache_dir: Path) -> Corpus:
        corpus = self.pm.hook.objreg_load_corpus(name=name, cache_dir=cache_dir)
        if corpus is None:
            raise UnknownNameError("corpus", name, self._provider_names("corpus"))
        return corpus

    def load_tokenizer(self, model: str, corpus: Corpus, cache_dir: Path) -> Tokenizer:
        tokenizer = self.pm.hook.objreg_load_tokenizer(model=model, corpus=corpus, cache_dir=cache_dir)
        if tokenizer is None:
            raise UnknownNameError("tokenizer for model", model, self._provider_names("tokenizer"))
        return tokenizer

    def load_model(
        self,
        model: str,
        vocab: Vocabulary,
        heads: Sequence[HeadSpec],
        config: Mapping[str, Any],
        generator: torch.Generator,
    ) -> torch.nn.Module:
        module = self.pm.hook.objreg_load_model(model=model, vocab=vocab, heads=heads, config=config, generator=generator)
        if module is None:
            raise UnknownNameError("model", model, self._provider_names("model"))
        return module


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


def merge_heads(infos: Sequence[ObjectiveInfo]) -> list[HeadSpec]:
    """The heads a set of objectives needs, one per name; a name declared with two different
    specs is an error naming both objectives."""
    heads: dict[str, tuple[HeadSpec, str]] = {}
    for info in infos:
        for spec in info.heads:
            if spec.name in heads and heads[spec.name][0] != spec:
                other = heads[spec.name][1]
                raise PluginError(
                    [f"objectives {other!r} and {info.name!r} declare head {spec.name!r} differently: "
                     f"{heads[spec.name][0]} vs {spec}"]
                )
            heads.setdefault(spec.name, (spec, info.name))
    return [spec for spec, _ in heads.values()]
