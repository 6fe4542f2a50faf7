"""Per-sample quantities: ⟨∇ℓ_i, v⟩ for every example, and per-sample gradients.

Three exact ways to get all B dot products without materialising a per-sample gradient:

* ``jvp``: ONE forward-mode pass of the per-sample loss vector. ``jvp(ℓ, θ, v)`` returns ``J v``
  with ``J = ∂ℓ/∂θ`` of shape ``[B, P]``: exactly ``⟨∇ℓ_i, v⟩`` for each i. No graph is kept, so
  its peak memory is below that of one ordinary backward. Right for batch-coupled losses too
  (it differentiates ℓ_i as computed on the whole batch).
* ``ghost``: one forward and one reverse pass that computes no weight gradient. Every module
  owning shared parameters contributes ``Σ_t ⟨g_{i,t}, (∂y/∂θ_m · v_m)_{i,t}⟩``, its output
  gradient times the directional derivative of its output along its own parameters (for
  ``nn.Linear``: ``Σ_t g_{i,t}ᵀ V a_{i,t} + g_{i,t}ᵀ b_V``; embeddings and LayerNorm have their own
  rules; a tied weight gets a term at each use, which sums to its one gradient). Works with fused
  attention kernels (it needs first derivatives only). :class:`GhostDots` also rides along an
  ordinary training backward, so the update's own pass yields the dots too. It attributes gradient by the row it flows
  through, which is ∇ℓ_i only when the model treats rows independently and ℓ_i depends on its
  own row alone: never used for batch-coupled losses (``ObjectiveInfo.batch_coupled``).
* ``double_backward``: two reverse passes (``g(u) = Jᵀu`` is linear in a dummy ``u``, so
  ``∂⟨g(u), v⟩/∂u = J v``), for models without forward mode.

``auto`` picks by measurement (``python -m benchmarks.alignment``, docs/performance.md): ``ghost``
first (batch-coupled losses skip it), then ``jvp``, ``double_backward`` and the per-example
``loop``, moving on only when the model lacks what a method needs. ``vmap(grad)`` and the loop are kept as independent
references and for the quantities that need the gradients themselves, optionally projected to
``k`` dimensions (Johnson–Lindenstrauss) so memory stays O(B·k).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, jacrev, jvp, vmap

from objreg.analysis.functional import ObjectiveFunction, Params, requiring_grad
from objreg.core.errors import InvalidParameterError

METHODS = ("auto", "jvp", "ghost", "double_backward", "vmap", "loop")


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


# -- ghost dot products -----------------------------------------------------------------------------


class GhostUnsupportedError(NotImplementedError):
    """The model has a module the ghost rules cannot attribute per example (``auto`` moves on)."""


def _batched_dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``[B]``: ``⟨a_i, b_i⟩`` over every dimension but the first (``vecdot``: no ``a * b`` temporary)."""
    return torch.linalg.vecdot(a.flatten(1), b.flatten(1))


def _per_example_sum(g: torch.Tensor, trailing: int) -> torch.Tensor:
    """``g`` summed over every dimension between the batch and the last ``trailing`` ones."""
    return g.reshape(g.shape[0], -1, *g.shape[g.dim() - trailing :]).sum(1)


def _linear_dot(module: nn.Linear, x: torch.Tensor, g: torch.Tensor, d: dict[str, torch.Tensor]) -> torch.Tensor:
    """``Σ_t g_tᵀ (V x_t + b_V)``, with the matmul on whichever side gives the smaller product."""
    V, b = d.get("weight"), d.get("bias")
    if V is None:
        return _per_example_sum(g, 1) @ b
    if V.shape[0] <= V.shape[1]:
        return _batched_dot(F.linear(x, V, b), g)  # (B, ..., out): V x + b
    dots = _batched_dot(g @ V, x)  # (B, ..., in): Vᵀ g
    return dots if b is None else dots + _per_example_sum(g, 1) @ b


