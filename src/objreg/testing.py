"""The contract suites, for built-ins and third-party plugins alike: objectives and tasks.

    from objreg.testing import check_objective_contract, check_task_contract

    def test_my_objective_keeps_the_contract():
        check_objective_contract("myobjective")

    def test_my_task_keeps_the_contract():
        check_task_contract("mytask")

:func:`check_objective_contract` runs the objective on a tiny model in float64 and checks what
``objreg analyze`` relies on:

* corruption is deterministic for a generator seed, ignores the global RNG, and (when the hook
  takes a generator) differs across seeds; shapes are ``[B, T]`` and extras have ``B`` first;
* the attention mask never attends to padding and follows the declared pattern
  (``ObjectiveInfo.attention``): causal masks never see the future, a prefix mask sees the
  future only inside a prefix, a bidirectional one is symmetric;
* per-sample losses are finite and ``[B]``, and a row's loss does not change when the other rows
  are removed unless the objective declares ``batch_coupled``;
* per-sample dots equal a per-example reverse-mode loop by every method the analyzer may use
  (``jvp``, ``ghost``, ``vmap``, and whatever ``auto`` picks), and the HVPs of the analyzer's
  curvature path equal double backward.

:func:`check_task_contract` checks what docs/writing-a-plugin.md asks a downstream task's author
to write:

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

Every failed check is reported, in one :class:`ContractError` naming the objective or task, also
when a hook raises (a loss that calls ``.item()`` fails the ``vmap`` check, with what to change).
``quick=True`` skips the Hessian-vector products: ``objreg analyze`` runs the objective's cheap
checks (:func:`contract_problems`) on every objective that is not built in
(:func:`is_third_party`) before training, and warns in one line when one fails.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.func import vmap

import objreg
from objreg.analysis.math.curvature import Curvature, hvp_double_backward
from objreg.analysis.math.functional import ObjectiveFunction, detached, shared_parameters
from objreg.analysis.math.per_sample import (
    derivative_unsupported,
    dots_ghost,
    dots_jvp,
    dots_loop,
    dots_vmap,
    per_sample_dots,
)
from objreg.core.manager import BUILTIN_DISTRIBUTION
from objreg.core.masks import AttentionMask
from objreg.core.registry import merge_heads
from objreg.toolkit.tokenizer import split_sentences
from objreg.toolkit.wordpiece import train_wordpiece

#: Sample documents: several sentences each, so sentence-level objectives have material.
SAMPLE_TEXTS = (
    "The committee met on Tuesday. It approved the budget for the new library. Members argued about the roof.",
    "Rivers carry sediment to the sea. Deltas form where the current slows. Some deltas grow every year.",
    "A compiler translates source code into machine code. Optimisers remove redundant instructions. Tests catch bugs.",
    "The orchestra played a symphony by Brahms. The audience stood up. They applauded for several minutes.",
    "Bees collect nectar from flowers. They store honey in wax cells. The queen lays the eggs.",
    "Mountains shape the weather of a region. Rain falls on the windward side. The other side stays dry.",
)

#: A model small enough for float64 loops over every example.
TINY_MODEL = {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "intermediate_size": 32}


class ContractError(objreg.PluginError, AssertionError):
    """An objective or task failed one or more contract checks (an ``AssertionError``, so test
    runners report it as a failure)."""


def _close(a: torch.Tensor, b: torch.Tensor, rtol: float, atol: float = 1e-10) -> bool:
    return bool(torch.allclose(a, b, rtol=rtol, atol=atol))


def _same_batch(a: objreg.CorruptedBatch, b: objreg.CorruptedBatch) -> bool:
    if a.extras.keys() != b.extras.keys():
        return False
    pairs = [*zip(a[:5], b[:5]), *((a.extras[k], b.extras[k]) for k in a.extras)]
    return all(x.shape == y.shape and torch.equal(x, y) for x, y in pairs)


def _difference(a: torch.Tensor, b: torch.Tensor) -> str:
    return f"max abs difference {float((a - b).abs().max()):.3g}"


class _Checks:
    """Collects passed and failed checks; a check whose code raises fails with the error."""

    def __init__(self) -> None:
        self.passed: list[str] = []
        self.problems: list[str] = []

    def check(self, label: str, ok: bool, detail: str = "") -> None:
        (self.passed.append(label) if ok else self.problems.append(f"{label}: {detail}" if detail else label))

    def run(self, label: str, action: Callable[[], Any]) -> Any:
        """``action()``, or None with a failed check naming the exception it raised."""
        try:
            return action()
        except Exception as error:  # noqa: BLE001 - every failure is reported, not only the first
            self.problems.append(raised(label, error))
            return None


#: What torch says when a hook is not transform-safe (``.item()``, branching on tensor values).
_IMPURE = (".item()", "data-dependent", "data dependent")


def raised(label: str, error: BaseException) -> str:
    """``label: raised RuntimeError: ...``, with what to change where the error says the hook is
    not transform-safe."""
    message = f"{label}: raised {type(error).__name__}: {error}"
    if any(marker in str(error) for marker in _IMPURE):
        message += (" (objreg_loss and objreg_attention_mask run under vmap, grad and jvp: no .item(), no Python "
                    "branching on tensor values, no data-dependent shapes; docs/hooks.md)")
    return message


def check_objective_contract(
    name: str,
    registry: objreg.Registry | None = None,
    *,
    tokenizer: objreg.Tokenizer | None = None,
    texts: Sequence[str] = SAMPLE_TEXTS,
    seq_len: int = 48,
    model: str = "default",
    model_config: dict[str, Any] | None = None,
    params: dict[str, Any] | None = None,
    seed: int = 0,
    rtol: float = 1e-6,
    quick: bool = False,
) -> list[str]:
    """Run every contract check on the pre-training objective ``name``.

    Args:
        quick: Only the cheap checks (everything but the Hessian-vector products), as
            ``objreg analyze`` runs them on third-party objectives before training.

    Returns:
        The names of the checks that ran (all passed).

    Raises:
        ContractError: listing every check that failed, with the objective and its origin. A
            hook that raises (a loss that calls ``.item()`` under ``vmap``, say) is a failed
            check like any other, never an exception of its own.
    """
    registry = registry or objreg.Registry.load()
    passed, problems = contract_problems(name, registry, tokenizer=tokenizer, texts=texts, seq_len=seq_len,
                                         model=model, model_config=model_config, params=params, seed=seed,
                                         rtol=rtol, quick=quick)
    if problems:
        where = f"objective {name!r} ({registry.origin(name)})"
        raise ContractError([f"{where} failed: {p}" for p in problems])
    return passed


def contract_problems(
    name: str,
    registry: objreg.Registry,
    *,
    tokenizer: objreg.Tokenizer | None = None,
    texts: Sequence[str] = SAMPLE_TEXTS,
    seq_len: int = 48,
    model: str = "default",
    model_config: dict[str, Any] | None = None,
    params: dict[str, Any] | None = None,
    seed: int = 0,
    rtol: float = 1e-6,
    quick: bool = False,
) -> tuple[list[str], list[str]]:
    """:func:`check_objective_contract` without the raising: the checks that passed and the
    problems, each a line naming the check (and the exception, where its code raised).

    Raises:
        UnknownObjectiveError, InvalidParameterError: as :meth:`objreg.Registry.get` does.
    """
    tokenizer = tokenizer or _sample_tokenizer(texts)
    checks = _Checks()
    objective = registry.get(name, vocab=tokenizer.vocab, **(params or {}))
    tokens = tokenizer.batch_from_texts(list(texts), seq_len)
    first = checks.run("corrupt", lambda: _check_corruption(objective, tokens, seed, checks))
    if first is not None:
        checks.run("attention", lambda: _check_attention(objective, first, checks))
        checks.run("losses and gradients", lambda: _check_gradients(
            registry, objective, tokenizer, first, model, model_config, seed, rtol, checks, quick))
    return checks.passed, checks.problems


def is_third_party(registry: objreg.Registry, name: str) -> bool:
    """Whether objective ``name`` comes from anywhere but objreg's built-ins (an installed plugin,
    or one registered at run time)."""
    return registry.origin(name) != BUILTIN_DISTRIBUTION


def _check_corruption(
    objective: objreg.Objective, tokens: objreg.TokenBatch, seed: int, checks: _Checks
) -> objreg.CorruptedBatch:
    # Reseed the global RNG between the calls: output that follows it instead of the given
    # generator shows up as a difference.
    with torch.random.fork_rng():
        torch.manual_seed(seed + 1)
        first = objective.corrupt(tokens, torch.Generator().manual_seed(seed))
        torch.manual_seed(seed + 2)
        again = objective.corrupt(tokens, torch.Generator().manual_seed(seed))
    checks.check("corrupt is deterministic for a generator seed and ignores the global RNG", _same_batch(first, again))
    if _takes_generator(objective):
        others = [objective.corrupt(tokens, torch.Generator().manual_seed(seed + k)) for k in range(1, 4)]
        checks.check("corrupt draws from its generator: other seeds give other corruptions",
                     not all(_same_batch(first, other) for other in others),
                     "four seeds gave the same batch although the hook takes a generator")
    B, T = first.input_ids.shape
    shapes_ok = all(t.shape == (B, T) for t in first[:5]) and all(t.shape[0] == B for t in first.extras.values())
    checks.check("corrupted fields are [B, T] and extras have B first", shapes_ok,
                 f"input_ids {tuple(first.input_ids.shape)}, fields {[tuple(t.shape) for t in first[:5]]}")
    return first


def _takes_generator(objective: objreg.Objective) -> bool:
    return any("generator" in impl.argnames for impl in objective._hooks["objreg_corrupt"].get_hookimpls())


def _check_attention(objective: objreg.Objective, batch: objreg.CorruptedBatch, checks: _Checks) -> None:
    described = objective.attention(batch)
    pattern = objective.info.pattern
    if isinstance(described, AttentionMask):
        checks.check("a structured mask has the pattern the objective declares", described.pattern == pattern,
                     f"ObjectiveInfo.attention is {objective.info.attention!r}, the mask is {described.pattern!r}")
    mask = objective.attention_mask(batch)
    B, T = batch.input_ids.shape
    real = ~batch.is_padding
    to_padding = mask & batch.is_padding[:, None, :]
    checks.check("the mask never attends to padding", not bool(to_padding.any()), _first_pairs(to_padding))
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    if pattern == "causal":
        checks.check("a causal mask never attends to the future", not bool((mask & future).any()))
    elif pattern == "prefix":
        # The prefix of a row is what its first query sees; beyond it, nothing of the future.
        prefix = mask[:, 0, :].long().cumprod(dim=1).sum(dim=1)  # (B,)
        outside = torch.arange(T)[None, :] >= prefix[:, None]  # (B, T) keys beyond the prefix
        checks.check("a prefix mask sees the future only inside the prefix",
                     not bool((mask & future & outside[:, None, :]).any()))
    elif pattern == "bidirectional":
        both_real = real[:, :, None] & real[:, None, :]
        checks.check("a bidirectional mask is symmetric between real tokens",
                     torch.equal(mask & both_real, mask.transpose(1, 2) & both_real))


def _first_pairs(pairs: torch.Tensor) -> str:
    """How many (query, key) pairs a bool ``[B, T, T]`` holds, and the first."""
    found = pairs.nonzero()
    if len(found) == 0:
        return ""
    b, i, j = found[0].tolist()
    return f"{len(found)} (query, key) pairs do, the first in row {b}: query {i} attends padded key {j}"


def _check_gradients(
    registry: objreg.Registry, objective: objreg.Objective, tokenizer: objreg.Tokenizer,
    batch: objreg.CorruptedBatch, model: str, model_config: dict[str, Any] | None, seed: int, rtol: float,
    checks: _Checks, quick: bool = False,
) -> None:
    built = registry.load_model(model, tokenizer.vocab, merge_heads({objective.name: objective.info.heads}),
                                dict(TINY_MODEL if model_config is None else model_config), torch.Generator().manual_seed(seed))
    built = built.to(torch.float64).eval()
    function = ObjectiveFunction(built, objective, batch)
    shared = detached(shared_parameters(built))
    losses = function(shared)
    B = batch.batch_size
    checks.check("per-sample losses are finite and [B]", losses.shape == (B,) and bool(torch.isfinite(losses).all()),
                 f"shape {tuple(losses.shape)}, values {losses.tolist()}")
    coupled = objective.info.batch_coupled
    if not coupled:
        _check_rows_alone(function, shared, losses, rtol, checks)

    generator = torch.Generator().manual_seed(seed)
    direction = {n: torch.randn(t.shape, generator=generator, dtype=t.dtype) for n, t in shared.items()}
    reference = dots_loop(function, shared, direction)
    methods = {"jvp": dots_jvp, **({} if coupled else {"ghost": dots_ghost, "vmap": dots_vmap})}
    for method, compute in methods.items():
        try:
            dots = compute(function, shared, direction)
        except (NotImplementedError, RuntimeError) as error:
            if derivative_unsupported(error):  # this model lacks the method; auto moves on, as checked below
                continue
            checks.problems.append(raised(f"per-sample dots by {method}", error))
            continue
        checks.check(f"per-sample dots by {method} equal the per-example loop", _close(dots, reference, rtol),
                     _difference(dots, reference))
    chosen = checks.run("per-sample dots by auto", lambda: per_sample_dots(function, shared, direction, "auto"))
    if chosen is not None:
        checks.check(f"per-sample dots as objreg analyze takes them ({chosen[1]}) equal the loop",
                     _close(chosen[0], reference, rtol), _difference(chosen[0], reference))

    if not quick:
        _check_hvps(function, shared, direction, rtol, checks)


def _check_rows_alone(function: ObjectiveFunction, shared: dict[str, torch.Tensor], losses: torch.Tensor,
                      rtol: float, checks: _Checks) -> None:
    batch = function.batch
    alone = torch.stack([function.losses(shared, batch.select([i]), function.mask[i : i + 1])[0]
                         for i in range(batch.batch_size)])
    checks.check("a row's loss does not depend on the other rows of the batch", _close(alone, losses, rtol),
                 f"rows interact ({_difference(alone, losses)} between each row alone and in the batch), but "
                 f"ObjectiveInfo.batch_coupled is False: declare batch_coupled=True (per-example gradients "
                 f"and ghost dots assume independent rows), or make each row's loss its own")


def _check_hvps(function: ObjectiveFunction, shared: dict[str, torch.Tensor], direction: dict[str, torch.Tensor],
                rtol: float, checks: _Checks) -> None:
    """The analyzer's Hessian-vector products (forward over reverse, and ``auto``) against
    double backward."""
    expected = hvp_double_backward(function.mean, shared, direction)
    scale = max(max(float(t.abs().max()) for t in expected.values()), 1.0)
    for method in ("forward_over_reverse", "auto"):
        curvature = Curvature([function], shared, method)
        got = checks.run(f"HVP by {method}", lambda curvature=curvature: curvature.gradient_and_products([direction]))
        if got is not None:
            worst = max(float((got[1][0][n] - expected[n]).abs().max()) for n in shared)
            checks.check(f"HVPs by the analyzer's {method} path equal double backward", worst <= rtol * scale,
                         f"max abs difference {worst:.3g} (scale {scale:.3g})")


# -- downstream tasks ---------------------------------------------------------------------------------


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
    tokenizer = tokenizer or _sample_tokenizer(texts)
    task = registry.get_task(name, **(params or {}))
    documents = [split_sentences(text) for text in texts]
    checks = _Checks()
    data = checks.run("task_data", lambda: _check_task_data(task, source, documents, tokenizer, seq_len, limit, seed,
                                                           checks))
    if data is not None:
        checks.run("attention", lambda: _check_attention(task, data.batch, checks))
        if checks.run("heads", lambda: _check_heads(registry, task, data.heads, checks)):
            checks.run("losses and gradients", lambda: _check_task_losses(
                registry, task, tokenizer, data, model, model_config, seed, rtol, checks, quick))
    if checks.problems:
        raise ContractError([f"task {name!r} ({registry.origin(name)}) failed: {p}" for p in checks.problems])
    return checks.passed


def _check_task_data(
    task: objreg.Task, source: str | None, documents: Sequence[Sequence[str]], tokenizer: objreg.Tokenizer,
    seq_len: int, limit: int, seed: int, checks: _Checks,
) -> objreg.TaskData:
    # As for corruption: a set that follows the global RNG shows up as a difference.
    with torch.random.fork_rng():
        torch.manual_seed(seed + 1)
        first = task.task_data(source, documents, tokenizer, seq_len, limit)
        torch.manual_seed(seed + 2)
        again = task.task_data(source, documents, tokenizer, seq_len, limit)
    same = _same_batch(first.batch, again.batch) and first.heads == again.heads
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
                 checks: _Checks) -> bool:
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
    model_config: dict[str, Any] | None, seed: int, rtol: float, checks: _Checks, quick: bool,
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
        _check_rows_alone(function, shared, losses, rtol, checks)
        rows = checks.run("per-example losses under vmap", lambda: vmap(function.example_loss, in_dims=(None, 0, 0))(
            shared, batch, function.mask))
        if rows is not None:
            checks.check("per-example losses under vmap equal the plain call", _close(rows, losses, rtol),
                         f"{_difference(rows, losses)}: a row's loss changes when it is the only one (a loss that "
                         f"divides by the batch size, or reads another row)")

    generator = torch.Generator().manual_seed(seed)
    direction = {n: torch.randn(t.shape, generator=generator, dtype=t.dtype) for n, t in shared.items()}
    reference = dots_loop(function, shared, direction)
    methods = {"jvp": dots_jvp, **({} if coupled else {"vmap": dots_vmap})}
    for method, compute in methods.items():
        dots = checks.run(f"per-sample dots by {method}", lambda compute=compute: compute(function, shared, direction))
        if dots is not None:
            checks.check(f"per-sample dots by {method} equal the per-example loop", _close(dots, reference, rtol),
                         _difference(dots, reference))
    if not quick:
        _check_hvps(function, shared, direction, rtol, checks)


def _check_padding_ignored(task: objreg.Task, function: ObjectiveFunction, shared: dict[str, torch.Tensor],
                           losses: torch.Tensor, vocab_size: int, seed: int, rtol: float, checks: _Checks) -> None:
    """Other token ids at every padded position leave every row's loss as it was."""
    batch = function.batch
    if not bool(batch.is_padding.any()):
        return
    others = torch.randint(vocab_size, batch.input_ids.shape, generator=torch.Generator().manual_seed(seed))
    changed = batch._replace(input_ids=torch.where(batch.is_padding, others, batch.input_ids))
    again = function.losses(shared, changed, task.attention_mask(changed))
    checks.check("changing the padded tokens does not change the loss", _close(again, losses, rtol),
                 f"{_difference(again, losses)}: the mask lets a real token attend padding, or the loss reads "
                 f"padded positions (weight them out by position)")


def _sample_tokenizer(texts: Sequence[str]) -> objreg.Tokenizer:
    return train_wordpiece(list(texts) * 10, vocab_size=300, name="contract-suite")
