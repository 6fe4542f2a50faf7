"""Per-sample quantities: ⟨∇ℓ_i, v⟩ for every example, and per-sample gradients.

Three exact ways to get all B dot products without materialising a per-sample gradient:

* ``jvp``: ONE forward-mode pass of the per-sample loss vector. ``jvp(ℓ, θ, v)`` returns ``J v``
  with ``J = ∂ℓ/∂θ`` of shape ``[B, P]``: exactly ``⟨∇ℓ_i, v⟩`` for each i. No graph is kept, so
  its peak memory is below that of one ordinary backward. Right for batch-coupled losses too
  (it differentiates ℓ_i as computed on the whole batch).
* ``ghost``: one forward and one reverse pass that computes no weight gradient
  (:mod:`objreg.analysis.math.ghost`); never for batch-coupled losses.
* ``double_backward``: two reverse passes (``g(u) = Jᵀu`` is linear in a dummy ``u``, so
  ``∂⟨g(u), v⟩/∂u = J v``), for models without forward mode.

``auto`` tries them fastest first (``python -m benchmarks.alignment``, docs/performance.md):
``ghost`` (batch-coupled losses skip it), then ``jvp``, ``double_backward`` and the per-example
``loop``, moving on only when the model lacks what a method needs. ``vmap(grad)`` and the loop
are kept as independent references and for the quantities that need the gradients themselves,
optionally projected to ``k`` dimensions (Johnson–Lindenstrauss) so memory stays O(B·k).

Ghost dots are exact only where the model keeps the rows of a batch apart, which it cannot check
for itself (a relative-position bias ``[T, T, h]`` looks like a batch when ``T = B``), so the
probe compares them once with an independent method (:class:`GhostChecks`) and uses that method
where they disagree. :func:`per_sample_dots_and_norms` also gives every example's squared
gradient norm ``‖∇ℓ_i‖²`` (the noise of a batch's mean gradient): from ghost's own pass where its
rules cover the model, else from per-example gradients.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch.func import grad, jacrev, jvp, vmap

from objreg.analysis.math.functional import ObjectiveFunction, Params, requiring_grad
from objreg.analysis.math.ghost import dots_and_norms_ghost, dots_ghost, dots_ghost_many
from objreg.core.errors import InvalidParameterError

#: Every per-sample method with one line saying what it does: the one list that validation, the
#: probe, ``objreg analyze --help`` and docs/cli.md read.
METHODS: dict[str, str] = {
    "auto": "the first of ghost, jvp, double_backward and loop that the model supports, ghost skipped for "
            "batch-coupled objectives",
    "ghost": "one forward and one input-gradient backward pass, no per-example weight gradient",
    "jvp": "one forward-mode pass",
    "double_backward": "two reverse passes",
    "vmap": "per-example gradients with vmap(grad), a reference whose memory grows with the batch",
    "loop": "one backward pass per example, the reference",
}


def dots_jvp(fn: ObjectiveFunction, shared: Params, direction: Params) -> torch.Tensor:
    """``[B]``: one forward-mode pass."""
    _, tangent = jvp(fn, (shared,), (direction,))
    return tangent


def dots_double_backward(fn: ObjectiveFunction, shared: Params, direction: Params) -> torch.Tensor:
    """``[B]``: two reverse passes, for models without forward-mode support."""
    params = requiring_grad(shared)
    losses = fn(params)
    dummy = torch.zeros_like(losses, requires_grad=True)
    vjp = torch.autograd.grad(losses, list(params.values()), grad_outputs=dummy, create_graph=True)
    projected = sum((g * direction[n]).sum() for g, n in zip(vjp, params))
    return torch.autograd.grad(projected, dummy)[0]


def dots_loop(fn: ObjectiveFunction, shared: Params, direction: Params) -> torch.Tensor:
    """``[B]``: one backward per example of ``ℓ_i`` computed on the whole batch (the reference;
    also right for batch-coupled losses)."""
    params = requiring_grad(shared)
    losses = fn(params)
    dots = []
    for i in range(losses.shape[0]):
        grads = torch.autograd.grad(losses[i], list(params.values()), retain_graph=True, allow_unused=True)
        dots.append(sum((g * direction[n]).sum() for g, n in zip(grads, params) if g is not None))
    return torch.stack([torch.as_tensor(d, dtype=losses.dtype, device=losses.device) for d in dots])


# -- per-sample gradients ---------------------------------------------------------------------------


def per_sample_grads(fn: ObjectiveFunction, shared: Params, chunk_size: int | None = None) -> Params:
    """Per-sample gradients ``{name: [B, *shape]}``; memory grows as B × P.

    Uncoupled losses: ``vmap(grad)`` over batches of one. Batch-coupled losses: the rows of the
    Jacobian of ℓ on the whole batch (``jacrev``): ``∇ℓ_i`` with ℓ_i computed on the whole batch.
    ``chunk_size`` bounds the transient memory of either.
    """
    if fn.objective.info.batch_coupled:
        return jacrev(fn, chunk_size=chunk_size)(shared)
    per_example = vmap(grad(fn.example_loss), in_dims=(None, 0, None if fn.mask is None else 0), chunk_size=chunk_size)
    return per_example(shared, fn.batch, fn.mask)


def dots_vmap(fn: ObjectiveFunction, shared: Params, direction: Params) -> torch.Tensor:
    grads = per_sample_grads(fn, shared)
    return sum((g * direction[n]).flatten(1).sum(1) for n, g in grads.items())  # type: ignore[return-value]


class GaussianProjection:
    """A Johnson–Lindenstrauss map ``Π: R^P → R^k``, ``Π = G / √k`` with ``G`` i.i.d. N(0, 1), so
    ``E⟨Πa, Πb⟩ = ⟨a, b⟩``.

    ``Π`` is never held whole: it is regenerated in row blocks of at most ``block_rows`` from seeds
    drawn once from ``generator``, so the same generator state gives the same map (on one device
    type) and memory stays O(block_rows · k).
    """

    def __init__(self, shapes: dict[str, torch.Size], k: int, generator: torch.Generator, block_rows: int = 4096):
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise InvalidParameterError(f"projection dimension k must be a positive integer, got {k!r}")
        self.k = k
        self.block_rows = block_rows
        self.sizes = {n: math.prod(s) for n, s in shapes.items()}
        self.seeds = {n: int(torch.randint(0, 2**62, (1,), generator=generator)) for n in shapes}

    def blocks(self, name: str, dtype: torch.dtype, device: torch.device) -> Iterator[tuple[slice, torch.Tensor]]:
        """``(rows, Π_rowsᵀ)`` pairs covering parameter ``name``: each matrix is ``[len(rows), k]``."""
        size = self.sizes[name]
        for index, start in enumerate(range(0, size, self.block_rows)):
            stop = min(start + self.block_rows, size)
            block_generator = torch.Generator(device=device).manual_seed(self.seeds[name] + index)
            block = torch.randn(stop - start, self.k, generator=block_generator, dtype=dtype, device=device)
            yield slice(start, stop), block / math.sqrt(self.k)

    def __call__(self, vectors: Params) -> torch.Tensor:
        """``[N, k]`` for ``vectors`` ``{name: [N, *shape]}`` (per-sample gradients of N examples)."""
        first = next(iter(vectors.values()))
        out = torch.zeros(first.shape[0], self.k, dtype=first.dtype, device=first.device)
        for name, tensor in vectors.items():
            flat = tensor.reshape(tensor.shape[0], -1)
            for rows, block in self.blocks(name, flat.dtype, flat.device):
                out.addmm_(flat[:, rows], block)
        return out


def projected_per_sample_grads(
    fn: ObjectiveFunction, shared: Params, k: int, generator: torch.Generator, chunk_size: int = 8
) -> torch.Tensor:
    """``[B, k]``: per-sample gradients projected by one :class:`GaussianProjection`, computed
    ``chunk_size`` examples at a time, so memory is O(chunk_size · P + B · k), never O(B · P).

    For pairwise similarities and variances of per-sample gradients on large models; inner products
    are preserved up to a relative error of about ``√(2/k)``.
    """
    projection = GaussianProjection({n: t.shape for n, t in shared.items()}, k, generator)
    if fn.objective.info.batch_coupled:  # ℓ_i needs the whole batch: chunk the Jacobian rows instead
        rows = [projection(part) for part in _coupled_grad_chunks(fn, shared, chunk_size)]
    else:
        rows = [projection(per_sample_grads(part, shared)) for part in fn.chunks(chunk_size)]
    return torch.cat(rows)


def _coupled_grad_chunks(fn: ObjectiveFunction, shared: Params, chunk_size: int) -> Iterator[Params]:
    """Rows of ``∂ℓ/∂θ`` on the whole batch, ``chunk_size`` at a time (one batched vjp each)."""
    params = requiring_grad(shared)
    losses = fn(params)
    eye = torch.eye(fn.batch_size, dtype=losses.dtype, device=losses.device)
    for start in range(0, fn.batch_size, chunk_size):
        cotangents = eye[start : start + chunk_size]
        grads = torch.autograd.grad(
            losses,
            list(params.values()),
            grad_outputs=cotangents,
            retain_graph=True,
            is_grads_batched=True,
            allow_unused=True,
        )
        yield {
            n: torch.zeros(len(cotangents), *t.shape, dtype=t.dtype, device=t.device) if g is None else g
            for (n, t), g in zip(params.items(), grads)
        }


# -- the entry point --------------------------------------------------------------------------------


def derivative_unsupported(error: Exception) -> bool:
    """Whether ``error`` says an operation lacks the derivative asked for (forward mode, or a
    backward of a backward), as opposed to a real bug that must surface."""
    text = str(error).lower()
    return isinstance(error, NotImplementedError) or any(
        phrase in text for phrase in ("forward ad", "forward-mode", "jvp", "is not implemented", "not implemented for")
    )


_COMPUTE = {
    "jvp": dots_jvp,
    "ghost": dots_ghost,
    "double_backward": dots_double_backward,
    "vmap": dots_vmap,
    "loop": dots_loop,
}


def per_sample_dots(
    fn: ObjectiveFunction, shared: Params, direction: Params, method: str = "auto"
) -> tuple[torch.Tensor, str]:
    """``⟨∇ℓ_i, direction⟩`` for every example, and the method that computed it.

    ``auto`` tries, fastest first as measured by ``benchmarks.alignment`` (docs/performance.md):
    ``ghost`` (one forward + one input-gradient backward; never for batch-coupled losses), ``jvp``
    (one forward-mode pass), ``double_backward`` (two reverse passes) and the per-example ``loop``
    (B backward passes), moving on only when the model lacks what a method needs (fused attention
    kernels have no forward mode nor double backward, but ghost dots run through them).
    """
    if method not in METHODS and method != "auto_without_ghost":
        raise InvalidParameterError(f"per-sample method must be one of {', '.join(METHODS)}, got {method!r}")
    if method not in ("auto", "auto_without_ghost"):
        return _COMPUTE[method](fn, shared, direction), method
    candidates = ["ghost", "jvp", "double_backward"]
    if fn.objective.info.batch_coupled or method == "auto_without_ghost":  # the reference ghost is checked against
        candidates.remove("ghost")
    for name in candidates:
        try:
            return _COMPUTE[name](fn, shared, direction), name
        except (NotImplementedError, RuntimeError) as error:
            if not derivative_unsupported(error):
                raise
    return dots_loop(fn, shared, direction), "loop"


def per_sample_dots_many(
    fn: ObjectiveFunction, shared: Params, directions: list[Params], method: str = "auto"
) -> tuple[list[torch.Tensor], str]:
    """:func:`per_sample_dots` for several directions: ``ghost`` gives them all from one forward
    and backward pass; every other method takes one pass per direction."""
    if method not in METHODS:
        raise InvalidParameterError(f"per-sample method must be one of {', '.join(METHODS)}, got {method!r}")
    if method == "ghost" or (method == "auto" and not fn.objective.info.batch_coupled):
        try:
            return dots_ghost_many(fn, shared, directions), "ghost"
        except (NotImplementedError, RuntimeError) as error:
            if method == "ghost" or not derivative_unsupported(error):
                raise
    first, used = per_sample_dots(fn, shared, directions[0], method)
    return [first, *(per_sample_dots(fn, shared, d, used)[0] for d in directions[1:])], used


# -- ghost checked, and squared norms ---------------------------------------------------------------


def per_sample_sq_norms(fn: ObjectiveFunction, shared: Params, chunk_size: int = 4) -> torch.Tensor:
    """``[B]``: every example's ``‖∇ℓ_i‖²`` from its gradient: ``vmap(grad)`` over chunks of
    ``chunk_size`` examples (batch-coupled losses: chunks of the Jacobian's rows), else one
    backward per example of ``ℓ_i`` computed on the whole batch (any model and batch)."""
    try:
        if fn.objective.info.batch_coupled:
            parts = list(_coupled_grad_chunks(fn, shared, chunk_size))
        else:
            parts = [per_sample_grads(part, shared) for part in fn.chunks(chunk_size)]
        return torch.cat([sum((g.flatten(1).double() ** 2).sum(1) for g in part.values()) for part in parts])
    except (NotImplementedError, RuntimeError, AttributeError, TypeError):
        pass  # a model vmap cannot run, or a batch that cannot be sliced: one backward per example
    params = requiring_grad(shared)
    losses = fn(params)
    out = []
    for i in range(losses.shape[0]):
        grads = torch.autograd.grad(losses[i], list(params.values()), retain_graph=True, allow_unused=True)
        out.append(sum(float((g.double() ** 2).sum()) for g in grads if g is not None))
    return torch.tensor(out, dtype=torch.float64, device=losses.device)


def _shapes(value: Any) -> list[tuple[int, ...]]:
    """The shapes of every tensor in a batch (tensors, tuples, lists, dicts, named tuples)."""
    if isinstance(value, torch.Tensor):
        return [tuple(value.shape)]
    if isinstance(value, Mapping):
        return [s for v in value.values() for s in _shapes(v)]
    if isinstance(value, (tuple, list)):
        return [s for v in value for s in _shapes(v)]
    return []


class GhostChecks:
    """Ghost's comparison with an independent method (``jvp``, else ``double_backward``, else the
    per-example ``loop``): once per model and objective, and again for every batch shape in which
    a dimension other than the first equals the batch size (where a tensor shared by the rows, a
    position table or a relative-position bias, passes ghost's test of a batch-first output).
    Where they disagree, ``auto`` uses the other method for that model and objective (for that
    shape) from then on, and a warning says so; :attr:`failures` lists them."""

    def __init__(self) -> None:
        self.verdicts: dict[tuple, str | None] = {}  # key → None (agreed) or the method used instead
        self.failures: list[dict[str, Any]] = []

    def key(self, fn: ObjectiveFunction) -> tuple:
        shapes = _shapes(fn.batch)
        coincidence = any(size == fn.batch_size for shape in shapes for size in shape[1:])
        return (id(fn.model), fn.objective.name, tuple(shapes) if coincidence else None)

    def instead(self, fn: ObjectiveFunction) -> str | None:
        """The method that replaced ghost for this call's model, objective and shape (None: ghost)."""
        return self.verdicts.get(self.key(fn))

    def due(self, fn: ObjectiveFunction) -> bool:
        return self.key(fn) not in self.verdicts

    def compare(self, fn: ObjectiveFunction, shared: Params, direction: Params, ghost: torch.Tensor
                ) -> tuple[torch.Tensor, str] | None:
        """Check ghost's dots with ``direction`` against the reference; None where they agree,
        else the reference's dots and method (recorded, and warned about)."""
        reference, method = per_sample_dots(fn, shared, direction, "auto_without_ghost")
        scale = float(reference.double().norm())
        difference = float((ghost.double() - reference.double()).norm())
        if not (math.isfinite(scale) and math.isfinite(difference)):
            return None  # a NaN direction (D diverged) decides nothing; the probe refuses it after

        tolerance = 1e4 * float(torch.finfo(reference.dtype).eps) if reference.is_floating_point() else 1e-3
        agree = difference <= tolerance * scale or (scale == 0 and difference == 0)
        self.verdicts[self.key(fn)] = None if agree else method
        if agree:
            return None
        failure = {"objective": fn.objective.name, "batch_shapes": _shapes(fn.batch), "method": method,
                   "relative_difference": difference / scale if scale > 0 else None}
        self.failures.append(failure)
        warnings.warn(
            f"ghost per-example dots of {fn.objective.name!r} differ from {method}'s by "
            f"{failure['relative_difference']:.3g} (relative) on batch shapes {failure['batch_shapes']}: the "
            f"model does not keep the rows apart where ghost assumes it does; using {method}", stacklevel=3)
        return reference, method


def per_sample_dots_and_norms(
    fn: ObjectiveFunction, shared: Params, directions: list[Params], method: str = "auto",
    checks: GhostChecks | None = None,
) -> tuple[list[torch.Tensor], torch.Tensor, str]:
    """:func:`per_sample_dots_many`, checked by ``checks`` where ghost gave them (``auto``: the
    other method where the check fails), and every example's squared gradient norm (from ghost's
    pass where its rules cover the model, else :func:`per_sample_sq_norms`); returns the dots,
    the norms and the method."""
    if method not in METHODS:
        raise InvalidParameterError(f"per-sample method must be one of {', '.join(METHODS)}, got {method!r}")
    dots, norms, used = None, None, None
    instead = checks.instead(fn) if checks is not None else None
    ghost_allowed = method == "ghost" or (method == "auto" and not fn.objective.info.batch_coupled and not instead)
    if ghost_allowed:
        try:
            dots, norms = dots_and_norms_ghost(fn, shared, directions)
            used = "ghost"
        except (NotImplementedError, RuntimeError) as error:
            if method == "ghost" or not derivative_unsupported(error):
                raise
        if used == "ghost" and checks is not None and checks.due(fn):
            replaced = checks.compare(fn, shared, directions[0], dots[0])
            if replaced is not None and method == "auto":
                reference, used = replaced
                dots = [reference, *(per_sample_dots(fn, shared, d, used)[0] for d in directions[1:])]
                norms = None
    if dots is None:
        start = instead or ("auto_without_ghost" if method == "auto" else method)
        first, used = per_sample_dots(fn, shared, directions[0], start)
        dots = [first, *(per_sample_dots(fn, shared, d, used)[0] for d in directions[1:])]
    if norms is None:
        norms = per_sample_sq_norms(fn, shared)
    return dots, norms, used
