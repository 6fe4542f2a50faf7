"""Objective losses as pure functions of the shared (backbone) parameters.

Alignment is measured on the parameters every objective shares with the downstream task: the
backbone. Heads belong to one objective or task and are held fixed here. The model's tied LM
decoder weight is the embedding Parameter, which ``named_parameters`` lists once, under the
backbone, so it is counted once; ``functional_call(..., tie_weights=True)`` substitutes it in both
places.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn
from torch.func import functional_call
from torch.utils._pytree import tree_flatten, tree_map

from objreg.core.errors import InvalidParameterError
from objreg.core.handles import Objective, Task
from objreg.core.types import CorruptedBatch

Params = dict[str, torch.Tensor]
SHARED_PREFIX = "backbone."


def shared_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """The backbone's trainable parameters by name (tied weights once)."""
    return {n: p for n, p in model.named_parameters() if n.startswith(SHARED_PREFIX) and p.requires_grad}


def named_shared(model: nn.Module, names: Collection[str] | None) -> dict[str, nn.Parameter]:
    """The parameters called ``names`` (in the model's order); None: the backbone's
    (:func:`shared_parameters`)."""
    if names is None:
        return shared_parameters(model)
    wanted = set(names)
    return {n: p for n, p in model.named_parameters() if n in wanted}


def batch_size_of(batch: Any) -> int:
    """Examples in a batch: its ``batch_size`` where it has one, else the first dimension of its
    first tensor (a tensor, or a dict, list or tuple of them)."""
    size = getattr(batch, "batch_size", None)
    if isinstance(size, int):
        return size
    leaves = [t for t in tree_flatten(batch)[0] if isinstance(t, torch.Tensor) and t.dim() > 0]
    if not leaves:
        raise InvalidParameterError(
            f"a batch must hold at least one tensor with a batch dimension, got {type(batch).__name__}"
        )
    return leaves[0].shape[0]


@dataclass(frozen=True)
class CallableLoss:
    """A per-sample loss given as a plain function ``fn(model, batch) -> [B]``, in the shape of an
    objective (so every analysis routine takes it): no attention mask of its own, the model's
    forward and the loss in one call.

    Attributes:
        name: Its name in the report.
        fn: The per-sample losses; ``model`` is the module the probe was given, whose parameters
            are swapped for the analysed ones (``torch.func.functional_call``).
        batch_coupled: Whether an example's loss depends on other rows (in-batch negatives).
    """

    name: str
    fn: Callable[[nn.Module, Any], torch.Tensor]
    batch_coupled: bool = False
    role: str = "objective"
    info: Any = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "info", SimpleNamespace(batch_coupled=self.batch_coupled))

    @property
    def label(self) -> str:
        """How messages name it: ``objective 'tokens' (token_loss)``, ``the downstream loss (task_loss)``."""
        function = getattr(self.fn, "__qualname__", None) or type(self.fn).__name__
        return f"the {self.role} ({function})" if self.role != "objective" else f"objective {self.name!r} ({function})"

    def attention_mask(self, batch: Any) -> None:
        return None

    def losses(self, model: nn.Module, batch: Any, mask: None) -> torch.Tensor:
        out = self.fn(model, batch)
        check_loss_shape(self.label, out, batch_size_of(batch))
        return out


def check_loss_shape(label: str, out: Any, rows: int) -> None:
    """A per-sample loss must be a floating tensor of shape ``[rows]``: one loss per example. A
    per-token ``[B, T]`` loss would multiply every dot by ``T`` and a batch mean divide it by
    ``B``, so anything else is refused, naming what the function returned.

    Raises:
        InvalidParameterError: ``out`` is not a floating tensor of shape ``[rows]``.
    """
    wanted = f"one loss per example, a floating tensor of shape [{rows}]"
    if not isinstance(out, torch.Tensor):
        raise InvalidParameterError(f"{label} must return {wanted}; it returned {type(out).__name__} "
                                    f"(a tensor, not a Python number or list, so it can be differentiated)")
    if not out.dtype.is_floating_point:
        raise InvalidParameterError(f"{label} must return {wanted}; it returned a {out.dtype} tensor (integer and "
                                    f"boolean losses cannot be differentiated)")
    if tuple(out.shape) != (rows,):
        shape = list(out.shape)
        if out.dim() == 0:
            hint = "a single number: return the per-example losses (reduction='none'), not their mean or sum"
        elif out.dim() >= 2 and out.shape[0] == rows:
            hint = "one value per token or output: reduce each example's to one number (e.g. .mean(1))"
        else:
            hint = "not one value per example of the batch"
        raise InvalidParameterError(f"{label} must return {wanted}; it returned a tensor of shape {shape} ({hint})")


