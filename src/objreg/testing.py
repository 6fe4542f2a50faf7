"""The objective contract suite, for built-ins and third-party plugins alike.

    from objreg.testing import check_objective_contract

    def test_my_objective_keeps_the_contract():
        check_objective_contract("myobjective")

It runs the objective on a tiny model in float64 and checks what ``objreg analyze`` relies on:

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

Every failed check is reported, in one :class:`ContractError`, also when a hook raises (a loss
that calls ``.item()`` fails the ``vmap`` check, with what to change). ``quick=True`` skips the
Hessian-vector products: ``objreg analyze`` runs those cheap checks (:func:`contract_problems`) on
every objective that is not built in (:func:`is_third_party`) before training, and warns in one
line when one fails.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

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
    """An objective failed one or more contract checks (an ``AssertionError``, so test runners
    report it as a failure)."""


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
    checks.check("the mask never attends to padding", not bool((mask & batch.is_padding[:, None, :]).any()))
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
    alone = torch.stack([function.losses(shared, batch.select([i]), function.mask[i : i + 1])[0] for i in range(B)])
    if not coupled:
        checks.check("a row's loss does not depend on the other rows of the batch", _close(alone, losses, rtol),
                     f"rows interact ({_difference(alone, losses)} between each row alone and in the batch), but "
                     f"ObjectiveInfo.batch_coupled is False: declare batch_coupled=True (per-example gradients "
                     f"and ghost dots assume independent rows), or make each row's loss its own")

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

    if quick:
        return
    expected = hvp_double_backward(function.mean, shared, direction)
    scale = max(max(float(t.abs().max()) for t in expected.values()), 1.0)
    for method in ("forward_over_reverse", "auto"):
        curvature = Curvature([function], shared, method)
        got = checks.run(f"HVP by {method}", lambda curvature=curvature: curvature.gradient_and_products([direction]))
        if got is not None:
            worst = max(float((got[1][0][n] - expected[n]).abs().max()) for n in shared)
            checks.check(f"HVPs by the analyzer's {method} path equal double backward", worst <= rtol * scale,
                         f"max abs difference {worst:.3g} (scale {scale:.3g})")


def _sample_tokenizer(texts: Sequence[str]) -> objreg.Tokenizer:
    return train_wordpiece(list(texts) * 10, vocab_size=300, name="contract-suite")
