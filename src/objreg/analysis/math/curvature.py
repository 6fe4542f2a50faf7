"""Hessian-vector products of a scalar loss of the shared parameters.

:class:`Curvature`'s ``auto`` takes double backward first on CPU (measured faster there, with
less memory: docs/performance.md) and forward-over-reverse (``jvp`` of ``grad``, no second graph)
first elsewhere, each falling back to the other where a derivative is missing. :class:`Curvature`
gives the gradient and the Hessian-vector products of the downstream loss ``D`` (a mean over
chunks of the evaluation set) for several directions at once: forward-over-reverse ``vmap``s the
tangents, so the gradient pass is shared; double backward builds the gradient graph once per chunk
and differentiates it once per direction.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Protocol

import torch
from torch.func import grad, jvp, vmap

from objreg.analysis.math.functional import ObjectiveFunction, Params, requiring_grad
from objreg.analysis.math.per_sample import derivative_unsupported
from objreg.analysis.parallel.group import Group
from objreg.core.errors import InvalidParameterError


def hvp_forward_over_reverse(loss: Callable[[Params], torch.Tensor], shared: Params, direction: Params) -> Params:
    _, product = jvp(grad(loss), (shared,), (direction,))
    return product


def hvp_double_backward(loss: Callable[[Params], torch.Tensor], shared: Params, direction: Params) -> Params:
    params = requiring_grad(shared)
    grads = torch.autograd.grad(loss(params), list(params.values()), create_graph=True)
    projected = sum((g * direction[n]).sum() for g, n in zip(grads, params))
    products = torch.autograd.grad(projected, list(params.values()), allow_unused=True)
    return {n: torch.zeros_like(t) if h is None else h for (n, t), h in zip(params.items(), products)}


#: Every Hessian-vector product method with one line saying what it does: the one list that
#: validation, the probe, ``objreg analyze --help`` and docs/cli.md read.
HVP_METHODS: dict[str, str] = {
    "auto": "double_backward first on the CPU, forward_over_reverse first elsewhere, the other one where the "
            "model lacks the first one's derivatives",
    "forward_over_reverse": "jvp of grad, no second graph",
    "double_backward": "differentiate the gradient graph again",
}


class Curvature:
    """Gradient and Hessian-vector products of ``D(θ) = mean_i ℓ_i(θ)`` over the examples of
    ``functions`` (chunks of one evaluation set), at ``shared``.

    Args:
        functions: The chunks; their example counts weight them.
        shared: The point ``θ``.
        method: ``auto`` (double backward when ``shared`` is on the CPU, forward-over-reverse
            otherwise; the other where the first one's derivatives are missing),
            ``forward_over_reverse`` or ``double_backward``. After the first product,
            :attr:`method` names the one in use.
        max_directions: Directions pushed through one batched pass (bounds memory).
        total: Examples of the whole evaluation set (default: those of ``functions``). With
            several processes each holds its share of the chunks and ``total`` counts them all.
        group: The processes whose chunks add up to ``D``: the gradient and the products are
            summed over them (:mod:`objreg.analysis.parallel.group`; default: this process alone).
    """

    def __init__(
        self, functions: list[ObjectiveFunction], shared: Params, method: str = "auto", max_directions: int = 4,
        *, total: int | None = None, group: Group | None = None,
    ):
        if method not in HVP_METHODS:
            raise InvalidParameterError(f"HVP method must be one of {', '.join(HVP_METHODS)}, got {method!r}")
        self.functions = functions
        self.shared = shared
        self.method = method
        self.max_directions = max_directions
        self.total = sum(f.batch_size for f in functions) if total is None else total
        self.group = group if group is not None else Group()
        self.matvecs = 0

    def _chunk_loss(self, f: ObjectiveFunction) -> Callable[[Params], torch.Tensor]:
        return lambda params: f(params).sum() / self.total

    def gradient_and_products(self, directions: list[Params]) -> tuple[Params, list[Params]]:
        """``∇D`` and ``[H v for v in directions]``.

        Raises:
            InvalidParameterError: the model has neither derivative an exact HVP needs.
        """
        gradient, totals = self._with_method(directions, lambda: _Totals(self.shared, len(directions)))
        products = totals.products if self.functions else [
            {n: torch.zeros_like(t) for n, t in self.shared.items()} for _ in directions]
        # One collective for the gradient and every product (identity in one process).
        return self.group.all_reduce_sum((gradient, products))

    def gradient_and_dots(self, directions: list[Params], against: list[list[Params]], keep: Collection[str] = ()
                          ) -> tuple[Params, torch.Tensor, list[Params]]:
        """``∇D``, the dots ``⟨a, H v_k⟩`` for every ``a`` in ``against[k]`` (a float64 tensor
        ``[k, j]``; ``a`` may name a subset of the parameters) and the products' entries named in
        ``keep``, without ever holding a whole product: each chunk's product along each direction
        is dotted (and its kept entries added) as it is made, then let go.

        Raises:
            InvalidParameterError: the model has neither derivative an exact HVP needs.
        """
        gradient, dots = self._with_method(directions, lambda: _Dots(self.shared, against, keep))
        return self.group.all_reduce_sum((gradient, dots.values, dots.kept))

    def _with_method(self, directions: list[Params], new_sink: Callable[[], Sink]) -> tuple[Params, Sink]:
        """The gradient and a sink (``new_sink()``, a fresh one for each method tried) that was
        handed each chunk's product along direction ``k`` as ``sink.add(k, product)``."""
        if self.method == "auto":
            # On the CPU double backward is the faster and the lighter in memory (docs/performance.md);
            # elsewhere forward-over-reverse is.
            on_cpu = all(t.device.type == "cpu" for t in self.shared.values())
            first, second = ("double_backward", "forward_over_reverse") if on_cpu else (
                "forward_over_reverse", "double_backward")
            try:
                sink = new_sink()
                result = self._compute(directions, first, sink.add)
                self.method = first
                return result, sink
            except (NotImplementedError, RuntimeError) as error:
                if not derivative_unsupported(error):
                    raise
            try:
                sink = new_sink()
                result = self._compute(directions, second, sink.add)
            except (NotImplementedError, RuntimeError) as error:
                if not derivative_unsupported(error):
                    raise
                raise InvalidParameterError(
                    f"Hessian-vector products need forward-mode or double-backward derivatives, and this model "
                    f"has neither ({str(error).splitlines()[0]}); use attention that has them (a Hugging Face model: "
                    f"attn_implementation=\"eager\"; objreg's Transformer: attention='math')"
                ) from None
            self.method = second
            return result, sink
        sink = new_sink()
        return self._compute(directions, self.method, sink.add), sink

    def matvec(self, direction: Params) -> Params:
        """``H v`` for one direction."""
        return self.gradient_and_products([direction])[1][0]

    def _compute(self, directions: list[Params], method: str, sink: Callable[[int, Params], None]) -> Params:
        gradient: Params = {}
        for f in self.functions:
            loss = self._chunk_loss(f)
            take = self._forward_over_reverse if method == "forward_over_reverse" else self._double_backward
            part = take(loss, directions, sink)
            # The sum starts as the first chunk's part arrives, and each part is let go once added.
            for n, t in self.shared.items():
                gradient[n] = (gradient[n] if n in gradient else torch.zeros_like(t)).add_(part.pop(n))
        if not self.functions:
            gradient = {n: torch.zeros_like(t) for n, t in self.shared.items()}
        self.matvecs += len(directions)
        return gradient

    def _forward_over_reverse(self, loss: Callable[[Params], torch.Tensor], directions: list[Params],
                              sink: Callable[[int, Params], None]) -> Params:
        if not directions:
            return grad(loss)(self.shared)
        gradient: Params = {}
        for start in range(0, len(directions), self.max_directions):
            group = directions[start:start + self.max_directions]
            if len(group) == 1:
                gradient, product = jvp(grad(loss), (self.shared,), (group[0],))
                sink(start, product)
                continue
            stacked = {n: torch.stack([d[n] for d in group]) for n in self.shared}
            batched_gradient, batched = vmap(lambda v: jvp(grad(loss), (self.shared,), (v,)))(stacked)
            gradient = {n: t[0] for n, t in batched_gradient.items()}
            for i in range(len(group)):
                sink(start + i, {n: t[i] for n, t in batched.items()})
        return gradient

    def _double_backward(self, loss: Callable[[Params], torch.Tensor], directions: list[Params],
                         sink: Callable[[int, Params], None]) -> Params:
        params = requiring_grad(self.shared)
        leaves = list(params.values())
        grads = torch.autograd.grad(loss(params), leaves, create_graph=True, allow_unused=True)
        gradient = {n: torch.zeros_like(t) if g is None else g.detach() for (n, t), g in zip(params.items(), grads)}
        for i, direction in enumerate(directions):
            projected = sum((g * direction[n]).sum() for g, n in zip(grads, params) if g is not None)
            if not isinstance(projected, torch.Tensor) or not projected.requires_grad:
                sink(i, {n: torch.zeros_like(t) for n, t in params.items()})
                continue
            parts = torch.autograd.grad(projected, leaves, retain_graph=i < len(directions) - 1, allow_unused=True)
            sink(i, {n: torch.zeros_like(t) if h is None else h for (n, t), h in zip(params.items(), parts)})
        return gradient


class Sink(Protocol):
    """Takes each chunk's product along direction ``k`` as it is made."""

    def add(self, k: int, part: Params) -> None: ...


class _Totals:
    """The products summed over the chunks, each sum started as its first part arrives."""

    def __init__(self, shared: Params, count: int):
        self.shared = shared
        self.products: list[Params] = [{} for _ in range(count)]

    def add(self, k: int, part: Params) -> None:
        total = self.products[k]
        for n, t in self.shared.items():
            total[n] = (total[n] if n in total else torch.zeros_like(t)).add_(part.pop(n))


class _Dots:
    """The products' dots with the ``against`` vectors summed over the chunks, and their entries
    named in ``keep``. Each dot is accumulated in float64 whatever the products' dtype."""

    def __init__(self, shared: Params, against: list[list[Params]], keep: Collection[str]):
        self.against = against
        like = next(iter(shared.values()))
        self.values = torch.zeros(len(against), max((len(a) for a in against), default=0), dtype=torch.float64,
                                  device=like.device)
        self.kept = [{n: torch.zeros_like(shared[n]) for n in keep} for _ in against]

    def add(self, k: int, part: Params) -> None:
        for j, vector in enumerate(self.against[k]):
            self.values[k, j] += sum((vector[n] * part[n]).sum(dtype=torch.float64) for n in vector)
        for n, total in self.kept[k].items():
            total.add_(part[n])