def _embedding_dot(
    module: nn.Embedding, ids: torch.Tensor, g: torch.Tensor, d: dict[str, torch.Tensor]
) -> torch.Tensor:
    tangent = F.embedding(ids, d["weight"])  # (B, ..., H): the rows of V the example looked up
    if module.padding_idx is not None:  # that row gets no gradient
        tangent = tangent.masked_fill((ids == module.padding_idx).unsqueeze(-1), 0.0)
    return _batched_dot(tangent, g)


def _layer_norm_dot(module: nn.LayerNorm, x: torch.Tensor, g: torch.Tensor, d: dict[str, torch.Tensor]) -> torch.Tensor:
    """``Σ_t g_t · (x̂_t ⊙ V_γ + V_β)``; x̂ is recomputed here rather than kept from the forward."""
    weight, bias = d.get("weight"), d.get("bias")
    if weight is None:
        return _per_example_sum(g, len(module.normalized_shape)).flatten(1) @ bias.flatten()
    normalised = F.layer_norm(x, module.normalized_shape, None, None, module.eps)
    tangent = normalised * weight if bias is None else torch.addcmul(bias, normalised, weight)
    return _batched_dot(tangent, g)


def _plain_embedding(module: nn.Module) -> bool:
    """An exact ``nn.Embedding`` whose gradient is plain row look-up (no renormalisation or scaling)."""
    return type(module) is nn.Embedding and module.max_norm is None and not module.scale_grad_by_freq


