"""The objreg hook specifications: the reference for plugin authors.

A plugin is a module or an object with functions named after these hooks and marked with
``@objreg.hookimpl``. It may accept any subset of a hook's arguments (pluggy passes only the ones
it names), so hooks can gain arguments without breaking plugins.

Per-objective hooks (``objreg_objective_info``, ``objreg_corrupt``, ``objreg_attention_mask``,
``objreg_loss``, ``objreg_task_data``) are dispatched by name: an objective plugin is registered
under its objective name (its entry-point name), and a call for ``mlm`` reaches only the plugin
registered as ``mlm``. Authors write plain hook functions with no "is this call for me?" guard.
Non-objective plugins that wrap these hooks (``wrapper=True``) stay in every call chain.

Provider hooks (``objreg_load_corpus``, ``objreg_load_tokenizer``, ``objreg_load_model``) go to
every plugin; the first that recognises the requested name answers and the rest return ``None``.

Rules that ``torch.func`` depends on:

* ``objreg_corrupt`` is the only hook that may use randomness, and only from the
  ``torch.Generator`` it is given: the same generator state gives the same output. It runs
  outside any transform.
* ``objreg_attention_mask`` and ``objreg_loss`` are pure and transform-safe: no ``.item()``, no
  Python branching on tensor values, no data-dependent shapes (``nonzero``, boolean indexing), no
  in-place edits of their inputs, no global state, no randomness. The analysis runs them under
  ``vmap``, ``grad`` and ``jvp``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    import click
    import torch

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

PROJECT = "objreg"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

#: Hooks every pre-training objective must implement.
PRETRAIN_HOOKS = ("objreg_corrupt", "objreg_attention_mask", "objreg_loss")
#: Hooks every downstream task must implement.
DOWNSTREAM_HOOKS = ("objreg_task_data", "objreg_attention_mask", "objreg_loss")
#: Hooks dispatched by objective name.
PER_OBJECTIVE_HOOKS = ("objreg_objective_info", "objreg_check_params", *PRETRAIN_HOOKS, "objreg_task_data")


# -- objectives and tasks (dispatched by name) ---------------------------------------------------


@hookspec
def objreg_objective_info() -> ObjectiveInfo:
    """Describe the objective (or downstream task) this plugin provides.

    :return: An :class:`objreg.ObjectiveInfo` whose ``name`` equals the name the plugin is
        registered under (its entry-point name). ``kind="pretrain"`` for objectives,
        ``kind="downstream"`` for tasks. ``params`` lists every parameter with its reference
        default; ``heads`` the heads ``objreg_loss`` uses.

    Called once per plugin when the registry loads; must be cheap and side-effect free.
    """


@hookspec
def objreg_check_params(params: Mapping[str, Any]) -> None:
    """Check constraints that span several parameters (optional).

    :param params: The resolved parameters; each value has already been checked on its own
        against its :class:`objreg.Param` (type, bounds, choices).

    Raise :class:`objreg.InvalidParameterError` naming the parameters and what is allowed, e.g.
    "mask_replace_prob + random_replace_prob must be at most 1". Called when the objective is
    created, so a bad combination fails before any data is loaded.
    """


@hookspec(firstresult=True)
def objreg_corrupt(
    batch: TokenBatch, generator: torch.Generator, params: Mapping[str, Any], vocab: Vocabulary
) -> CorruptedBatch:
    """Corrupt a tokenised batch into model inputs and targets.

    :param batch: The uncorrupted :class:`objreg.TokenBatch`, shapes ``[B, T]``.
    :param generator: The only source of randomness allowed. Draw every random number from it
        (``torch.rand(..., generator=generator)``) so that the same generator state gives the same
        corruption, bit for bit.
    :param params: The objective's parameters, defaults already merged with user overrides and
        checked against ``ObjectiveInfo.params``.
    :param vocab: Special-token ids and vocabulary size; never hard-code ids.
    :return: A :class:`objreg.CorruptedBatch` with batch size ``B``. Padding stays padding,
        special tokens are never corrupted unless the objective says so, and every tensor in
        ``extras`` has ``B`` first.

    Runs outside any ``torch.func`` transform. Vectorise over the batch: no per-token Python loops.
    Stops at the first non-None result.
    """


@hookspec(firstresult=True)
def objreg_attention_mask(batch: CorruptedBatch) -> torch.Tensor:
    """Build the attention mask the backbone uses for this objective.

    :param batch: The corrupted batch.
    :return: Bool tensor ``[B, T, T]``; ``mask[b, i, j]`` True when position ``i`` may attend to
        ``j``. Use the helpers in :mod:`objreg.masks` (``bidirectional``, ``causal``, ``prefix``,
        ``same_document``).

    Required, with no default: a causal objective must never silently get a bidirectional mask.
    Pure and transform-safe. Stops at the first non-None result.
    """


@hookspec(firstresult=True)
def objreg_loss(outputs: ModelOutputs, batch: CorruptedBatch) -> torch.Tensor:
    """Compute the per-sample loss.

    :param outputs: :class:`objreg.ModelOutputs`: ``hidden`` ``[B, T, H]`` from the backbone under
        this objective's mask, and ``model`` for its heads (``model.heads[name]``) and for a second
        backbone pass (``model.encode(...)``).
    :param batch: The corrupted batch.
    :return: Per-sample losses, shape ``[B]``, **never reduced**. The analysis differentiates each
        ``ℓ_i``; the trainer averages them.

    Pure and transform-safe: it runs under ``vmap(grad)`` (per-example, batch of one), ``jvp`` and
    double backward. Use fixed shapes: gather at fixed-size position lists rather than boolean
    indexing. Stops at the first non-None result.
    """


@hookspec(firstresult=True)
def objreg_task_data(
    source: str | None,
    documents: Sequence[Sequence[str]],
    tokenizer: Tokenizer,
    seq_len: int,
    limit: int,
    params: Mapping[str, Any],
) -> CorruptedBatch:
    """Load a downstream task's fixed evaluation set (downstream tasks only).

    :param source: A path the user gave with ``--downstream-data``, or ``None`` for the task's
        built-in set.
    :param documents: Held-out documents (sentences) of the corpus, which the model never
        pre-trains on; a task without its own data builds its built-in set from them.
    :param tokenizer: The tokenizer of the model under analysis.
    :param seq_len: Longest row allowed.
    :param limit: Maximum number of examples to return.
    :param params: The task's parameters.
    :return: The whole evaluation set as one :class:`objreg.CorruptedBatch`, deterministic for
        the same inputs. Raise :class:`objreg.DataError` for a missing or malformed source.

    Stops at the first non-None result.
    """


# -- providers (first plugin that recognises the name answers) ------------------------------------


@hookspec(firstresult=True)
def objreg_load_corpus(name: str, cache_dir: Path) -> Corpus | None:
    """Load the corpus called ``name`` (``"default"``, a path, ...).

    :param name: What the user passed to ``--corpus``.
    :param cache_dir: A directory the plugin may cache derived files in.
    :return: A :class:`objreg.Corpus`, or ``None`` when this plugin does not handle ``name``.
        Raise :class:`objreg.DataError` when it does but the data is unusable.
    """


@hookspec(firstresult=True)
def objreg_load_tokenizer(model: str, corpus: Corpus, cache_dir: Path) -> Tokenizer | None:
    """Provide the tokenizer for ``model`` (its own tokenizer, or one trained on ``corpus``).

    :return: An :class:`objreg.Tokenizer`, or ``None`` when this plugin does not handle ``model``.
    """


@hookspec(firstresult=True)
def objreg_load_model(
    model: str, vocab: Vocabulary, heads: Sequence[HeadSpec], config: Mapping[str, Any], generator: torch.Generator
) -> torch.nn.Module | None:
    """Build the model called ``model``: a shared backbone plus the requested heads.

    :param model: What the user passed to ``--model``.
    :param vocab: The tokenizer's vocabulary.
    :param heads: Heads the selected objectives and task declared (deduplicated by name).
    :param config: Model options from the user (e.g. ``{"num_layers": 4}``); the host moves the
        returned model to its device and dtype.
    :param generator: Initialise weights from this generator, so the same seed gives the same model.
    :return: An ``nn.Module`` with ``backbone`` (the shared parameters), ``heads`` (an
        ``nn.ModuleDict`` keyed by head name), ``hidden_size``, and
        ``encode(input_ids, attention_mask, position_ids) -> [B, T, H]``; or ``None`` when this
        plugin does not handle ``model``.
    """


@hookspec
def objreg_providers() -> list[ProviderInfo]:
    """List the models, corpora and tokenizers this plugin can provide, for ``objreg list``."""


@hookspec
def objreg_register_commands(cli: click.Group) -> None:
    """Add commands to the ``objreg`` CLI (``@cli.command()`` inside the hook)."""
