"""What the objective and task contract suites share: the sample texts and the tiny model they run
on, :class:`ContractError`, the collector of passed and failed checks (a check whose code raises
fails with the error, reworded by :func:`raised` where the hook is not transform-safe), and the
checks both suites run: the attention mask against its declared pattern and padding, a row's loss
alone and in the batch, and the analyzer's Hessian-vector products against double backward.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

import objreg
from objreg.analysis.math.curvature import Curvature, hvp_double_backward
from objreg.analysis.math.functional import ObjectiveFunction
from objreg.core.masks import AttentionMask
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


def close(a: torch.Tensor, b: torch.Tensor, rtol: float, atol: float = 1e-10) -> bool:
    return bool(torch.allclose(a, b, rtol=rtol, atol=atol))


def same_batch(a: objreg.CorruptedBatch, b: objreg.CorruptedBatch) -> bool:
    if a.extras.keys() != b.extras.keys():
        return False
    pairs = [*zip(a[:5], b[:5]), *((a.extras[k], b.extras[k]) for k in a.extras)]
    return all(x.shape == y.shape and torch.equal(x, y) for x, y in pairs)


def difference(a: torch.Tensor, b: torch.Tensor) -> str:
    return f"max abs difference {float((a - b).abs().max()):.3g}"


class Checks:
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


def check_attention(objective: objreg.Objective, batch: objreg.CorruptedBatch, checks: Checks) -> None:
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


def check_rows_alone(function: ObjectiveFunction, shared: dict[str, torch.Tensor], losses: torch.Tensor,
                      rtol: float, checks: Checks) -> None:
    batch = function.batch
    alone = torch.stack([function.losses(shared, batch.select([i]), function.mask[i : i + 1])[0]
                         for i in range(batch.batch_size)])
    checks.check("a row's loss does not depend on the other rows of the batch", close(alone, losses, rtol),
                 f"rows interact ({difference(alone, losses)} between each row alone and in the batch), but "
                 f"ObjectiveInfo.batch_coupled is False: declare batch_coupled=True (per-example gradients "
                 f"and ghost dots assume independent rows), or make each row's loss its own")


def check_hvps(function: ObjectiveFunction, shared: dict[str, torch.Tensor], direction: dict[str, torch.Tensor],
                rtol: float, checks: Checks) -> None:
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


def sample_tokenizer(texts: Sequence[str]) -> objreg.Tokenizer:
    return train_wordpiece(list(texts) * 10, vocab_size=300, name="contract-suite")