class GhostDots:
    """Per-example ``⟨∇ℓ_i, v⟩`` collected during whatever backward pass runs inside the block.

    Forward hooks on every module that owns a parameter named in ``direction`` give each call's
    output a tensor hook that turns its gradient into that module's per-example contribution.
    Used by :func:`dots_ghost`, or around an ordinary training step, so the update's own backward
    yields the dots as well (GhostSuite's "in-run" use)::

        with GhostDots(model, direction, batch_size) as ghost:
            grads = torch.autograd.grad(losses.mean(), params)  # the step's own backward
        dots = ghost.dots() * batch_size  # that backward was of the mean

    Args:
        model: The module whose calls run inside the block (``functional_call`` on it is fine).
        direction: ``v``, keyed like ``model.named_parameters()`` (a tied weight under the name
            that lists it); parameters it does not name contribute nothing.
        batch_size: ``B``; every hooked output must have it as its first dimension.

    The caller guarantees what ghost dots need: the model treats rows independently and ℓ_i
    depends on row i alone (never for ``ObjectiveInfo.batch_coupled``).
    """

    def __init__(self, model: nn.Module, direction: Params, batch_size: int):
        self.model = model
        self.direction = direction
        self.batch_size = batch_size
        self.roots: list[torch.Tensor] = []
        self.contributions: list[torch.Tensor] = []
        self._replaying = False
        self._handles: list[Any] = []

    def __enter__(self) -> GhostDots:
        owner_name = {id(p): n for n, p in self.model.named_parameters() if n in self.direction}  # tied: once
        for module in self.model.modules():
            params = module.named_parameters(recurse=False)
            own = {local: owner_name[id(p)] for local, p in params if id(p) in owner_name}
            if own:
                self._handles.append(module.register_forward_hook(self._hook(own), with_kwargs=True))
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def dots(self) -> torch.Tensor:
        """``[B]``: the contributions gathered so far (of the loss that was backpropagated)."""
        like = next(iter(self.direction.values()))
        total = torch.zeros(self.batch_size, dtype=like.dtype, device=like.device)
        for part in self.contributions:
            total = total + part.to(total.dtype)
        return total

    def _hook(self, own: dict[str, str]) -> Callable[..., Any]:
        def forward_hook(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
            if self._replaying:
                return None
            if not isinstance(output, torch.Tensor) or output.dim() == 0 or output.shape[0] != self.batch_size:
                raise GhostUnsupportedError(
                    f"ghost dots need every module owning shared parameters to return one batch-first tensor; "
                    f"{type(module).__name__} returned {type(output).__name__}"
                    f"{tuple(output.shape) if isinstance(output, torch.Tensor) else ''}"
                )
            if not output.requires_grad:  # nothing upstream is differentiated: start the graph here
                output = output.detach().requires_grad_()
                self.roots.append(output)
            d = {local: self.direction[name] for local, name in own.items()}
            # The values this call ran with (functional_call restores the originals before backward).
            values = {local: getattr(module, local) for local in own}
            output.register_hook(lambda g: self.contributions.append(self._dot(module, values, args, kwargs, g, d)))
            return output

        return forward_hook

    def _dot(
        self, module: nn.Module, values: Params, args: tuple, kwargs: dict, g: torch.Tensor, d: Params
    ) -> torch.Tensor:
        simple_call = len(args) == 1 and not kwargs
        if simple_call and type(module) is nn.Linear:
            return _linear_dot(module, args[0], g, d)
        if simple_call and type(module) is nn.LayerNorm:
            return _layer_norm_dot(module, args[0], g, d)
        if simple_call and _plain_embedding(module):
            return _embedding_dot(module, args[0], g, d)
        # Any other module: the directional derivative of its output along its own parameters.
        self._replaying = True
        try:
            _, tangent = jvp(lambda p: functional_call(module, p, args, kwargs), (values,), (d,))
        finally:
            self._replaying = False
        return _batched_dot(tangent, g)


def dots_ghost(fn: ObjectiveFunction, shared: Params, direction: Params) -> torch.Tensor:
    """``[B]``: one forward and one input-gradient-only backward (see the module docstring).

    Raises:
        InvalidParameterError: the objective couples the examples of a batch.
        GhostUnsupportedError: a module owning shared parameters does not map batch-first tensors.
    """
    if fn.objective.info.batch_coupled:
        raise InvalidParameterError(
            f"{fn.objective.name!r} couples the examples of a batch (in-batch negatives); ghost dot products "
            f"attribute gradient by row and are not ⟨∇ℓ_i, v⟩ there: use method='jvp'"
        )
    named = {n: direction[n] for n in shared}
    with GhostDots(fn.model, named, fn.batch_size) as ghost, torch.enable_grad():
        losses = fn({n: t.detach() for n, t in shared.items()})
        if ghost.roots and losses.requires_grad:
            # Only the roots are asked for, so autograd skips every weight gradient.
            torch.autograd.grad(losses.sum(), ghost.roots, allow_unused=True)
    return ghost.dots().to(losses.dtype)


# -- per-sample gradients ---------------------------------------------------------------------------


def per_sample_grads(fn: ObjectiveFunction, shared: Params, chunk_size: int | None = None) -> Params:
    """Per-sample gradients ``{name: [B, *shape]}``; memory grows as B × P.

    Uncoupled losses: ``vmap(grad)`` over batches of one. Batch-coupled losses: the rows of the
    Jacobian of ℓ on the whole batch (``jacrev``): ``∇ℓ_i`` with ℓ_i computed on the whole batch.
    ``chunk_size`` bounds the transient memory of either.
    """
    if fn.objective.info.batch_coupled:
        return jacrev(fn, chunk_size=chunk_size)(shared)
    per_example = vmap(grad(fn.example_loss), in_dims=(None, 0, 0), chunk_size=chunk_size)
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
    if method not in METHODS:
        raise InvalidParameterError(f"per-sample method must be one of {', '.join(METHODS)}, got {method!r}")
    if method != "auto":
        return _COMPUTE[method](fn, shared, direction), method
    candidates = ["ghost", "jvp", "double_backward"]
    if fn.objective.info.batch_coupled:
        candidates.remove("ghost")
    for name in candidates:
        try:
            return _COMPUTE[name](fn, shared, direction), name
        except (NotImplementedError, RuntimeError) as error:
            if not derivative_unsupported(error):
                raise
    return dots_loop(fn, shared, direction), "loop"
