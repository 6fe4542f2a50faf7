"""What a loss's autograd graph tells about the measured parameters: which of them the loss
depends on, and which a node made outside every call of their owning module uses (riding dots
cannot see those: :meth:`objreg.analysis.math.riding.RidingDots.unseen`).
"""

from __future__ import annotations

from typing import Any

import torch


def sequence_now() -> int:
    """The autograd sequence number the next node created here gets (read off a node made for it)."""
    return torch.zeros((), requires_grad=True).mul(1).grad_fn._sequence_nr()


def depends_on(losses: torch.Tensor, measured: dict[int, str],
                spans: list[tuple[int, int, frozenset[str]]] | None = None) -> tuple[set[str], set[str]]:
    """The measured parameters (``id`` → name) among the leaves of ``losses``' autograd graph, and
    (with ``spans``) those of them a node created outside every span of their owners uses."""
    found: set[str] = set()
    outside: set[str] = set()
    seen: set[Any] = set()
    stack = [losses.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        variable = getattr(node, "variable", None)  # an AccumulateGrad node: a leaf
        if variable is not None and id(variable) in measured:
            found.add(measured[id(variable)])
        for next_node, _ in node.next_functions:
            leaf = getattr(next_node, "variable", None)
            if spans is not None and leaf is not None and id(leaf) in measured:
                name, number = measured[id(leaf)], node._sequence_nr()
                if not any(start < number < end and name in names for start, end, names in spans):
                    outside.add(name)
            stack.append(next_node)
    return found, outside
