"""The objective contract suite, for built-ins and third-party plugins alike.

    from objreg.testing import check_objective_contract

    def test_my_objective_keeps_the_contract():
        check_objective_contract("myobjective")

It runs the objective on a tiny model in float64 and checks: corruption is deterministic for a
generator seed and differs across seeds; shapes; the attention mask is bool ``[B, T, T]``, never
attends to padding, and is causal where the objective says so; per-sample losses are finite and
``[B]``; per-sample dots from one ``jvp`` equal a per-example reverse-mode loop; ``vmap(grad)``
equals the loop (except for batch-coupled losses); forward-over-reverse HVPs equal double backward.
Every failed check is reported, in one :class:`ContractError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

import objreg
from objreg.analysis.curvature import hvp_double_backward, hvp_forward_over_reverse
from objreg.analysis.functional import ObjectiveFunction, detached, shared_parameters
from objreg.analysis.per_sample import dots_jvp, dots_loop, dots_vmap
from objreg.core.registry import merge_heads
from objreg.core.tokenizer import train_wordpiece

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
) -> list[str]:
    """Run every contract check on the pre-training objective ``name``.

    Returns:
        The names of the checks that ran (all passed).

    Raises:
        ContractError: listing every check that failed, with the objective and its origin.
    """
    registry = registry or objreg.Registry.load()
    tokenizer = tokenizer or _sample_tokenizer(texts)
    objective = registry.get(name, vocab=tokenizer.vocab, **(params or {}))
    where = f"objective {name!r} ({registry.origin(name)})"
    problems: list[str] = []
    passed: list[str] = []

    def check(label: str, ok: bool, detail: str = "") -> None:
        (passed.append(label) if ok else problems.append(f"{label}: {detail}" if detail else label))

    tokens = tokenizer.batch_from_texts(list(texts), seq_len)
    # Reseed the global RNG between the calls: output that follows it instead of the given
    # generator shows up as a difference.
    with torch.random.fork_rng():
        torch.manual_seed(seed + 1)
        first = objective.corrupt(tokens, torch.Generator().manual_seed(seed))
        torch.manual_seed(seed + 2)
        again = objective.corrupt(tokens, torch.Generator().manual_seed(seed))
    check("corrupt is deterministic for a generator seed and ignores the global RNG", _same_batch(first, again))
    B, T = first.input_ids.shape
    shapes_ok = all(t.shape == (B, T) for t in first[:5]) and all(t.shape[0] == B for t in first.extras.values())
    check("corrupted fields are [B, T] and extras have B first", shapes_ok,
          f"input_ids {tuple(first.input_ids.shape)}, fields {[tuple(t.shape) for t in first[:5]]}")

    mask = objective.attention_mask(first)
    padding_keys = first.is_padding[:, None, :].expand_as(mask)
    check("the mask never attends to padding", not bool((mask & padding_keys).any()))
    if objective.info.attention == "causal":
        future = torch.ones(T, T, dtype=torch.bool).triu(1)
        check("a causal mask never attends to the future", not bool((mask & future).any()))

    heads = merge_heads([objective.info])
    built = registry.load_model(model, tokenizer.vocab, heads, dict(model_config or TINY_MODEL),
                                torch.Generator().manual_seed(seed))
    built = built.to(torch.float64)
    function = ObjectiveFunction(built, objective, first)
    shared = detached(shared_parameters(built))
    losses = function(shared)
    check("per-sample losses are finite and [B]", losses.shape == (B,) and bool(torch.isfinite(losses).all()),
          f"shape {tuple(losses.shape)}, values {losses.tolist()}")

    generator = torch.Generator().manual_seed(seed)
    direction = {n: torch.randn(t.shape, generator=generator, dtype=t.dtype) for n, t in shared.items()}
    reference = dots_loop(function, shared, direction)
    forward = dots_jvp(function, shared, direction)
    check("per-sample dots from jvp equal the per-example loop", _close(forward, reference, rtol),
          f"max abs difference {float((forward - reference).abs().max()):.3g}")
    if not objective.info.batch_coupled:
        mapped = dots_vmap(function, shared, direction)
        check("vmap(grad) per-sample gradients equal the loop", _close(mapped, reference, rtol),
              f"max abs difference {float((mapped - reference).abs().max()):.3g}")
    fwd_rev = hvp_forward_over_reverse(function.mean, shared, direction)
    rev_rev = hvp_double_backward(function.mean, shared, direction)
    worst = max(float((fwd_rev[n] - rev_rev[n]).abs().max()) for n in shared)
    scale = max(float(rev_rev[n].abs().max()) for n in shared)
    check("forward-over-reverse HVP equals double backward", worst <= rtol * max(scale, 1.0),
          f"max abs difference {worst:.3g} (scale {scale:.3g})")

    if problems:
        raise ContractError([f"{where} failed: {p}" for p in problems])
    return passed


def _sample_tokenizer(texts: Sequence[str]) -> objreg.Tokenizer:
    return train_wordpiece(list(texts) * 10, vocab_size=300, name="contract-suite")
