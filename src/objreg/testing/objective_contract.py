"""The objective contract: :func:`check_objective_contract` runs a pre-training objective on a tiny
model in float64 and checks what ``objreg analyze`` relies on:

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

``objreg analyze`` runs the cheap checks (:func:`contract_problems`) on every objective that is not
built in (:func:`is_third_party`) before training, and warns in one line when one fails.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

import objreg
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
    tokenizer = tokenizer or sample_tokenizer(texts)
    checks = Checks()
    objective = registry.get(name, vocab=tokenizer.vocab, **(params or {}))
    tokens = tokenizer.batch_from_texts(list(texts), seq_len)
    first = checks.run("corrupt", lambda: _check_corruption(objective, tokens, seed, checks))
    if first is not None:
        checks.run("attention", lambda: check_attention(objective, first, checks))
        checks.run("losses and gradients", lambda: _check_gradients(
            registry, objective, tokenizer, first, model, model_config, seed, rtol, checks, quick))
    return checks.passed, checks.problems


def is_third_party(registry: objreg.Registry, name: str) -> bool:
    """Whether objective ``name`` comes from anywhere but objreg's built-ins (an installed plugin,
    or one registered at run time)."""
    return registry.origin(name) != BUILTIN_DISTRIBUTION


def _check_corruption(
    objective: objreg.Objective, tokens: objreg.TokenBatch, seed: int, checks: Checks
) -> objreg.CorruptedBatch:
    # Reseed the global RNG between the calls: output that follows it instead of the given
    # generator shows up as a difference.
    with torch.random.fork_rng():
        torch.manual_seed(seed + 1)
        first = objective.corrupt(tokens, torch.Generator().manual_seed(seed))
        torch.manual_seed(seed + 2)
        again = objective.corrupt(tokens, torch.Generator().manual_seed(seed))
    checks.check("corrupt is deterministic for a generator seed and ignores the global RNG", same_batch(first, again))
    if _takes_generator(objective):
        others = [objective.corrupt(tokens, torch.Generator().manual_seed(seed + k)) for k in range(1, 4)]
        checks.check("corrupt draws from its generator: other seeds give other corruptions",
                     not all(same_batch(first, other) for other in others),
                     "four seeds gave the same batch although the hook takes a generator")
    B, T = first.input_ids.shape
    shapes_ok = all(t.shape == (B, T) for t in first[:5]) and all(t.shape[0] == B for t in first.extras.values())
    checks.check("corrupted fields are [B, T] and extras have B first", shapes_ok,
                 f"input_ids {tuple(first.input_ids.shape)}, fields {[tuple(t.shape) for t in first[:5]]}")
    return first


def _takes_generator(objective: objreg.Objective) -> bool:
    return any("generator" in impl.argnames for impl in objective._hooks["objreg_corrupt"].get_hookimpls())


def _check_gradients(
    registry: objreg.Registry, objective: objreg.Objective, tokenizer: objreg.Tokenizer,
    batch: objreg.CorruptedBatch, model: str, model_config: dict[str, Any] | None, seed: int, rtol: float,
    checks: Checks, quick: bool = False,
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
        check_rows_alone(function, shared, losses, rtol, checks)

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
        checks.check(f"per-sample dots by {method} equal the per-example loop", close(dots, reference, rtol),
                     difference(dots, reference))
    chosen = checks.run("per-sample dots by auto", lambda: per_sample_dots(function, shared, direction, "auto"))
    if chosen is not None:
        checks.check(f"per-sample dots as objreg analyze takes them ({chosen[1]}) equal the loop",
                     close(chosen[0], reference, rtol), difference(chosen[0], reference))

    if not quick:
        check_hvps(function, shared, direction, rtol, checks)
