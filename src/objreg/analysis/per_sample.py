"""Per-sample quantities: ⟨∇ℓ_i, v⟩ for every example, and per-sample gradients.

The default path computes all B dot products with ONE forward-mode ``jvp`` of the per-sample loss
vector: ``jvp(ℓ, θ, v)`` returns ``J v`` where ``J = ∂ℓ/∂θ`` is ``[B, P]``, i.e. exactly
``⟨∇ℓ_i, v⟩`` for each i, and no per-sample gradient is materialised. Where a model has no
forward-mode derivative (fused attention kernels), the same ``J v`` comes from two reverse passes
(the "double-backward trick": ``g(u) = Jᵀu`` is linear in a dummy ``u``, so ``∂⟨g(u), v⟩/∂u = J v``).

``vmap(grad)`` and the per-example loop are kept as independent references for tests and for the
quantities that need the gradients themselves.
"""

from __future__ import annotations

import torch
from torch.func import grad, jvp, vmap

from objreg.analysis.functional import ObjectiveFunction, Params, requiring_grad
from objreg.core.errors import InvalidParameterError

METHODS = ("auto", "jvp", "double_backward", "vmap", "loop")


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


def per_sample_grads(fn: ObjectiveFunction, shared: Params, chunk_size: int | None = None) -> Params:
    """Per-sample gradients ``{name: [B, *shape]}`` by ``vmap(grad)`` over batches of one.

    Memory grows as B × P; ``chunk_size`` bounds it. Not defined for batch-coupled losses, whose
    ℓ_i changes when the example is taken out of its batch.
    """
    if fn.objective.info.batch_coupled:
        raise InvalidParameterError(
            f"{fn.objective.name!r} couples the examples of a batch (in-batch negatives); per-sample "
            f"gradients from single-example batches are not its per-sample gradients: use method='jvp'"
        )
    per_example = vmap(grad(fn.example_loss), in_dims=(None, 0, 0), chunk_size=chunk_size)
    return per_example(shared, fn.batch, fn.mask)


def dots_vmap(fn: ObjectiveFunction, shared: Params, direction: Params) -> torch.Tensor:
    grads = per_sample_grads(fn, shared)
    return sum((g * direction[n]).flatten(1).sum(1) for n, g in grads.items())  # type: ignore[return-value]


def derivative_unsupported(error: Exception) -> bool:
    """Whether ``error`` says an operation lacks the derivative asked for (forward mode, or a
    backward of a backward), as opposed to a real bug that must surface."""
    text = str(error).lower()
    return isinstance(error, NotImplementedError) or any(
        phrase in text for phrase in ("forward ad", "forward-mode", "jvp", "is not implemented", "not implemented for")
    )


def per_sample_dots(
    fn: ObjectiveFunction, shared: Params, direction: Params, method: str = "auto"
) -> tuple[torch.Tensor, str]:
    """``⟨∇ℓ_i, direction⟩`` for every example, and the method that computed it.

    ``auto`` tries, in order of cost, ``jvp`` (one forward-mode pass), ``double_backward`` (two
    reverse passes) and the per-example ``loop`` (B backward passes), moving on only when the model
    lacks the derivative a method needs (fused attention kernels have neither forward mode nor
    double backward).
    """
    if method not in METHODS:
        raise InvalidParameterError(f"per-sample method must be one of {', '.join(METHODS)}, got {method!r}")
    if method == "auto":
        for name, compute in (("jvp", dots_jvp), ("double_backward", dots_double_backward)):
            try:
                return compute(fn, shared, direction), name
            except (NotImplementedError, RuntimeError) as error:
                if not derivative_unsupported(error):
                    raise
        return dots_loop(fn, shared, direction), "loop"
    compute = {"jvp": dots_jvp, "double_backward": dots_double_backward, "vmap": dots_vmap, "loop": dots_loop}[method]
    return compute(fn, shared, direction), method


def mean_gradient(functions: list[ObjectiveFunction], shared: Params) -> tuple[Params, torch.Tensor]:
    """Gradient of the mean loss over all examples of ``functions`` (chunks of one evaluation set),
    and that mean loss. Chunks keep the activation memory of a large evaluation set bounded."""
    total = sum(f.batch_size for f in functions)
    gradient = {n: torch.zeros_like(t) for n, t in shared.items()}
    loss = torch.zeros((), dtype=next(iter(shared.values())).dtype, device=next(iter(shared.values())).device)
    for f in functions:
        params = requiring_grad(shared)
        part = f(params).sum() / total
        grads = torch.autograd.grad(part, list(params.values()), allow_unused=True)
        for n, g in zip(params, grads):
            if g is not None:
                gradient[n] += g
        loss += part.detach()
    return gradient, loss

