"""Ghost dot products: every example's ``⟨∇ℓ_i, v⟩`` from one forward and one reverse pass that
computes no weight gradient.

Every module owning shared parameters contributes ``Σ_t ⟨g_{i,t}, (∂y/∂θ_m · v_m)_{i,t}⟩``, its
output gradient times the directional derivative of its output along its own parameters (for
``nn.Linear``: ``Σ_t g_{i,t}ᵀ V a_{i,t} + g_{i,t}ᵀ b_V``, and likewise for ``transformers``'
``Conv1D``; embeddings and LayerNorm have their own rules; any other module its local ``jvp``; a
tied weight gets a term at each use, which sums to its one gradient; the closed forms:
:mod:`objreg.analysis.math.ghost_rules`). It needs first derivatives only, so it runs through
fused attention kernels.
:class:`GhostDots` also rides along an ordinary training backward, so the update's own pass
yields the dots too. It attributes gradient by the row it flows through, which is ``∇ℓ_i`` only
when the model treats rows independently and ``ℓ_i`` depends on its own row alone: never used
for batch-coupled losses (``ObjectiveInfo.batch_coupled``).

Where the model breaks that silently, ghost refuses (:class:`GhostUnsupportedError`, and ``auto``
moves on to ``jvp``): an embedding looked up with a one-dimensional index tensor (``pos(arange(T))``
is not per-row, and when ``T = B`` its output passes for a batch), and a loss that runs a backward
pass of its own (its gradient would reach the hooks too). Other coincidences (a relative-position
bias ``[T, T, h]`` when ``T = B``) are caught by the probe's one-time comparison with ``jvp``
(:class:`objreg.analysis.math.per_sample.GhostChecks`).

The same pass also gives every example's squared gradient norm ``‖∇ℓ_i‖²`` (``norms=True``): a
linear layer's per-example weight gradient is ``Σ_t g_t x_tᵀ``, whose squared norm is
``Σ_{t,s} (g_t·g_s)(x_t·x_s)`` (the "ghost norm"), an embedding's is ``Σ_t e_{id_t} g_tᵀ`` with
``Σ_{t,s} [id_t = id_s] g_t·g_s``, a LayerNorm's and a bias's are formed directly; a parameter used
at several places (a tied decoder) adds the cross terms of its uses. Any other module owning
shared parameters has no such rule (:attr:`GhostDots.norms_unsupported` says which).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, jvp

from objreg.analysis.math.functional import ObjectiveFunction, Params
from objreg.analysis.math.ghost_rules import (
    batched_dot,
    embedding_dot,
    is_conv1d,
    layer_norm_dot,
    linear_dot,
    per_example_sum,
    plain_embedding,
    use_inner,
)
from objreg.core.errors import InvalidParameterError


class GhostUnsupportedError(NotImplementedError):
    """The model has a module the ghost rules cannot attribute per example (``auto`` moves on)."""


def _registered_below(path: str, paths: list[str]) -> bool:
    """Whether a module below the one at ``path`` is among ``paths`` (the modules registering a parameter)."""
    prefix = f"{path}." if path else ""
    return any(other != path and other.startswith(prefix) for other in paths)


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
        more: Further directions, keyed the same way, whose dots the same pass gives too
            (:meth:`more_dots`): the forward and the backward are shared, only each module's
            contraction is repeated.

    The caller guarantees what ghost dots need: the model treats rows independently and ℓ_i
    depends on row i alone (never for ``ObjectiveInfo.batch_coupled``).
    """

    #: Whether an ``nn.MultiheadAttention`` counts its ``out_proj`` as its own parameters (a
    #: subclass that reads the attention's tuple output does).
    absorb_attention = False

    def __init__(self, model: nn.Module, direction: Params, batch_size: int, more: Sequence[Params] = (),
                 norms: bool = False):
        self.model = model
        self.direction = direction
        self.more = list(more)
        self.batch_size = batch_size
        self.roots: list[torch.Tensor] = []
        self.contributions: list[torch.Tensor] = []
        self.more_contributions: list[list[torch.Tensor]] = [[] for _ in self.more]
        self.norms = norms
        # Each parameter's per-example gradient, use by use: ("dense", [B, ...]), ("factored", left
        # [B, N, p], right [B, N, q]) for Σ_t left_t right_tᵀ, or ("ids", ids [B, N], right [B, N, q]).
        self.uses: dict[str, list[tuple]] = {}
        self.norms_unsupported: str | None = None
        # Whether gradients reaching the hooks now belong to the pass being measured (False while
        # the loss runs: a backward of its own would add to the contributions).
        self.collecting = True
        self.foreign_backward = False
        self._replaying = False
        self._handles: list[Any] = []
        self.owners: list[tuple[nn.Module, dict[str, str]]] = []  # hooked modules, their measured parameters

    def __enter__(self) -> GhostDots:
        modules = list(self.model.named_modules())
        owner_name: dict[int, str] = {}  # a measured parameter → its name (a tied one: its first, as named_parameters)
        registered: dict[int, list[str]] = {}  # a parameter → the modules registering it
        for path, module in modules:
            for local, p in module._parameters.items():
                if p is None:
                    continue
                if id(p) not in registered:
                    name = f"{path}.{local}" if path else local
                    if name in self.direction:
                        owner_name[id(p)] = name
                registered.setdefault(id(p), []).append(path)
        owners: dict[str, tuple[nn.Module, dict[str, str]]] = {}
        for path, module in modules:
            # A parameter a submodule registers too (Hugging Face's LM-head bias, tied to its
            # decoder's) is that submodule's to count: the parent's own jvp would count the
            # submodule's use of it a second time.
            own = {local: owner_name[id(p)] for local, p in module._parameters.items()
                   if p is not None and id(p) in owner_name
                   and not (len(registered[id(p)]) > 1 and _registered_below(path, registered[id(p)]))}
            if own:
                owners[path] = (module, own)
        if self.absorb_attention:
            # nn.MultiheadAttention multiplies by out_proj's weight without calling out_proj: its
            # projection is the attention's to count, inside the attention's own jvp.
            for path, module in modules:
                inner = owners.pop(f"{path}.out_proj" if path else "out_proj", None) \
                    if isinstance(module, nn.MultiheadAttention) else None
                if inner is not None:
                    own = owners.get(path, (module, {}))[1]
                    owners[path] = (module, {**own, **{f"out_proj.{k}": v for k, v in inner[1].items()}})
        for module, own in owners.values():
            self._attach(module, own)
            self.owners.append((module, own))
        return self

    def _attach(self, module: nn.Module, own: dict[str, str]) -> None:
        """Start watching ``module``'s calls (a forward hook; a subclass may watch otherwise)."""
        self._handles.append(module.register_forward_hook(self._hook(own), with_kwargs=True))

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self.owners.clear()

    def release(self) -> None:
        """Let go of the pass's tensors once its dots and norms are read. The tensor hooks hold
        this object, and it holds tensors carrying them (the roots, the uses' activations): a
        cycle through autograd that Python's collector cannot see, kept alive until broken here."""
        self.roots.clear()
        self.uses.clear()
        self.contributions.clear()
        for parts in self.more_contributions:
            parts.clear()

    def dots(self) -> torch.Tensor:
        """``[B]``: the contributions gathered so far (of the loss that was backpropagated)."""
        return self._total(self.contributions)

    def more_dots(self) -> list[torch.Tensor]:
        """``[B]`` for each of the further directions ``more``."""
        return [self._total(parts) for parts in self.more_contributions]

    def squared_norms(self) -> torch.Tensor | None:
        """``[B]``: every example's ``‖∇ℓ_i‖²`` on the parameters of ``direction`` (with
        ``norms=True``); None where a module has no rule for it (:attr:`norms_unsupported`)."""
        if not self.norms or self.norms_unsupported is not None:
            return None
        like = next(iter(self.direction.values()))
        total = torch.zeros(self.batch_size, dtype=torch.float64, device=like.device)
        for uses in self.uses.values():
            for i, a in enumerate(uses):
                for j, b in enumerate(uses[: i + 1]):
                    inner = use_inner(a, b)
                    if inner is None:
                        self.norms_unsupported = "a parameter used both as a dense and as a factored gradient"
                        return None
                    total = total + (1.0 if i == j else 2.0) * inner.double()
        return total
    def _total(self, contributions: list[torch.Tensor]) -> torch.Tensor:
        like = next(iter(self.direction.values()))
        total = torch.zeros(self.batch_size, dtype=like.dtype, device=like.device)
        for part in contributions:
            total = total + part.to(total.dtype)
        return total

    def _hook(self, own: dict[str, str]) -> Callable[..., Any]:
        def forward_hook(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
            if self._replaying:
                return None
            if plain_embedding(module) and args and isinstance(args[0], torch.Tensor) and args[0].dim() < 2:
                raise GhostUnsupportedError(
                    f"ghost dots need per-row embedding look-ups; {type(module).__name__} was called with an index "
                    f"tensor of shape {tuple(args[0].shape)} (positions shared by every row, say): pass ids of "
                    f"shape [B, T]"
                )
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
            others = [{local: v[name] for local, name in own.items()} for v in self.more]
            # The values this call ran with (functional_call restores the originals before backward).
            values = {local: getattr(module, local) for local in own}

            def on_gradient(g: torch.Tensor) -> None:
                if not self.collecting:
                    self.foreign_backward = True
                    return
                self.contributions.append(self._dot(module, values, args, kwargs, g, d))
                for parts, other in zip(self.more_contributions, others):
                    parts.append(self._dot(module, values, args, kwargs, g, other))
                if self.norms:
                    self._collect_uses(module, args, kwargs, g, own)

            output.register_hook(on_gradient)
            return output

        return forward_hook

    def _collect_uses(self, module: nn.Module, args: tuple, kwargs: dict, g: torch.Tensor, own: dict[str, str]) -> None:
        """This call's share of each of its parameters' per-example gradients (for the norms)."""
        if self.norms_unsupported is not None:
            return
        simple_call = len(args) == 1 and not kwargs
        b = g.shape[0]
        for local, name in own.items():
            use = None
            if simple_call and (type(module) is nn.Linear or is_conv1d(module)):
                x = args[0].reshape(b, -1, args[0].shape[-1])
                grad = g.reshape(b, -1, g.shape[-1])
                if local == "weight":  # nn.Linear stores [out, in]: Σ g xᵀ; Conv1D [in, out]: Σ x gᵀ
                    use = ("factored", grad, x) if type(module) is nn.Linear else ("factored", x, grad)
                elif local == "bias":
                    use = ("dense", grad.sum(1))
            elif simple_call and type(module) is nn.LayerNorm:
                shape = module.normalized_shape
                grad = per_example_sum(g, len(shape))
                if local == "weight":
                    normalised = F.layer_norm(args[0], shape, None, None, module.eps)
                    use = ("dense", per_example_sum(g * normalised, len(shape)))
                elif local == "bias":
                    use = ("dense", grad)
            elif simple_call and plain_embedding(module) and local == "weight":
                ids = args[0].reshape(b, -1)
                grad = g.reshape(b, -1, g.shape[-1])
                if module.padding_idx is not None:  # that row gets no gradient
                    grad = grad.masked_fill((ids == module.padding_idx).unsqueeze(-1), 0.0)
                use = ("ids", ids, grad)
            if use is None:
                self.norms_unsupported = f"{type(module).__name__} (its parameter {local!r}) has no ghost-norm rule"
                return
            self.uses.setdefault(name, []).append(use)

    def _dot(
        self, module: nn.Module, values: Params, args: tuple, kwargs: dict, g: torch.Tensor, d: Params
    ) -> torch.Tensor:
        simple_call = len(args) == 1 and not kwargs
        if simple_call and type(module) is nn.Linear:
            return linear_dot(module, args[0], g, d)
        if simple_call and is_conv1d(module):  # nn.Linear's rule, with the weight's transpose
            return linear_dot(module, args[0], g, {k: v.T if k == "weight" else v for k, v in d.items()})
        if simple_call and type(module) is nn.LayerNorm:
            return layer_norm_dot(module, args[0], g, d)
        if simple_call and plain_embedding(module):
            return embedding_dot(module, args[0], g, d)
        # Any other module: the directional derivative of its output along its own parameters.
        self._replaying = True
        try:
            _, tangent = jvp(lambda p: functional_call(module, p, args, kwargs), (values,), (d,))
        finally:
            self._replaying = False
        return batched_dot(tangent, g)


def dots_ghost(fn: ObjectiveFunction, shared: Params, direction: Params) -> torch.Tensor:
    """``[B]``: one forward and one input-gradient-only backward (see the module docstring).

    Raises:
        InvalidParameterError: the objective couples the examples of a batch.
        GhostUnsupportedError: a module owning shared parameters does not map batch-first tensors.
    """
    return dots_ghost_many(fn, shared, [direction])[0]


def dots_ghost_many(fn: ObjectiveFunction, shared: Params, directions: Sequence[Params]) -> list[torch.Tensor]:
    """:func:`dots_ghost` for several directions from the one forward and backward pass."""
    return dots_and_norms_ghost(fn, shared, directions, norms=False)[0]


def dots_and_norms_ghost(fn: ObjectiveFunction, shared: Params, directions: Sequence[Params],
                         norms: bool = True) -> tuple[list[torch.Tensor], torch.Tensor | None]:
    """:func:`dots_ghost_many`, and with ``norms`` every example's ``‖∇ℓ_i‖²`` from the same pass
    (None where a module has no rule for it).

    Raises:
        InvalidParameterError: the objective couples the examples of a batch.
        GhostUnsupportedError: a module owning shared parameters does not map batch-first tensors,
            an embedding's index tensor is not per-row, or the loss ran a backward pass of its own.
    """
    if fn.objective.info.batch_coupled:
        raise InvalidParameterError(
            f"{fn.objective.name!r} couples the examples of a batch (in-batch negatives); ghost dot products "
            f"attribute gradient by row and are not ⟨∇ℓ_i, v⟩ there: use method='jvp'"
        )
    first, *more = [{n: direction[n] for n in shared} for direction in directions]
    with GhostDots(fn.model, first, fn.batch_size, more, norms=norms) as ghost, torch.enable_grad():
        ghost.collecting = False
        losses = fn({n: t.detach() for n, t in shared.items()})
        ghost.collecting = True
        if ghost.roots and losses.requires_grad:
            # Only the roots are asked for, so autograd skips every weight gradient.
            torch.autograd.grad(losses.sum(), ghost.roots, allow_unused=True)
    if ghost.foreign_backward:
        raise GhostUnsupportedError("the loss ran a backward pass of its own, whose gradients reached the ghost "
                                    "hooks too: ghost dots would count them; use method='jvp'")
    dots = [d.to(losses.dtype) for d in [ghost.dots(), *ghost.more_dots()]]
    norms = ghost.squared_norms()
    ghost.release()
    return dots, norms
