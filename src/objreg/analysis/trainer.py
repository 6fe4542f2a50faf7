"""Multi-task pre-training on a weighted mix of objectives, with alignment probes.

Each step draws one batch per objective, corrupts it, and updates the model on
``Σ_k α_k L_k``. At a probe step, before the update, it measures for every objective the
per-sample dots ``⟨∇ℓ_i, ∇D⟩`` with the downstream gradient on the shared parameters; after the
update it measures the downstream loss again, so the first-order prediction ``∇D·Δθ`` for the
step actually taken can be checked against the change that happened.

Probes never change the trajectory: data and corruption draw from their own generators whether
or not a step is probed, probes use no randomness, and the model has no dropout or running
statistics for a probe's forward passes to disturb.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from objreg.analysis.functional import (
    SHARED_PREFIX,
    ObjectiveFunction,
    detached,
    flat_dot,
    flat_norm,
    model_losses,
    shared_parameters,
)
from objreg.analysis.per_sample import mean_gradient, per_sample_dots
from objreg.analysis.stats import alignment_stats
from objreg.core.errors import NonFiniteLossError
from objreg.core.registry import Objective
from objreg.core.tokenizer import TokenizedCorpus
from objreg.core.types import CorruptedBatch, ModelOutputs

#: Called after every training step with the step index and its probe record (None if unprobed).
StepCallback = Callable[[int, "dict[str, Any] | None"], None]


@dataclass
class Downstream:
    """The fixed downstream evaluation set, chunked to bound memory."""

    task: Objective
    batch: CorruptedBatch
    chunk_size: int = 32

    def functions(self, model: nn.Module) -> list[ObjectiveFunction]:
        return list(ObjectiveFunction(model, self.task, self.batch).chunks(self.chunk_size))

    @torch.no_grad()
    def loss(self, model: nn.Module) -> float:
        functions = self.functions(model)
        shared = detached(shared_parameters(model))
        total = sum(f(shared).sum() for f in functions)
        return float(total) / self.batch.batch_size


class Trainer:
    def __init__(
        self,
        model: nn.Module,
        objectives: Mapping[str, Objective],
        weights: Mapping[str, float],
        corpus: TokenizedCorpus,
        downstream: Downstream,
        *,
        optimizer: str,
        lr: float,
        batch_size: int,
        seed: int,
        device: torch.device,
        per_sample_method: str = "auto",
    ):
        self.model = model
        self.objectives = dict(objectives)
        self.weights = dict(weights)
        self.corpus = corpus
        self.downstream = downstream
        self.lr = lr
        self.optimizer_name = optimizer
        self.batch_size = batch_size
        self.device = device
        self.per_sample_method = per_sample_method
        self.methods_used: set[str] = set()
        # Separate streams, so probing or an objective's own draws never shift another's data.
        self.data_generator = torch.Generator().manual_seed(seed * 7919 + 1)
        self.corrupt_generator = torch.Generator().manual_seed(seed * 7919 + 2)
        self.trainable = self._trainable_parameters()
        self.optimizer = _make_optimizer(optimizer, list(self.trainable.values()), lr)

    def _trainable_parameters(self) -> dict[str, nn.Parameter]:
        """Backbone plus the pre-training heads. The downstream head is not trained: it defines D."""
        heads = {spec.name for o in self.objectives.values() for spec in o.info.heads}
        prefixes = (SHARED_PREFIX, *(f"heads.{h}." for h in heads))
        return {n: p for n, p in self.model.named_parameters() if n.startswith(prefixes)}

    def next_batches(self) -> dict[str, CorruptedBatch]:
        batches = {}
        for name, objective in self.objectives.items():
            tokens = self.corpus.sample(
                self.batch_size, self.data_generator, min_sentences=objective.info.min_sentences, what=name
            )
            batches[name] = objective.corrupt(tokens, self.corrupt_generator).to(self.device)
        return batches

    def step(self, step: int, probe: bool) -> dict[str, Any] | None:
        """One update on the weighted mix; returns the probe record when ``probe``."""
        batches = self.next_batches()
        record: dict[str, Any] | None = None
        if probe:
            # A copy: the optimizer updates the parameters in place.
            shared_before = {n: p.detach().clone() for n, p in shared_parameters(self.model).items()}
            downstream_grad, downstream_loss = mean_gradient(self.downstream.functions(self.model), shared_before)
            downstream_norm = float(flat_norm(downstream_grad))
            record = {"step": step, "downstream_loss": float(downstream_loss), "weights": dict(self.weights),
                      "losses": {}, "alignment": {}}

        self.optimizer.zero_grad(set_to_none=True)
        for name, batch in batches.items():
            objective = self.objectives[name]
            mask = objective.attention_mask(batch)
            loss = model_losses(self.model, objective, batch, mask).mean()
            if not torch.isfinite(loss):
                raise NonFiniteLossError(
                    f"objective {name!r} produced a non-finite loss ({loss.item()}) at step {step}; "
                    f"try a smaller --lr or --dtype float64"
                )
            grads = torch.autograd.grad(loss, list(self.trainable.values()), allow_unused=True)
            weight = self.weights[name]
            for p, g in zip(self.trainable.values(), grads):
                if g is not None:
                    p.grad = weight * g if p.grad is None else p.grad + weight * g
            if record is not None:
                shared_grad = {n: g for n, g in zip(self.trainable, grads) if n.startswith(SHARED_PREFIX) and g is not None}
                grad_norm = float(flat_norm(shared_grad)) if shared_grad else 0.0
                function = ObjectiveFunction(self.model, objective, batch, mask)
                dots, method = per_sample_dots(function, shared_before, downstream_grad, self.per_sample_method)
                self.methods_used.add(method)
                record["losses"][name] = loss.item()
                record["alignment"][name] = alignment_stats(dots.double().cpu().numpy(), grad_norm, downstream_norm)
        self.optimizer.step()

        if record is not None:
            shared_after = detached(shared_parameters(self.model))
            delta = {n: shared_after[n] - shared_before[n] for n in shared_before}
            downstream_after = self.downstream.loss(self.model)
            record["predicted_delta"] = {"first_order": float(flat_dot(downstream_grad, delta))}
            record["downstream_loss_after"] = downstream_after
            record["actual_delta"] = downstream_after - record["downstream_loss"]
            record["first_order_by_objective"] = self._first_order_by_objective(record)
        return record

    def _first_order_by_objective(self, record: dict[str, Any]) -> dict[str, float]:
        """Each objective's share of the predicted improvement, ``η α_k c_k``: exact for plain SGD,
        where the update is ``−η Σ α_k g_k``. Adam's preconditioned step does not split this way;
        its total prediction uses the actual step instead, and this stays empty."""
        if self.optimizer_name != "sgd":
            return {}
        return {n: self.lr * self.weights[n] * a["dot"] for n, a in record["alignment"].items()}

    def run(self, steps: int, probe_every: int, on_step: StepCallback | None = None) -> list[dict[str, Any]]:
        records = []
        for step in range(steps):
            probe = step % probe_every == 0 or step == steps - 1
            record = self.step(step, probe)
            if record is not None:
                records.append(record)
            if on_step is not None:
                on_step(step, record)
        return records


def _make_optimizer(name: str, params: list[nn.Parameter], lr: float) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    return torch.optim.AdamW(params, lr=lr)


def fit_downstream_head(
    model: nn.Module, task: Objective, batch: CorruptedBatch, steps: int, lr: float = 1e-2
) -> list[float]:
    """Fit the task's heads on ``batch`` with the backbone frozen (a linear probe), full batch.

    The backbone's hidden states are computed once; only head parameters change. Returns the loss
    before each step.
    """
    head_names = [spec.name for spec in task.info.heads]
    params = [p for name in head_names for p in model.heads[name].parameters()]
    if steps == 0 or not params or batch.batch_size == 0:
        return []
    mask = task.attention_mask(batch)
    with torch.no_grad():
        hidden = model.encode(batch.input_ids, mask, batch.position_ids)
    optimizer = torch.optim.Adam(params, lr=lr)
    history = []
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        loss = task.loss(ModelOutputs(hidden, model), batch).mean()
        history.append(loss.item())
        loss.backward()
        optimizer.step()
    return history
