"""The probe's core record on a model sharded with FSDP2 (``torch.distributed.fsdp.fully_shard``):
every quantity computed on each process's shards of the parameters and summed over processes.

:class:`~objreg.analysis.probe.transfer_probe.TransferProbe` differentiates a functional copy of
the model with ``torch.func``; on an FSDP2 model that cannot work: the parameters are ``DTensor``
shards, gathered into full tensors only inside the model's own forward, and ``torch.autograd.grad``
(hence double backward) never reaches the shards ("The differentiated Tensor ... appears to not
have been used in the graph"). What FSDP2 does give is ``loss.backward()``: each process's shard of
the gradient. So :class:`ShardedProbe` builds everything from gradient shards:

- ``∇D`` and each row's ``∇ℓ_i``: one backward each (the per-example loop); every dot
  ``⟨a, b⟩`` is the sum over processes of the dot of their shards (one ``all_reduce``);
- ``H_D v``: the central difference ``(∇D(θ + εv) − ∇D(θ − εv)) / 2ε`` of two gradients, the
  shards moved in place and restored. Its error is ``O(ε²)`` in the third derivative plus the
  rounding of two gradients over ``2ε``; in float64 with ``ε = 1e-5 ‖θ‖/‖v‖`` both are far
  below 1e-6 of the product, so the model must be float64 (refused otherwise);
- the step's split under plain SGD: the parts ``−η α_k g_k``, each dotted with ``∇D`` on shards.

FSDP2's backward averages the processes' gradients, so a row's gradient needs every process on
that row: every process passes the **same** batches (the whole batch), and the rows are not
divided. Sharding here saves memory, not time. Each ``measure`` checks it: a fingerprint of the
batches and the evaluation batch, compared over processes in one small ``all_reduce``, refuses
rank-local rows (what a ``DistributedSampler`` gives) before any gradient is taken. Adam's split
(coalition moments, elementwise, so shard-friendly) is not built yet: the probe takes plain SGD.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from objreg.analysis.math.state_checks import fingerprint
from objreg.analysis.math.taylor import pair_key
from objreg.analysis.records import ShardedRecord
from objreg.core.errors import InvalidParameterError, ProbeStateError

LossFn = Callable[[nn.Module, Any], torch.Tensor]
#: ε of the central differences, relative: ``ε ‖v‖ = RELATIVE_STEP ‖θ‖``.
RELATIVE_STEP = 1e-5


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This process's shard of a ``DTensor`` (a plain tensor is its own shard)."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


class ShardedProbe:
    """Measures one SGD step of a model sharded with ``fully_shard``: the record of
    :class:`~objreg.analysis.records.ShardedRecord` (a subset of ``TransferProbe``'s, the same
    numbers to rounding).

    Args:
        model: The model, ``fully_shard`` applied (its parameters are ``DTensor``), float64.
        objectives: Name → per-sample loss ``fn(model, batch) -> [B]``.
        downstream: ``fn(model, batch) -> [B]``, the downstream per-sample loss.
        optimizer: The loop's plain ``torch.optim.SGD`` (no momentum, no weight decay).
        eval_batch: The evaluation batch defining ``D`` (its mean loss); every process passes it.
        weights: The loop's objective weights ``α_k`` (its loss is ``Σ_k α_k mean(ℓ_k)``; default 1).

    Raises:
        InvalidParameterError: a model not sharded or not float64, an optimizer other than plain
            SGD, weights naming other objectives (the message names what is allowed).
    """

    def __init__(self, model: nn.Module, objectives: Mapping[str, LossFn], downstream: LossFn,
                 optimizer: torch.optim.Optimizer, *, eval_batch: Any, weights: Mapping[str, float] | None = None):
        self.parameters = [p for p in model.parameters() if p.requires_grad]
        if not self.parameters or not all(hasattr(p, "to_local") for p in self.parameters):
            raise InvalidParameterError("ShardedProbe takes a model sharded with torch.distributed.fsdp.fully_shard "
                                        "(every trainable parameter a DTensor); for an unsharded or DDP model use "
                                        "TransferProbe")
        dtypes = {p.dtype for p in self.parameters}
        if dtypes != {torch.float64}:
            raise InvalidParameterError(f"ShardedProbe takes a float64 model (its Hessian-vector products are central "
                                        f"differences of gradients), got parameters in {sorted(map(str, dtypes))}")
        if type(optimizer) is not torch.optim.SGD or any(
                g["momentum"] or g["weight_decay"] or g.get("nesterov") or g.get("maximize")
                for g in optimizer.param_groups):
            raise InvalidParameterError(f"ShardedProbe takes plain torch.optim.SGD (no momentum, weight decay, "
                                        f"nesterov or maximize), got {type(optimizer).__name__} with those settings")
        if len(optimizer.param_groups) != 1:
            raise InvalidParameterError("ShardedProbe takes an SGD with one parameter group (one learning rate)")
        weights = dict(weights) if weights is not None else {k: 1.0 for k in objectives}
        if set(weights) != set(objectives):
            raise InvalidParameterError(f"weights must name exactly the objectives {sorted(objectives)}, "
                                        f"got {sorted(weights)}")
        self.model, self.objectives, self.downstream = model, dict(objectives), downstream
        self.optimizer, self.eval_batch, self.weights = optimizer, eval_batch, weights
        self.records: list[ShardedRecord] = []
        self._pending: dict[str, Any] | None = None

    # Shard arithmetic: lists of local shards, one per parameter, dots summed over processes.

    def _shards(self) -> list[torch.Tensor]:
        return [_local(p).detach().clone() for p in self.parameters]

    def _sum(self, values: torch.Tensor) -> torch.Tensor:
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(values)
        return values

    def _dots(self, pairs: Sequence[tuple[list[torch.Tensor], list[torch.Tensor]]]) -> list[float]:
        """``⟨a, b⟩`` for every pair, summed over processes in one ``all_reduce``."""
        local = torch.stack([sum((x * y).sum() for x, y in zip(a, b)) for a, b in pairs])
        return self._sum(local).tolist()

    def _check_same_batches(self, batches: Mapping[str, Any]) -> None:
        """Refuse batches that differ between processes (module docstring); every process gets
        the same answer, so all raise together rather than hang in the next collective."""
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return
        digest = fingerprint([[batches[k] for k in sorted(batches)], self.eval_batch])
        value = int(digest[:15], 16)  # 60 bits: an int64 on every backend
        both = torch.tensor([value, -value], dtype=torch.int64, device=_local(self.parameters[0]).device)
        dist.all_reduce(both, op=dist.ReduceOp.MAX)  # the largest and minus the smallest fingerprint
        if int(both[0]) != -int(both[1]):
            raise InvalidParameterError(
                "ShardedProbe needs every process to pass the same whole batches and eval_batch; these processes "
                "passed different ones (rank-local rows, as a DistributedSampler gives?): FSDP2 averages the "
                "processes' gradients, so each row's gradient needs every process on that row")

    def _set(self, shards: Sequence[torch.Tensor]) -> None:
        with torch.no_grad():
            for p, s in zip(self.parameters, shards):
                _local(p).copy_(s)
        self._reshard()

    def _reshard(self) -> None:
        # A module left unsharded after a forward (FSDP2's root, by default) would not gather the
        # new shards at its next forward.
        for module in self.model.modules():
            if hasattr(module, "reshard") and hasattr(module, "unshard"):
                module.reshard()

    def _gradient(self, loss: torch.Tensor) -> list[torch.Tensor]:
        """This process's shards of ``∇loss`` (FSDP2's backward: gathered, reduced, sharded)."""
        for p in self.parameters:
            p.grad = None
        loss.backward()
        shards = [_local(p.grad).detach().clone() if p.grad is not None else torch.zeros_like(_local(p))
                  for p in self.parameters]
        for p in self.parameters:
            p.grad = None
        return shards

    def _downstream(self) -> tuple[float, list[torch.Tensor]]:
        loss = self.downstream(self.model, self.eval_batch).mean()
        return float(loss.detach()), self._gradient(loss)

    def _hvp(self, at: list[torch.Tensor], direction: list[torch.Tensor]) -> list[torch.Tensor]:
        """``H_D v`` at ``at`` by central differences; the parameters are left at ``at``."""
        size, norm = (math.sqrt(max(d, 0.0)) for d in self._dots([(at, at), (direction, direction)]))
        if norm == 0:
            return [torch.zeros_like(d) for d in direction]
        eps = RELATIVE_STEP * max(size, 1.0) / norm
        self._set([a + eps * d for a, d in zip(at, direction)])
        plus = self._downstream()[1]
        self._set([a - eps * d for a, d in zip(at, direction)])
        minus = self._downstream()[1]
        self._set(at)
        return [(p - m) / (2 * eps) for p, m in zip(plus, minus)]

    def measure(self, batches: Mapping[str, Any], *, weights: Mapping[str, float] | None = None) -> None:
        """Before ``optimizer.step()``: ``D``, ``∇D``, every row's dot, ``S``. The model's
        ``.grad`` is left empty: take the loop's backward after this call (or again)."""
        if self._pending is not None:
            raise ProbeStateError("measure() called twice without finish(): call finish() after optimizer.step()")
        if set(batches) != set(self.objectives):
            raise InvalidParameterError(f"batches must name exactly the objectives {sorted(self.objectives)}, "
                                        f"got {sorted(batches)}")
        weights = dict(weights) if weights is not None else dict(self.weights)
        self._check_same_batches(batches)
        self._reshard()
        before = self._shards()
        d_loss, d_grad = self._downstream()
        gradients, dots, losses = {}, {}, {}
        for name, fn in self.objectives.items():
            with torch.no_grad():
                rows = int(fn(self.model, batches[name]).shape[0])
            total = [torch.zeros_like(s) for s in before]
            row_grads, row_losses = [], []
            for i in range(rows):  # the per-example loop: every process on the same row
                loss = fn(self.model, batches[name])[i]
                row_losses.append(float(loss.detach()))
                row = self._gradient(loss)
                row_grads.append(row)
                total = [t + r for t, r in zip(total, row)]
            dots[name] = self._dots([(row, d_grad) for row in row_grads])
            gradients[name] = [t / rows for t in total]
            losses[name] = sum(row_losses) / rows
        names = list(self.objectives)
        products = {name: self._hvp(before, gradients[name]) for name in names}
        pairs = [(gradients[a], products[b]) for i, a in enumerate(names) for b in names[i:]]
        pairs += [(gradients[n], gradients[n]) for n in names] + [(d_grad, d_grad)]
        values = self._dots(pairs)
        s_matrix = {}
        k = 0
        for i, a in enumerate(names):
            for b in names[i:]:
                s_matrix[(a, b)] = values[k]
                k += 1
        square = dict(zip(names, values[k:k + len(names)]))
        d_norm = math.sqrt(values[-1])
        # S is symmetric; the central differences make H_D g_b and H_D g_a differ by rounding, so
        # each pair is the mean of both orders as TransferProbe reports it.
        mirrored = self._dots([(gradients[b], products[a]) for i, a in enumerate(names) for b in names[i:]])
        second = {pair_key(a, b): (s_matrix[(a, b)] + m) / 2 for (a, b), m in zip(s_matrix, mirrored)}
        record: dict[str, Any] = {
            "step": len(self.records),
            "weights": weights,
            "losses": losses,
            "downstream_loss": d_loss,
            "downstream_grad_norm": d_norm,
            "alignment": {},
            "second_order": second,
        }
        for name in names:
            mean = sum(dots[name]) / len(dots[name])
            norm = math.sqrt(square[name])
            record["alignment"][name] = {
                "dot": mean,
                "cosine": mean / (norm * d_norm) if norm * d_norm > 0 else 0.0,
                "grad_norm": norm,
                "conflict_fraction": sum(d < 0 for d in dots[name]) / len(dots[name]),
                "dots": dots[name],
            }
        self._pending = {"record": record, "before": before, "d_grad": d_grad, "gradients": gradients,
                         "weights": weights, "d_loss": d_loss}

    def finish(self) -> ShardedRecord:
        """After ``optimizer.step()``: the step's record, also appended to :attr:`records`."""
        if self._pending is None:
            raise ProbeStateError("finish() without measure(): call measure() before optimizer.step()")
        pending, self._pending = self._pending, None
        self._reshard()
        before, d_grad, record = pending["before"], pending["d_grad"], pending["record"]
        after = self._shards()
        delta = [a - b for a, b in zip(after, before)]
        lr = float(self.optimizer.param_groups[0]["lr"])
        parts = {k: [-lr * pending["weights"][k] * g for g in pending["gradients"][k]] for k in pending["gradients"]}
        residual = [d - sum(parts[k][i] for k in parts) for i, d in enumerate(delta)]
        with torch.no_grad():
            d_after = float(self.downstream(self.model, self.eval_batch).mean())
        product = self._hvp(before, delta)  # at θ before the step; the parameters are restored below
        self._set(after)
        names = list(parts)
        values = self._dots([(d_grad, delta), (delta, product), (delta, delta), (residual, residual)]
                             + [(d_grad, parts[k]) for k in names])
        first, second, norm = values[0], 0.5 * values[1], math.sqrt(values[2])
        record["predicted_delta"] = {"first_order": first, "second_order": second}
        record["downstream_loss_after"] = d_after
        record["actual_delta"] = d_after - pending["d_loss"]
        record["update"] = {
            "norm": norm,
            "decomposition_residual": math.sqrt(values[3]) / norm if norm > 0 else 0.0,
            "attribution": "linear",
            "first_order": dict(zip(names, values[4:])),
        }
        self.records.append(record)
        return record
