"""The objreg hook specifications: the reference for plugin authors.

A plugin is a module or an object with functions named after these hooks and marked with
``@objreg.hookimpl``. A hook function may take any subset of its hook's arguments (pluggy passes
only the ones it names), so hooks gain arguments without breaking plugins: an ``objreg_loss``
written as ``(outputs, batch)`` keeps working beside one written as ``(outputs, batch, params,
mask)``.

Per-objective hooks (``objreg_objective_info``, ``objreg_check_params``, ``objreg_prepare_batch``,
``objreg_corrupt``, ``objreg_attention_mask``, ``objreg_loss``, ``objreg_task_data``) are
dispatched by name: an objective plugin is registered under its objective name (its entry-point
name), and a call for ``mlm`` reaches only the plugin registered as ``mlm``. Authors write plain
hook functions with no "is this call for me?" guard. Non-objective plugins that wrap these hooks
(``wrapper=True``) stay in every call chain.

Registration hooks (``objreg_register_models``, ``..._corpora``, ``..._tokenizers``,
``..._heads``, ``objreg_register_commands``) go to every plugin; each calls ``register(...)``
once per thing it offers.

Rules that ``torch.func`` depends on:

* ``objreg_corrupt`` is the only hook that may use randomness, and only from the
  ``torch.Generator`` it is given: the same generator state gives the same output. It runs
  outside any transform.
* ``objreg_attention_mask`` and ``objreg_loss`` are pure and transform-safe: no ``.item()``, no
  Python branching on tensor values, no data-dependent shapes (``nonzero``, boolean indexing), no
  in-place edits of their inputs, no global state, no randomness. The analysis runs them under
  ``vmap``, ``grad`` and ``jvp``.
* A loss must not make one row's value depend on another row's unless the objective declares
  ``ObjectiveInfo.batch_coupled`` (in-batch negatives): per-example gradients assume it, and the
  contract suite checks it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    import click
    import torch

    from objreg.core.masks import AttentionMask
    from objreg.core.model import Model
    from objreg.core.providers import HeadKind, Provider
    from objreg.core.tokenizer import Tokenizer
    from objreg.core.types import CorruptedBatch, ModelOutputs, ObjectiveInfo, TaskData, TokenBatch, Vocabulary

PROJECT = "objreg"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

#: Hooks every pre-training objective must implement.
PRETRAIN_HOOKS = ("objreg_corrupt", "objreg_loss")
#: Hooks every downstream task must implement.
DOWNSTREAM_HOOKS = ("objreg_task_data", "objreg_loss")
#: The hook an objective or task must implement when it declares ``custom`` attention; for the
#: other patterns the host builds the declared mask where the plugin implements none.
CUSTOM_ATTENTION_HOOK = "objreg_attention_mask"
#: Hooks dispatched by objective name.
PER_OBJECTIVE_HOOKS = (
    "objreg_objective_info", "objreg_check_params", "objreg_prepare_batch", "objreg_corrupt",
    "objreg_attention_mask", "objreg_loss", "objreg_task_data", "objreg_task_metrics",
)


# -- objectives and tasks (dispatched by name) ---------------------------------------------------


@hookspec
def objreg_objective_info() -> ObjectiveInfo:
    """Describe the objective (or downstream task) this plugin provides.

    :return: An :class:`objreg.ObjectiveInfo` whose ``name`` equals the name the plugin is
        registered under (its entry-point name). ``kind="pretrain"`` for objectives,
        ``kind="downstream"`` for tasks. ``params`` lists every parameter with its reference
        default; ``heads`` the heads ``objreg_loss`` uses; ``attention`` the pattern of its mask.

    Called once per plugin when the registry loads; must be cheap and side-effect free.
    """


@hookspec
def objreg_check_params(params: Mapping[str, Any], vocab: Vocabulary | None) -> None:
    """Check constraints that span several parameters, and what the vocabulary must hold (optional).

    :param params: The resolved parameters; each value has already been checked on its own
        against its :class:`objreg.Param` (type, bounds, choices).
    :param vocab: The vocabulary the objective will corrupt with, or None when it is created
        without one. Raise :class:`objreg.DataError` for a special token it lacks (a FIM marker,
        span sentinels), with the fix in the message: this runs before any model is loaded.

    Raise :class:`objreg.InvalidParameterError` naming the parameters and what is allowed, e.g.
    "mask_replace_prob + random_replace_prob must be at most 1". Called when the objective is
    created, so a bad combination fails before any data is loaded.
    """


@hookspec(firstresult=True)
def objreg_prepare_batch(batch: TokenBatch, model: Model, params: Mapping[str, Any], vocab: Vocabulary) -> TokenBatch:
    """Add what corruption needs from the current model to a batch (optional).

    :param batch: The uncorrupted batch, on the model's device.
    :param model: The model being trained, in eval mode, under ``torch.no_grad()``.
    :param params: The objective's resolved parameters.
    :param vocab: The vocabulary.
    :return: The batch to corrupt (e.g. with ``surprisal`` filled in for the ``entropy`` masking
        policy), or ``None`` to leave it as it is.

    Called before every ``objreg_corrupt``, outside any transform. Deterministic: no randomness,
    so the training trajectory does not depend on whether a step is probed.
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
        ``extras`` has ``B`` first. ``extras`` holds data (positions, targets), not settings:
        the loss reads its settings from ``params``.

    Runs outside any ``torch.func`` transform. Vectorise over the batch: no per-token Python loops.
    """


@hookspec(firstresult=True)
def objreg_attention_mask(batch: CorruptedBatch, params: Mapping[str, Any]) -> AttentionMask | torch.Tensor:
    """The attention the backbone uses for this objective (required for ``custom`` attention only).

    :param batch: The corrupted batch.
    :param params: The objective's resolved parameters.
    :return: An :class:`objreg.AttentionMask` (``bidirectional``, ``causal`` or ``prefix``, with
        padding and per-document blocks: ``O(B·T)``, densified only where a consumer needs it), or
        for any other pattern a bool tensor ``[B, T, T]``, ``mask[b, i, j]`` True when position
        ``i`` may attend to ``j`` (helpers in :mod:`objreg.masks`).

    Without this hook the host builds the mask ``ObjectiveInfo.attention`` declares: padding keys
    never attended, tokens within their own document (``batch.document_ids``), and for ``prefix``
    each row's prefix length from ``batch.extras["prefix_length"]``. Implement it for ``custom``
    attention (required: objreg never guesses a mask) or for a finer mask of a declared pattern
    (contrastive keeps its two views apart). Pure and transform-safe.
    """


@hookspec(firstresult=True)
def objreg_loss(
    outputs: ModelOutputs, batch: CorruptedBatch, params: Mapping[str, Any], mask: torch.Tensor, vocab: Vocabulary
) -> torch.Tensor:
    """Compute the per-sample loss.

    :param outputs: :class:`objreg.ModelOutputs`: ``hidden`` ``[B, T, H]`` from the backbone under
        this objective's mask (``None`` when the objective declares ``runs_backbone``), and
        ``model`` (:class:`objreg.Model`) for its heads (``model.heads[name]``) and for a backbone
        pass of its own (``model.encode(...)``).
    :param batch: The corrupted batch.
    :param params: The objective's resolved parameters (loss options such as label smoothing,
        weights or a temperature).
    :param mask: The batch's attention mask as bool ``[B, T, T]``, for a backbone pass of its own.
    :param vocab: The objective's vocabulary (special ids); ``None`` for a downstream task.
    :return: Per-sample losses, shape ``[B]``, **never reduced**. The analysis differentiates each
        ``ℓ_i``; the trainer averages them.

    Pure and transform-safe: it runs under ``vmap(grad)`` (per-example, batch of one), ``jvp`` and
    double backward. Use fixed shapes: gather at fixed-size position lists rather than boolean
    indexing.
    """


@hookspec(firstresult=True)
def objreg_task_data(
    source: str | None,
    documents: Sequence[Sequence[str]],
    tokenizer: Tokenizer,
    seq_len: int,
    limit: int,
    params: Mapping[str, Any],
) -> TaskData | CorruptedBatch:
    """Load a downstream task's fixed evaluation set (downstream tasks only).

    :param source: A path the user gave with ``--downstream-data``, or ``None`` for the task's
        built-in set.
    :param documents: Held-out documents (sentences) of the corpus, which the model never
        pre-trains on; a task without its own data builds its built-in set from them.
    :param tokenizer: The tokenizer of the model under analysis (:class:`objreg.core.tokenizer.Tokenizer`).
    :param seq_len: Longest row allowed.
    :param limit: Maximum number of examples to return.
    :param params: The task's parameters.
    :return: A :class:`objreg.TaskData`: the whole set as one batch, deterministic for the same
        inputs, and the task's heads sized from the data (a plain ``CorruptedBatch`` keeps the
        heads of ``ObjectiveInfo``). Raise :class:`objreg.DataError` for a missing or malformed
        source.
    """


@hookspec(firstresult=True)
def objreg_task_metrics(outputs: ModelOutputs, batch: CorruptedBatch, params: Mapping[str, Any]) -> Mapping[str, torch.Tensor]:
    """Score each row of a downstream task's batch by the task's usual metric (downstream tasks
    only; optional: ``objreg finetune`` needs it, the analysis does not).

    :param outputs: :class:`objreg.ModelOutputs` of the model on ``batch`` under the task's mask
        (``hidden`` ``[B, T, H]``; ``model`` for its heads).
    :param batch: Rows of the task's data, as ``objreg_task_data`` built them.
    :param params: The task's resolved parameters.
    :return: Metric name → per-row scores ``[B]`` (float, in ``[0, 1]``), whose mean over rows is the
        metric: ``{"accuracy": ...}`` for classification, ``{"exact_match": ..., "f1": ...}`` for QA.
        The first name is the task's headline metric. Called under ``torch.no_grad``; it need not
        be transform-safe.
    """


# -- registration (every plugin; each calls register once per thing it offers) -------------------


@hookspec
def objreg_register_models(register: Callable[[Provider], None]) -> None:
    """Offer models: ``register(objreg.Provider("model", name, description, load))`` where
    ``load(name, vocab, config, generator)`` returns an :class:`objreg.Backbone`."""


@hookspec
def objreg_register_corpora(register: Callable[[Provider], None]) -> None:
    """Offer corpora: ``register(objreg.Provider("corpus", name, description, load))`` where
    ``load(name, cache_dir)`` returns an :class:`objreg.Corpus`."""


@hookspec
def objreg_register_tokenizers(register: Callable[[Provider], None]) -> None:
    """Offer tokenizers: ``register(objreg.Provider("tokenizer", name, description, load))`` where
    ``load(model, corpus, cache_dir)`` returns the :class:`objreg.Tokenizer` for model ``model``."""


@hookspec
def objreg_register_heads(register: Callable[[HeadKind], None]) -> None:
    """Offer head kinds: ``register(objreg.HeadKind(name, description, build))`` where
    ``build(spec, backbone)`` returns the head module for a :class:`objreg.HeadSpec` of that kind."""


@hookspec
def objreg_register_commands(cli: click.Group) -> None:
    """Add commands to the ``objreg`` CLI (``@cli.command()`` inside the hook)."""
