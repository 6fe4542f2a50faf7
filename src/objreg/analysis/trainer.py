"""Multi-task pre-training on a weighted mix of objectives, with probes that check the Taylor
prediction of each step against the downstream change it actually caused.

Each step draws one batch per objective, corrupts it, and updates the model on
``Σ_k α_k(t) L_k``. At a probe step, between computing the gradients and taking the step, it
measures on the shared parameters, for the fixed downstream evaluation loss ``D``:

* per objective, the per-sample dots ``⟨∇ℓ_i, ∇D⟩`` (alignment, cosine, conflict fraction);
* ``∇D`` and the Hessian-vector products ``H_D g_k`` (one batched forward-over-reverse pass), hence
  ``S_ij = g_iᵀ H_D g_j``;
* the split of the step the optimizer is about to take (:mod:`objreg.analysis.optimizers`) and
  the first- and second-order prediction of ``D``'s change for it (:mod:`objreg.analysis.transfer`);
* each pre-training example's share of the first-order term (:mod:`objreg.analysis.attribution`);
* on the first and the last step, on request, the top of ``H_D``'s spectrum.

After the step it reads ``Δθ`` off the parameters and evaluates ``D`` again: the actual change.

Probes never change the trajectory: data and corruption draw from their own generators whether or
not a step is probed, probes read the optimizer's state without changing it, and use no randomness.
Probes evaluate with ``model.eval()`` (training steps run in ``model.train()``), so a model with
dropout still gives a deterministic ``D``, ``∇D`` and ``H_D``: the prediction and the actual change
are both about the same deterministic ``D``, and dropout only changes which update is taken, which
the prediction reads as it happened. (The default model has no dropout, so there the modes agree.)

The trainer's whole state is ``model``, ``optimizer``, ``data_generator``, ``corrupt_generator``,
``next_step``, ``attribution`` and ``hvp_method``, all checkpointable as they are.

Several processes (the downstream set's :class:`~objreg.analysis.distributed.Group`) run the
same trajectory as one: every process draws and corrupts the same whole batches from the same
generators, then computes only its contiguous share of the rows. Its loss is the sum over its
rows divided by the whole batch size, so the gradients, summed over processes in one collective
per objective, are those of the whole batch, and every process takes the same optimizer step.
A batch-coupled objective (``ObjectiveInfo.batch_coupled``: in-batch negatives) cannot be split
by rows: every process computes it whole. Per-sample dots are gathered in row order, ``D``,
``∇D`` and the HVPs are summed over the processes' chunks (:class:`Downstream`), and the
spectrum's Lanczos runs on the main process with every HVP computed together (:meth:`Group.drive`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from objreg.analysis.attribution import ExampleScores
from objreg.analysis.curvature import Curvature
from objreg.analysis.distributed import Group
from objreg.analysis.downstream import Downstream
from objreg.analysis.functional import (
    SHARED_PREFIX,
    ObjectiveFunction,
    Params,
    detached,
    flat_dot,
    flat_norm,
    model_losses,
    shared_parameters,
)
from objreg.analysis.optimizers import StepDecomposition, decompose, make_optimizer
from objreg.analysis.per_sample import per_sample_dots
from objreg.analysis.schedules import Schedule, weights_at
from objreg.analysis.spectrum import eigenvector_alignment, orient, top_eigenpairs
from objreg.analysis.stats import alignment_stats, seed_for
from objreg.analysis.surprisal import token_surprisal
from objreg.analysis.transfer import asymmetry, gram, quadratic_by_pair, relative_error, upper_pairs, weighted_sum
from objreg.core.errors import NonFiniteLossError
from objreg.core.registry import Objective
from objreg.core.tokenizer import TokenizedCorpus
from objreg.core.types import CorruptedBatch, ModelOutputs, TokenBatch

#: Called after every training step with the step index and its probe record (None if unprobed).
StepCallback = Callable[[int, "dict[str, Any] | None"], None]


@dataclass
class _Gathered:
    """One step's data and training gradients, as a probe needs them."""

    tokens: dict[str, TokenBatch]
    batches: dict[str, CorruptedBatch]
    losses: dict[str, float]
    gradients: dict[str, Params]  # shared part of each objective's mean-loss gradient