def count_parameters(params: Params) -> int:
    return sum(p.numel() for p in params.values())


def detached(params: dict[str, nn.Parameter]) -> Params:
    return {n: p.detach() for n, p in params.items()}


def requiring_grad(params: Params) -> Params:
    """Fresh leaves of ``params`` that autograd differentiates with respect to."""
    return {n: t.detach().requires_grad_(True) for n, t in params.items()}


class _LossForward(nn.Module):
    """The objective's per-sample losses (backbone pass and loss), as one module so
    ``functional_call`` can swap every parameter (backbone and heads) around the whole computation."""

    def __init__(self, model: nn.Module, objective: Objective | Task):
        super().__init__()
        self.model = model
        self.objective = objective

    def forward(self, batch: CorruptedBatch, mask: torch.Tensor) -> torch.Tensor:
        return self.objective.losses(self.model, batch, mask)


class ObjectiveFunction:
    """``θ_shared ↦ ℓ(θ_shared) ∈ R^B`` for one objective on one fixed batch.

    The attention mask is built once, outside any transform. Everything except the shared
    parameters (heads, buffers) is taken from the model as it is now and held fixed. ``shared``:
    the names of the shared parameters (default: the backbone's).
    """

    def __init__(self, model: nn.Module, objective: Objective | Task | CallableLoss, batch: CorruptedBatch | Any,
                 mask: torch.Tensor | None = None, shared: Collection[str] | None = None):
        self.model = model
        self.objective = objective
        self.batch = batch
        self.mask = objective.attention_mask(batch) if mask is None else mask
        self._forward = _LossForward(model, objective)
        self.shared = shared
        shared = set(named_shared(model, shared))
        self._fixed = {
            f"model.{n}": t.detach()
            for n, t in [*model.named_parameters(), *model.named_buffers()]
            if n not in shared
        }

    @property
    def batch_size(self) -> int:
        return batch_size_of(self.batch)

    def __call__(self, shared: Params) -> torch.Tensor:
        """Per-sample losses ``[B]`` at ``shared``."""
        return self.losses(shared, self.batch, self.mask)

    def losses(self, shared: Params, batch: CorruptedBatch, mask: torch.Tensor) -> torch.Tensor:
        params = {**self._fixed, **{f"model.{n}": t for n, t in shared.items()}}
        return functional_call(self._forward, params, (batch, mask))

    def mean(self, shared: Params) -> torch.Tensor:
        return self(shared).mean()

    def example_loss(self, shared: Params, example: CorruptedBatch, mask: torch.Tensor | None) -> torch.Tensor:
        """Loss of one example given without its batch dimension (for ``vmap``; a plain loss
        function has no mask)."""
        batch = tree_map(lambda t: t.unsqueeze(0), example)
        return self.losses(shared, batch, None if mask is None else mask.unsqueeze(0))[0]

    def chunks(self, size: int) -> Iterator[ObjectiveFunction]:
        """The same function over consecutive slices of the batch (to bound memory)."""
        for start in range(0, self.batch_size, size):
            part = slice(start, start + size)
            yield ObjectiveFunction(self.model, self.objective, self.batch.select(part), self.mask[part], self.shared)


def flat_dot(a: Params, b: Params) -> torch.Tensor:
    """``Σ_name ⟨a[name], b[name]⟩`` as a 0-d tensor."""
    return sum((a[n] * b[n]).sum() for n in a)  # type: ignore[return-value]


def flat_norm(a: Params) -> torch.Tensor:
    return torch.sqrt(flat_dot(a, a))
