"""The training loop: multi-task pre-training on a weighted mix of objectives, with probes.

Each step draws one batch per objective, prepares and corrupts it, and updates the model on
``Σ_k α_k(t) L_k``. At a probe step the public
:class:`~objreg.analysis.probe.transfer_probe.TransferProbe` measures between the gradients and the
optimizer step, and completes its record after the step: ``objreg analyze`` probes exactly as a
user's own loop does.

Probes never change the trajectory: data and corruption draw from their own generators whether
or not a step is probed, and the probe neither draws random numbers nor changes the optimizer's
state. Probes evaluate with ``model.eval()`` (training steps run in ``model.train()``); dropout
only changes which update is taken, which the prediction reads as it happened.

Under Adam every step, probed or not, also advances the coalition moments the attribution of
the step needs (:mod:`objreg.analysis.math.shapley`): each coalition of objectives keeps the Adam
moments its own gradients would have built along the actual trajectory.

The trainer's whole state (:meth:`Trainer.state_dict`) is the model, the optimizer, the data and
corruption generators, the global generator dropout draws from, the step to run next, and the
probe's own :meth:`~objreg.analysis.probe.transfer_probe.TransferProbe.state_dict` (its records,
the coalition moments, the example scores); all checkpointable as they are.

Several processes (the downstream set's :class:`~objreg.analysis.parallel.group.Group`) run the same
trajectory as one: every process draws and corrupts the same whole batches from the same
generators, and each computes its share of the rows (:mod:`objreg.analysis.math.gradients`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from objreg.analysis.math.downstream import Downstream
from objreg.analysis.math.functional import SHARED_PREFIX, Params, shared_parameters
from objreg.analysis.math.gradients import accumulate, check_finite, mean_loss_gradient, shared_part
from objreg.analysis.math.optimizers import make_optimizer
from objreg.analysis.math.shapley import CoalitionMoments
from objreg.analysis.probe.settings import ProbeSettings
from objreg.analysis.probe.transfer_probe import TransferProbe
from objreg.analysis.records import StepRecord
from objreg.analysis.run.adaptive import Rule
from objreg.analysis.run.schedules import Schedule, weights_at
from objreg.core.handles import Objective
from objreg.core.types import CorruptedBatch, TokenBatch
from objreg.toolkit.randomness import stream
from objreg.toolkit.tokenizer import TokenizedCorpus

#: Called after every training step with the step index and its probe record (None if unprobed).
StepCallback = Callable[[int, "StepRecord | None"], None]


class Trainer:
    """Trains on the weighted mix and probes; see the module docstring.

    Args:
        steps: Length of the run (schedules are functions of the step and this).
        probe_every: Probe every this many steps, and always the first and the last step.
        schedules: Weight multiplier per objective (constant when absent).
        adaptive: An adaptive rule (:mod:`objreg.analysis.run.adaptive`) that sets the weights from
            the probes instead: told each finished probe record, asked for each step's weights.
        probe_settings: How the probe computes (:class:`~objreg.analysis.probe.settings.ProbeSettings`;
            default: its defaults, seeded with ``seed``).
        decode: Token ids to text, for the probe's example attribution.
        seed: Seeds data and corruption streams.
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
        probe_settings: ProbeSettings | None = None,
        decode: Callable[[Sequence[int]], str] | None = None,
        adaptive: Rule | None = None,
    ):
        self.model = model
        self.objectives = dict(objectives)
        self.weights = dict(weights)
        self.schedules = dict(schedules or {})
        self.corpus = corpus
        self.batch_size = batch_size
        self.device = device
        self.steps = steps
        self.probe_every = probe_every
        # The processes sharing the work are those sharing the downstream set.
        self.group = downstream.group
        # Separate streams, so probing or an objective's own draws never shift another's data.
        self.data_generator = stream(seed, "data")
        self.corrupt_generator = stream(seed, "corruption")
        # Backbone plus the pre-training heads. The downstream head is not trained: it defines D.
        heads = {spec.name for o in self.objectives.values() for spec in o.info.heads}
        prefixes = (SHARED_PREFIX, *(f"heads.{h}." for h in heads))
        self.trainable = {n: p for n, p in model.named_parameters() if n.startswith(prefixes)}
        self.optimizer = make_optimizer(optimizer, list(self.trainable.values()), lr)
        self.shared = shared_parameters(model)
        # The public probe, on whole batches (each process takes its share of the rows); under
        # Adam it keeps the coalition moments of the step's split, advanced every step.
        settings = probe_settings if probe_settings is not None else ProbeSettings(seed=seed)
        self.probe = TransferProbe(
            model, self.objectives, downstream, self.optimizer, weights=self.weights, shared=list(self.shared),
            steps=steps, decode=decode, whole_batches=True, **settings.as_arguments(),
        )
        self.next_step = 0
        self.adaptive = adaptive
        # Every step's weights up front: a bad user schedule fails before any training. An
        # adaptive rule's are known only as the run goes.
        self.weights_by_step = [] if adaptive is not None else [self.weights_at(t) for t in range(steps)]

    def weights_at(self, step: int) -> dict[str, float]:
        """``α_k(step)`` for every objective."""
        if self.adaptive is not None:
            if step == len(self.weights_by_step):
                self.weights_by_step.append(dict(self.adaptive.weights))
            return dict(self.weights_by_step[step])
        if not self.schedules:
            return dict(self.weights)
        return weights_at(step, self.steps, self.weights, self.schedules)

    def is_probed(self, step: int) -> bool:
        return step % self.probe_every == 0 or step == self.steps - 1

    def run(self, on_step: StepCallback | None = None) -> list[StepRecord]:
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

    def step(self, step: int, probe: bool) -> StepRecord | None:
        """One update on the weighted mix; returns the probe record when ``probe``."""
        tokens, batches = self.next_batches()
        weights = self.weights_by_step[step] if step < len(self.weights_by_step) else self.weights_at(step)
        losses, gradients = self.accumulate_gradients(step, batches, weights, keep=probe or self.coalitions is not None)
        if not probe:
            self.probe.track(weights=weights, gradients=gradients)
            self.optimizer.step()
            return None
        measurement = self.probe.measure(batches, step=step, weights=weights, gradients=gradients, losses=losses,
                                         tokens=tokens)
        self.optimizer.step()
        record = self.probe.finish(measurement)
        if self.adaptive is not None:
            self.adaptive.update(record)
        return record

    @property
    def coalitions(self) -> CoalitionMoments | None:
        """Under Adam, the coalition moments of the step's split (the probe's); None for SGD."""
        return self.probe.coalitions

    def next_batches(self) -> tuple[dict[str, TokenBatch], dict[str, CorruptedBatch]]:
        """One batch per objective: sampled, prepared with the current model, corrupted."""
        tokens, batches = {}, {}
        for name, objective in self.objectives.items():
            sampled = self.corpus.sample(
                self.batch_size, self.data_generator, min_sentences=objective.info.min_sentences, what=name
            )
            # Prepared on the model's device (e.g. the model's surprisal of each token), corrupted
            # on the CPU, where the generators are.
            if objective.prepares:
                sampled = objective.prepare(sampled.to(self.device), self.model).to("cpu")
            tokens[name] = sampled
            batches[name] = objective.corrupt(tokens[name], self.corrupt_generator).to(self.device)
        return tokens, batches

    def accumulate_gradients(
        self, step: int, batches: dict[str, CorruptedBatch], weights: dict[str, float], keep: bool,
    ) -> tuple[dict[str, float], dict[str, Params]]:
        """Set the trainable parameters' ``.grad`` to ``Σ_k α_k ∇L_k`` (in training mode); with
        ``keep``, also return each objective's loss and its gradient on the shared parameters
        (what a probe reads), else two empty dicts."""
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        params = list(self.trainable.values())
        losses: dict[str, float] = {}
        gradients: dict[str, Params] = {}
        for name, batch in batches.items():
            loss, grads = mean_loss_gradient(self.model, self.objectives[name], batch, params, self.group)
            check_finite(name, loss, step)
            accumulate(params, grads, weights[name])
            if keep:
                losses[name], gradients[name] = loss.item(), shared_part(self.trainable, grads)
        return losses, gradients

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
            "probe": self.probe.state_dict(),
            "adaptive": ({"rule": self.adaptive.state_dict(), "weights_by_step": self.weights_by_step}
                         if self.adaptive is not None else None),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict` of a trainer built with the same settings."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.data_generator.set_state(state["data_generator"])
        self.corrupt_generator.set_state(state["corrupt_generator"])
        torch.set_rng_state(state["global_generator"])
        self.probe.load_state_dict(state["probe"])
        self.next_step = int(state["next_step"])
        if self.adaptive is not None:
            self.adaptive.load_state_dict(state["adaptive"]["rule"])
            self.weights_by_step = [dict(w) for w in state["adaptive"]["weights_by_step"]]

