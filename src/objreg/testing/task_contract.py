"""The task contract: :func:`check_task_contract` checks what docs/writing-a-plugin.md asks a
downstream task's author to write:

* ``task_data`` is deterministic (the same inputs twice give equal :class:`objreg.TaskData`,
  whatever the global RNG) and returns at most ``limit`` rows of at most ``seq_len`` tokens;
* its heads are the declared ones, sized from the data where their kind needs a size, and the
  loss reads no head ``ObjectiveInfo.heads`` does not declare;
* the per-sample loss is finite and ``[B]``, a row's loss is its own (unless ``batch_coupled``),
  and it is the same under ``torch.func`` transforms: ``vmap`` over rows gives the plain call's
  values, per-sample dots by ``jvp`` and ``vmap(grad)`` through ``functional_call`` equal a
  per-example reverse-mode loop, and the analyzer's HVPs of it equal double backward;
* no attention to padding: the mask follows the declared pattern and never attends to padding,
  and changing the padded tokens does not change the loss.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.func import vmap

import objreg
from objreg.analysis.math.functional import ObjectiveFunction, detached, shared_parameters
from objreg.analysis.math.per_sample import (
    dots_jvp,
    dots_loop,
    dots_vmap,
)
from objreg.core.registry import merge_heads
from objreg.testing.checks import (
    SAMPLE_TEXTS,
    TINY_MODEL,
    Checks,
    ContractError,
    check_attention,
    check_hvps,
    check_rows_alone,
    close,
    difference,
    raised,
    same_batch,
    sample_tokenizer,
)
from objreg.toolkit.tokenizer import split_sentences


def check_task_contract(
    name: str,
    registry: objreg.Registry | None = None,
    *,
    tokenizer: objreg.Tokenizer | None = None,
    texts: Sequence[str] = SAMPLE_TEXTS,
    source: str | None = None,
    seq_len: int = 48,
    limit: int = 8,
    model: str = "default",
    model_config: dict[str, Any] | None = None,
    params: dict[str, Any] | None = None,
    seed: int = 0,
    rtol: float = 1e-6,
    quick: bool = False,
) -> list[str]:
    """Run every contract check on the downstream task ``name``.

    Args:
        texts: The held-out documents ``objreg_task_data`` builds a built-in set from (each text
            split into sentences); ``source``: a data file of the task's instead (``--downstream-data``).
        seq_len, limit: What ``objreg_task_data`` is given: the longest row and the most rows.
        quick: Everything but the Hessian-vector products.

    Returns:
        The names of the checks that ran (all passed). The padded-token check runs only where the
        task data has padding.

    Raises:
        ContractError: listing every check that failed, with the task and its origin; a hook that
            raises is a failed check like any other.
    """
    registry = registry or objreg.Registry.load()
    tokenizer = tokenizer or sample_tokenizer(texts)
    task = registry.get_task(name, **(params or {}))
    documents = [split_sentences(text) for text in texts]
    checks = Checks()
    data = checks.run("task_data", lambda: _check_task_data(task, source, documents, tokenizer, seq_len, limit, seed,
                                                           checks))
    if data is not None:
        checks.run("attention", lambda: check_attention(task, data.batch, checks))
        if checks.run("heads", lambda: _check_heads(registry, task, data.heads, checks)):
            checks.run("losses and gradients", lambda: _check_task_losses(
                registry, task, tokenizer, data, model, model_config, seed, rtol, checks, quick))
    if checks.problems:
        raise ContractError([f"task {name!r} ({registry.origin(name)}) failed: {p}" for p in checks.problems])
    return checks.passed


def _check_task_data(
    task: objreg.Task, source: str | None, documents: Sequence[Sequence[str]], tokenizer: objreg.Tokenizer,
    seq_len: int, limit: int, seed: int, checks: Checks,
) -> objreg.TaskData:
    # As for corruption: a set that follows the global RNG shows up as a difference.
    with torch.random.fork_rng():
        torch.manual_seed(seed + 1)
        first = task.task_data(source, documents, tokenizer, seq_len, limit)
        torch.manual_seed(seed + 2)
        again = task.task_data(source, documents, tokenizer, seq_len, limit)
    same = same_batch(first.batch, again.batch) and first.heads == again.heads
    checks.check("task_data is deterministic: the same inputs give the same TaskData, whatever the global RNG", same,
                 "" if same else f"two calls with the same inputs differ: {_task_data_difference(first, again)}")
    batch = first.batch
    B, T = batch.input_ids.shape
    shapes_ok = all(t.shape == (B, T) for t in batch[:5]) and all(t.shape[0] == B for t in batch.extras.values())
    extras = {k: tuple(v.shape) for k, v in batch.extras.items()}
    checks.check("task_data gives at most limit rows of at most seq_len tokens, fields [B, T] and extras with B first",
                 shapes_ok and 1 <= B <= limit and T <= seq_len,
                 f"{B} rows of {T} tokens for limit {limit} and seq_len {seq_len}; fields "
                 f"{[tuple(t.shape) for t in batch[:5]]}, extras {extras}")
    return first


def _task_data_difference(a: objreg.TaskData, b: objreg.TaskData) -> str:
    """What differs between two task data sets, in words."""
    if a.heads != b.heads:
        return f"heads {a.heads} and {b.heads}"
    if a.batch.extras.keys() != b.batch.extras.keys():
        return f"extras {sorted(a.batch.extras)} and {sorted(b.batch.extras)}"
    fields = {**dict(zip(objreg.CorruptedBatch._fields[:5], zip(a.batch[:5], b.batch[:5]))),
              **{f"extras[{k!r}]": (a.batch.extras[k], b.batch.extras[k]) for k in a.batch.extras}}
    differ = [n for n, (x, y) in fields.items() if x.shape != y.shape or not torch.equal(x, y)]
    return ", ".join(differ) + " (draw from a torch.Generator seeded from the task's parameters, never the global RNG)"


def _check_heads(registry: objreg.Registry, task: objreg.Task, heads: Sequence[objreg.HeadSpec],
                 checks: Checks) -> bool:
    """Whether the heads can be built: each declared, of its declared kind, sized where it must be."""
    declared = {spec.name: spec for spec in task.info.heads}
    kinds = registry.head_kinds()
    problems = []
    for spec in heads:
        if spec.kind != declared[spec.name].kind:
            problems.append(f"TaskData sizes head {spec.name!r} as kind {spec.kind!r}, but ObjectiveInfo.heads declares "
                            f"kind {declared[spec.name].kind!r}")
        elif spec.kind not in kinds:
            problems.append(f"head {spec.name!r} has unknown kind {spec.kind!r}; registered kinds: {sorted(kinds)}")
        elif kinds[spec.kind].needs_outputs and spec.num_outputs < 1:
            problems.append(f"head {spec.name!r} ({spec.kind}) has no size: return it sized from the data in "
                            f"TaskData.heads, e.g. HeadSpec({spec.name!r}, {spec.kind!r}, number_of_classes)")
    checks.check("the heads are the declared ones, sized from the data where their kind needs a size", not problems,
                 "; ".join(problems))
    return not problems


class _ReadHeads(nn.ModuleDict):
    """``model.heads`` that remembers which names the loss reads (a name it lacks included)."""

    def __init__(self, heads: nn.ModuleDict):
        super().__init__(heads)
        self.read: list[str] = []

    def __getitem__(self, key: str) -> nn.Module:
        self.read.append(key)
        return super().__getitem__(key)


def _check_task_losses(
    registry: objreg.Registry, task: objreg.Task, tokenizer: objreg.Tokenizer, data: objreg.TaskData, model: str,
    model_config: dict[str, Any] | None, seed: int, rtol: float, checks: Checks, quick: bool,
) -> None:
    built = registry.load_model(model, tokenizer.vocab, merge_heads({task.name: data.heads}),
                                dict(TINY_MODEL if model_config is None else model_config), torch.Generator().manual_seed(seed))
    built = built.to(torch.float64).eval()
    heads = _ReadHeads(built.heads)  # only the task's heads: reading another raises
    built.heads = heads
    batch = data.batch
    function = ObjectiveFunction(built, task, batch)
    shared = detached(shared_parameters(built))
    try:
        losses = function(shared)
    except Exception as error:  # noqa: BLE001 - reported as a failed check, named where it can be
        undeclared = [name for name in heads.read if name not in heads]
        if not undeclared:
            checks.problems.append(raised("per-sample losses", error))
            return
        checks.problems.append(
            f"the loss reads only heads ObjectiveInfo.heads declares: it reads model.heads[{undeclared[0]!r}], which "
            f"is not declared (declared: {', '.join(repr(s.name) for s in task.info.heads) or 'none'}); the host builds "
            f"only declared heads, so declare it with a HeadSpec")
        return
    checks.check("the loss reads only heads ObjectiveInfo.heads declares", True)
    B = batch.batch_size
    checks.check("per-sample losses are finite and [B]", losses.shape == (B,) and bool(torch.isfinite(losses).all()),
                 f"shape {tuple(losses.shape)}, values {losses.tolist()}")
    _check_padding_ignored(task, function, shared, losses, tokenizer.vocab.size, seed, rtol, checks)
    coupled = task.info.batch_coupled
    if not coupled:
        check_rows_alone(function, shared, losses, rtol, checks)
        rows = checks.run("per-example losses under vmap", lambda: vmap(function.example_loss, in_dims=(None, 0, 0))(
            shared, batch, function.mask))
        if rows is not None:
            checks.check("per-example losses under vmap equal the plain call", close(rows, losses, rtol),
                         f"{difference(rows, losses)}: a row's loss changes when it is the only one (a loss that "
                         f"divides by the batch size, or reads another row)")

    generator = torch.Generator().manual_seed(seed)
    direction = {n: torch.randn(t.shape, generator=generator, dtype=t.dtype) for n, t in shared.items()}
    reference = dots_loop(function, shared, direction)
    methods = {"jvp": dots_jvp, **({} if coupled else {"vmap": dots_vmap})}
    for method, compute in methods.items():
        dots = checks.run(f"per-sample dots by {method}", lambda compute=compute: compute(function, shared, direction))
        if dots is not None:
            checks.check(f"per-sample dots by {method} equal the per-example loop", close(dots, reference, rtol),
                         difference(dots, reference))
    if not quick:
        check_hvps(function, shared, direction, rtol, checks)


def _check_padding_ignored(task: objreg.Task, function: ObjectiveFunction, shared: dict[str, torch.Tensor],
                           losses: torch.Tensor, vocab_size: int, seed: int, rtol: float, checks: Checks) -> None:
    """Other token ids at every padded position leave every row's loss as it was."""
    batch = function.batch
    if not bool(batch.is_padding.any()):
        return
    others = torch.randint(vocab_size, batch.input_ids.shape, generator=torch.Generator().manual_seed(seed))
    changed = batch._replace(input_ids=torch.where(batch.is_padding, others, batch.input_ids))
    again = function.losses(shared, changed, task.attention_mask(changed))
    checks.check("changing the padded tokens does not change the loss", close(again, losses, rtol),
                 f"{difference(again, losses)}: the mask lets a real token attend padding, or the loss reads "
                 f"padded positions (weight them out by position)")