class Trainer:
    """Trains on the weighted mix and probes; see the module docstring.

    Args:
        steps: Length of the run (schedules are functions of the step and this).
        probe_every: Probe every this many steps, and always the first and the last step.
        schedules: Weight multiplier per objective (constant when absent).
        hvp_method: How HVPs of ``D`` are taken (``auto`` picks on the first probe).
        spectrum: Top eigenvalues of ``H_D`` to compute on the first and the last step (0: none).
        decode: Token ids to text, for the attribution report.
        seed: Seeds data and corruption streams and the bootstrap.
    """

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
        steps: int,
        probe_every: int = 1,
        schedules: Mapping[str, Schedule] | None = None,
        per_sample_method: str = "auto",
        hvp_method: str = "auto",
        spectrum: int = 0,
        decode: Callable[[Sequence[int]], str] | None = None,
    ):
        self.model = model
        self.objectives = dict(objectives)
        self.weights = dict(weights)
        self.schedules = dict(schedules or {})
        self.corpus = corpus
        self.downstream = downstream
        self.lr = lr
        self.optimizer_name = optimizer
        self.batch_size = batch_size
        self.device = device
        self.steps = steps
        self.probe_every = probe_every
        self.per_sample_method = per_sample_method
        self.hvp_method = hvp_method
        self.spectrum = spectrum
        self.decode = decode
        self.seed = seed
        # The processes sharing the work are those sharing the downstream set.
        self.group: Group = downstream.group
        self.methods_used: set[str] = set()
        self.update_rule = ""
        # Separate streams, so probing or an objective's own draws never shift another's data.
        self.data_generator = torch.Generator().manual_seed(seed * 7919 + 1)
        self.corrupt_generator = torch.Generator().manual_seed(seed * 7919 + 2)
        self.trainable = self._trainable_parameters()
        self.optimizer = make_optimizer(optimizer, list(self.trainable.values()), lr)
        self.attribution = ExampleScores()
        self.next_step = 0
        # Every step's weights up front: a bad user schedule fails before any training.
        self.weights_by_step = [self.weights_at(t) for t in range(steps)]

    def _trainable_parameters(self) -> dict[str, nn.Parameter]:
        """Backbone plus the pre-training heads. The downstream head is not trained: it defines D."""
        heads = {spec.name for o in self.objectives.values() for spec in o.info.heads}
        prefixes = (SHARED_PREFIX, *(f"heads.{h}." for h in heads))
        return {n: p for n, p in self.model.named_parameters() if n.startswith(prefixes)}

    def weights_at(self, step: int) -> dict[str, float]:
        """``α_k(step)`` for every objective."""
        if not self.schedules:
            return dict(self.weights)
        return weights_at(step, self.steps, self.weights, self.schedules)

    def is_probed(self, step: int) -> bool:
        return step % self.probe_every == 0 or step == self.steps - 1

    def next_batches(self) -> tuple[dict[str, TokenBatch], dict[str, CorruptedBatch]]:
        tokens, batches = {}, {}
        for name, objective in self.objectives.items():
            tokens[name] = self.corpus.sample(
                self.batch_size, self.data_generator, min_sentences=objective.info.min_sentences, what=name
            )
            if objective.params.get("masking_policy") == "entropy":
                # The current model's surprisal of each token: no gradient, no randomness, so the
                # trajectory stays the same whether or not a step is probed.
                scores = token_surprisal(self.model, tokens[name].to(self.device), objective.vocab)
                tokens[name] = tokens[name]._replace(surprisal=scores.cpu())
            batches[name] = objective.corrupt(tokens[name], self.corrupt_generator).to(self.device)
        return tokens, batches

    # -- one step -----------------------------------------------------------------------------

    def step(self, step: int, probe: bool) -> dict[str, Any] | None:
        """One update on the weighted mix; returns the probe record when ``probe``."""
        tokens, batches = self.next_batches()
        weights = self.weights_by_step[step] if step < len(self.weights_by_step) else self.weights_at(step)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        gathered = _Gathered(tokens, batches, {}, {})
        for name, batch in batches.items():
            objective = self.objectives[name]
            local, sharded = self._share(objective, batch)
            # This process's share of the mean over the whole batch.
            loss = model_losses(self.model, objective, local, objective.attention_mask(local)).sum() / batch.batch_size
            grads = torch.autograd.grad(loss, list(self.trainable.values()), allow_unused=True)
            if sharded:
                loss, grads = self.group.all_reduce_sum((loss.detach(), list(grads)))
            # The whole batch's loss: every process takes the same decision.
            if not torch.isfinite(loss):
                raise NonFiniteLossError(
                    f"objective {name!r} produced a non-finite loss ({loss.item()}) at step {step}; "
                    f"try a smaller --lr or --dtype float64"
                )
            weight = weights[name]
            for p, g in zip(self.trainable.values(), grads):
                if g is not None:
                    p.grad = weight * g if p.grad is None else p.grad + weight * g
            if probe:
                gathered.losses[name] = loss.item()
                gathered.gradients[name] = {
                    n: torch.zeros_like(p) if g is None else g
                    for (n, p), g in zip(self.trainable.items(), grads) if n.startswith(SHARED_PREFIX)
                }
        if not probe:
            self.optimizer.step()
            return None
        self.model.eval()
        try:
            record, finish = self._probe(step, weights, gathered)
            self.optimizer.step()
            finish(record)
        finally:
            self.model.train()
        return record

    def _share(self, objective: Objective, batch: CorruptedBatch) -> tuple[CorruptedBatch, bool]:
        """This process's rows of ``batch`` and whether they are a share of it; the whole batch
        in one process, or for a batch-coupled objective (its per-example losses need every row)."""
        if not self.group.distributed or objective.info.batch_coupled:
            return batch, False
        return batch.select(self.group.shard(batch.batch_size)), True

    def _probe(self, step: int, weights: dict[str, float], data: _Gathered
               ) -> tuple[dict[str, Any], Callable[[dict[str, Any]], None]]:
        """Everything measured before the step; returns the record and what completes it after."""
        shared = shared_parameters(self.model)
        before = {n: p.detach().clone() for n, p in shared.items()}  # the optimizer updates in place
        names = list(self.objectives)
        downstream_before = self.downstream.loss(self.model)
        split = decompose(self.optimizer, shared)
        self.update_rule = self.update_rule or split.rule

        # HVP directions: the raw gradients (for S) and, where the step is not a multiple of them
        # (Adam), the preconditioned gradients and the optimizer's own parts.
        preconditioned = [n for n in names if split.scale is None and weights[n] != 0]
        directions = [data.gradients[n] for n in names]
        directions += [split.apply(data.gradients[n]) for n in preconditioned]
        directions += list(split.extras.values())
        curvature = self.downstream.curvature(self.model, before, self.hvp_method)
        downstream_grad, products = curvature.gradient_and_products(directions)
        self.hvp_method = curvature.method
        raw_products = dict(zip(names, products[: len(names)]))
        pre_products = dict(zip(preconditioned, products[len(names): len(names) + len(preconditioned)]))
        extra_products = dict(zip(split.extras, products[len(names) + len(preconditioned):]))
        downstream_norm = float(flat_norm(downstream_grad))

        record: dict[str, Any] = {
            "step": step,
            "weights": dict(weights),
            "losses": dict(data.losses),
            "downstream_loss": downstream_before,
            "downstream_grad_norm": downstream_norm,
            "alignment": {},
        }
        # Per-sample dots, alignment statistics and each example's first-order score.
        scaled_downstream = split.apply(downstream_grad) if split.scale is None else None
        for name in names:
            batch = data.batches[name]
            local, sharded = self._share(self.objectives[name], batch)
            function = ObjectiveFunction(self.model, self.objectives[name], local)
            dots, method = per_sample_dots(function, before, downstream_grad, self.per_sample_method)
            self.methods_used.add(method)
            per_example = [dots]
            if scaled_downstream is not None and weights[name] != 0:
                per_example.append(per_sample_dots(function, before, scaled_downstream, self.per_sample_method)[0])
            if sharded:  # every process's rows, in row order
                per_example = self.group.all_gather(per_example)
            dots_np = per_example[0].detach().double().cpu().numpy()
            record["alignment"][name] = alignment_stats(
                dots_np, float(flat_norm(data.gradients[name])), downstream_norm, seed_for(self.seed, step, name)
            )
            if scaled_downstream is None:
                example_scores = split.scale * dots_np
            elif weights[name] != 0:
                example_scores = per_example[1].detach().double().cpu().numpy()
            else:
                example_scores = np.zeros_like(dots_np)
            tokens = data.tokens[name]
            ids = [row[~special].tolist() for row, special in zip(tokens.input_ids, tokens.is_special)]
            self.attribution.add(name, step, ids, weights[name] / len(ids) * example_scores)

        # Second order: S on the raw gradients; the split of the step and its Taylor terms.
        s_matrix = gram([data.gradients[n] for n in names], [raw_products[n] for n in names])
        record["second_order"] = upper_pairs(names, s_matrix)
        record["second_order_asymmetry"] = asymmetry(s_matrix)
        parts, part_products = self._parts(split, weights, data.gradients, raw_products, pre_products, extra_products)
        part_names = list(parts)
        first_by_part = {c: float(flat_dot(downstream_grad, parts[c])) for c in part_names}
        quadratic = gram([parts[c] for c in part_names], [part_products[c] for c in part_names])
        second_by_pair = quadratic_by_pair(part_names, quadratic)

        if self.spectrum and step in (0, self.steps - 1):
            record["spectrum"] = self._spectrum(curvature, before, downstream_grad, data.gradients)

        def finish(record: dict[str, Any]) -> None:
            after = detached(shared_parameters(self.model))
            delta = {n: after[n] - before[n] for n in before}
            residual = {n: delta[n] - t for n, t in weighted_sum(parts, before).items()}
            delta_norm = float(flat_norm(delta))
            downstream_after = self.downstream.loss(self.model)
            first, second = float(flat_dot(downstream_grad, delta)), sum(second_by_pair.values())
            actual = downstream_after - downstream_before
            record["predicted_delta"] = {"first_order": first, "second_order": second}
            record["downstream_loss_after"] = downstream_after
            record["actual_delta"] = actual
            record["relative_error"] = {
                "first_order": relative_error(first, actual),
                "first_plus_second_order": relative_error(first + second, actual),
            }
            record["update"] = {
                "norm": delta_norm,
                "decomposition_residual": float(flat_norm(residual)) / delta_norm if delta_norm > 0 else 0.0,
                "first_order": first_by_part,
                "second_order": second_by_pair,
            }

        return record, finish

    def _parts(
        self, split: StepDecomposition, weights: dict[str, float], gradients: dict[str, Params],
        raw_products: dict[str, Params], pre_products: dict[str, Params], extra_products: dict[str, Params],
    ) -> tuple[dict[str, Params], dict[str, Params]]:
        """The displacement ``d_c`` of each part of the step and ``H_D d_c``."""
        parts: dict[str, Params] = {}
        products: dict[str, Params] = {}
        for name, gradient in gradients.items():
            parts[name] = split.objective_part(weights[name], gradient)
            if split.scale is not None:  # d = −η α g, so H d = −η α H g: no new HVP
                products[name] = {n: -split.scale * weights[name] * t for n, t in raw_products[name].items()}
            elif name in pre_products:
                products[name] = {n: -weights[name] * t for n, t in pre_products[name].items()}
            else:  # weight 0: no displacement
                products[name] = {n: torch.zeros_like(t) for n, t in gradient.items()}
        parts.update(split.extras)
        products.update(extra_products)
        return parts, products

    def _spectrum(self, curvature: Curvature, shared: Params, downstream_grad: Params,
                  gradients: dict[str, Params]) -> dict[str, Any]:
        """The top of ``H_D``'s spectrum and each gradient's cosines with its eigenvectors."""
        before = curvature.matvecs

        def lanczos(matvec: Callable[[Params], Params]) -> dict[str, Any]:
            values, vectors, _ = top_eigenpairs(matvec, shared, self.spectrum, seed=self.seed)
            vectors = orient(vectors, downstream_grad)
            return {
                "eigenvalues": [float(v) for v in values],
                "alignment": eigenvector_alignment(vectors, gradients),
                "downstream_alignment": eigenvector_alignment(vectors, {"D": downstream_grad})["D"],
                "matvecs": curvature.matvecs - before,
            }

        # Lanczos on the main process; every process computes each HVP with it.
        return self.group.drive(lanczos, curvature.matvec, shared)

    def run(self, on_step: StepCallback | None = None) -> list[dict[str, Any]]:
        """Train from :attr:`next_step` to the end; the probe records in order."""
        records = []
        while self.next_step < self.steps:
            step = self.next_step
            record = self.step(step, self.is_probed(step))
            self.next_step = step + 1
            if record is not None:
                records.append(record)
            if on_step is not None:
                on_step(step, record)
        return records

    def state_dict(self) -> dict[str, Any]:
        """Everything :meth:`run` changes, as tensors and plain data (for a checkpoint)."""
        return {
            "next_step": self.next_step,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "data_generator": self.data_generator.get_state(),
            "corrupt_generator": self.corrupt_generator.get_state(),
            # Dropout, where a model has it, draws from the global generator.
            "global_generator": torch.get_rng_state(),
            "attribution": self.attribution.state_dict(),
            "hvp_method": self.hvp_method,
            "update_rule": self.update_rule,
            "methods_used": sorted(self.methods_used),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict` of a trainer built with the same settings."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.data_generator.set_state(state["data_generator"])
        self.corrupt_generator.set_state(state["corrupt_generator"])
        torch.set_rng_state(state["global_generator"])
        self.attribution.load_state_dict(state["attribution"])
        self.hvp_method = state["hvp_method"]
        self.update_rule = state["update_rule"]
        self.methods_used = set(state["methods_used"])
        self.next_step = int(state["next_step"])

    def attribution_report(self, top: int) -> dict[str, Any]:
        return self.attribution.top(top, self.decode)


def fit_downstream_head(
    model: nn.Module, task: Objective, batch: CorruptedBatch, steps: int, lr: float = 1e-2, group: Group | None = None
) -> list[float]:
    """Fit the task's heads on ``batch`` with the backbone frozen (a linear probe), full batch.

    The backbone's hidden states are computed once, in eval mode (the probe is fitted on the
    features ``D`` is evaluated with); only head parameters change. Returns the loss before each
    step. With several processes (``group``) each encodes its contiguous share of the rows, and
    the head's gradient is summed over the processes at every step (a collective of the head's
    size): the one-process fit, to rounding, for a fraction of the backbone pass.
    """
    group = group if group is not None else Group()
    head_names = [spec.name for spec in task.info.heads]
    params = [p for name in head_names for p in model.heads[name].parameters()]
    if steps == 0 or not params or batch.batch_size == 0:
        return []
    total = batch.batch_size
    split = group.distributed and total >= group.world_size and not task.info.batch_coupled
    local = batch.select(group.shard(total)) if split else batch
    mask = task.attention_mask(local)
    training = model.training
    model.eval()
    with torch.no_grad():
        hidden = model.encode(local.input_ids, mask, local.position_ids)
    optimizer = torch.optim.Adam(params, lr=lr)
    history = []
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        loss = task.loss(ModelOutputs(hidden, model), local).sum() / total
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        if split:
            loss, grads = group.all_reduce_sum((loss.detach(), list(grads)))
        for p, g in zip(params, grads):
            p.grad = g
        history.append(loss.item())
        optimizer.step()
    model.train(training)
    return history
