"""What a probe step measures: how each objective's gradient aligns with the downstream loss
``D``, and how well the Taylor expansion of ``D`` predicts the change the step causes.

Between the gradients and the optimizer step, :meth:`Probe.measure` reads, on the shared
parameters:

* per objective, the per-sample dots ``⟨∇ℓ_i, ∇D⟩`` (alignment, cosine, conflict fraction) and
  every example's ``‖∇ℓ_i‖²`` (the noise ratio of the batch's mean gradient, which bounds where
  the cosine's interval is reported), ghost's dots checked once against ``jvp``
  (:class:`~objreg.analysis.math.per_sample.GhostChecks`);
* ``∇D`` and the Hessian-vector products ``H_D g_k`` (one batched pass), hence
  ``S_ij = g_iᵀ H_D g_j``;
* the split of the step the optimizer is about to take (:mod:`objreg.analysis.math.optimizers`; under
  Adam, Shapley values over coalitions with their own moments, :mod:`objreg.analysis.math.shapley`),
  each part's alignment with ``∇D``, and the first- and second-order prediction of ``D``'s change
  for the step (:mod:`objreg.analysis.math.taylor`); sampled Shapley parts get their Monte-Carlo
  errors;
* under Adam, the exact one-step counterfactual at other weights
  (:mod:`objreg.analysis.math.counterfactual`): its stencil's steps are further HVP directions of
  the same pass, its grid's first-order terms dot products;
* each pre-training example's share of the first-order term (:mod:`objreg.analysis.probe.attribution`);
* on the first and the last step, on request, the top of ``H_D``'s spectrum.

It returns a :class:`Pending` measurement; after the step :meth:`Probe.finish` reads ``Δθ`` off
the parameters, evaluates ``D`` again (the actual change, in float64:
:mod:`objreg.analysis.math.downstream`) and completes the record with the prediction's errors, the
rounding floor and the Taylor-regime diagnostic.

A probe changes nothing the trajectory depends on: it reads the optimizer's state without
changing it and draws random numbers only once, for ``D``'s resolution at the first probe, from
its own ``resolution`` stream (:mod:`objreg.analysis.math.resolution`). It runs with
``model.eval()`` (set by the loop), so a model with dropout still gives a deterministic ``D``,
``∇D`` and ``H_D``.

With several processes, per-sample dots are gathered in row order, ``D``, ``∇D`` and the HVPs
are summed over the processes' chunks (:class:`~objreg.analysis.math.downstream.Downstream`), and
the spectrum's Lanczos runs on the main process with every HVP computed together
(:meth:`Group.drive`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from objreg.analysis.math.counterfactual import AdamCounterfactual, grid, stencil
from objreg.analysis.math.curvature import Curvature
from objreg.analysis.math.downstream import Downstream
from objreg.analysis.math.functional import (
    CallableLoss,
    ObjectiveFunction,
    Params,
    detached,
    flat_dot,
    flat_norm,
    named_shared,
)
from objreg.analysis.math.gradients import local_rows
from objreg.analysis.math.optimizers import StepDecomposition, adam_settings, decompose, stepped
from objreg.analysis.math.per_sample import GhostChecks, per_sample_dots_and_norms
from objreg.analysis.math.refit import RefitDownstream
from objreg.analysis.math.resolution import downstream_resolution
from objreg.analysis.math.shapley import CoalitionMoments
from objreg.analysis.math.spectrum import eigenvector_alignment, orient, top_eigenpairs
from objreg.analysis.math.stats import alignment_stats, seed_for
from objreg.analysis.math.taylor import (
    asymmetry,
    quadratic_by_pair,
    rounding_floor,
    taylor_errors,
    upper_pairs,
    weighted_sum,
)
from objreg.analysis.probe.attribution import ExampleScores
from objreg.analysis.records import DownstreamFit, Spectrum, StepRecord
from objreg.core.handles import Objective
from objreg.core.types import CorruptedBatch, TokenBatch
from objreg.toolkit.randomness import stream

#: A re-fitted head's fit behind a value of ``D*``: its summary for the record, and its error on ``D*``.
Fit = tuple[DownstreamFit, float]


@dataclass
class Pending:
    """A probe measured before the step, waiting for the step to be taken."""

    record: StepRecord  # without the keys finish() adds
    before: Params  # the shared parameters before the step (copies: the optimizer updates in place)
    downstream_before: float
    fit_before: Fit | None
    downstream_grad: Params
    parts: dict[str, Params]  # the step's displacement per part (objective, weight decay)
    first_by_part: dict[str, float]
    second_by_pair: dict[str, float]
    attribution: str
    first_order_errors: dict[str, float] | None = None  # the sampled Shapley parts' Monte-Carlo errors


class Probe:
    """Measures probe steps; keeps what the report needs across them (the attribution scores,
    the per-sample and HVP methods used, the update rule).

    Args:
        seed: Seeds the bootstrap intervals and the spectrum's starting vector.
        steps: Length of the run (the spectrum is taken on its first and last step).
        hvp_method: How HVPs of ``D`` are taken (``auto`` picks on the first probe).
        spectrum: Top eigenvalues of ``H_D`` to compute on the first and the last step (0: none).
        decode: Token ids to text, for the attribution report.
        shared: Names of the shared parameters (default: the backbone's).
        local_batches: Whether each process is given its own rows (a data-parallel loop) rather
            than the whole batch, of which it takes its share (``objreg analyze``).
        counterfactual_radius: Under Adam, how far (a share of the total weight) the stencil of
            the exact one-step counterfactual reaches from the weights used
            (:mod:`objreg.analysis.math.counterfactual`).
    """

    def __init__(
        self, model: nn.Module, objectives: Mapping[str, Objective | CallableLoss], downstream: Downstream, *,
        seed: int, steps: int, per_sample_method: str = "auto", hvp_method: str = "auto", spectrum: int = 0,
        decode: Callable[[Sequence[int]], str] | None = None, shared: Sequence[str] | None = None,
        local_batches: bool = False, counterfactual_radius: float = 0.25,
    ):
        self.model = model
        self.counterfactual_radius = counterfactual_radius
        self.shared = tuple(shared) if shared is not None else None
        self.local_batches = local_batches
        self.objectives = dict(objectives)
        self.downstream = downstream
        self.group = downstream.group
        self.seed = seed
        self.steps = steps
        self.per_sample_method = per_sample_method
        self.hvp_method = hvp_method
        self.spectrum = spectrum
        self.decode = decode
        self.attribution = ExampleScores()
        self.methods_used: set[str] = set()
        # Ghost's one-time check against an independent method, per model, objective (and shape).
        self.ghost_checks = GhostChecks()
        self.update_rule = ""
        # D at the last point it was evaluated (that point's shared parameters and the model's
        # buffers, the value, and a re-fitted head's fit): the D after one probed step is the D
        # before the next.
        self._last_downstream: tuple[Params, list[torch.Tensor], float, Fit | None] | None = None
        self.last_fit: Fit | None = None
        # The noise of one evaluation of D, measured at the first probe (kept in the probe's state).
        self.resolution: float | None = None

    def downstream_loss(self, shared: Params) -> float:
        """``D`` at the model's current parameters (``shared``: their values now), evaluated
        again only where they or the model's buffers changed since the last evaluation; with a
        re-fitted head, :attr:`last_fit` is the fit behind it (its summary and its error on ``D``)."""
        buffers = list(self.model.buffers())
        last = self._last_downstream
        if last is not None and len(last[1]) == len(buffers) and all(
            torch.equal(last[0][n], t) for n, t in shared.items()
        ) and all(torch.equal(a, b) for a, b in zip(last[1], buffers)):
            self.last_fit = last[3]
            return last[2]
        value = self.downstream.loss(self.model)
        refit = isinstance(self.downstream, RefitDownstream)
        self.last_fit = (self.downstream.fit_summary(), self.downstream.last_fit_error) if refit else None
        self._last_downstream = ({n: t.clone() for n, t in shared.items()}, [b.clone() for b in buffers], value,
                                 self.last_fit)
        return value

    def measure(
        self, step: int, weights: dict[str, float], optimizer: torch.optim.Optimizer,
        tokens: dict[str, TokenBatch] | None, batches: dict[str, CorruptedBatch | Any], losses: dict[str, float],
        gradients: dict[str, Params], coalitions: CoalitionMoments | None = None,
    ) -> Pending:
        """Everything measured before the step. ``gradients``: each objective's mean-loss
        gradient on the shared parameters, as accumulated into the optimizer's ``.grad``;
        ``coalitions``: under Adam, the coalition moments advanced with this step's gradients;
        ``tokens``: the uncorrupted batches, for the example attribution (None: none)."""
        shared = named_shared(self.model, self.shared)
        before = {n: p.detach().clone() for n, p in shared.items()}
        names = list(self.objectives)
        downstream_before = self.downstream_loss(before)
        fit_before = self.last_fit
        if self.resolution is None:
            self.resolution = downstream_resolution(self.downstream, self.model, stream(self.seed, "resolution"))
        split = decompose(optimizer, shared, weights, gradients, coalitions)
        self.update_rule = self.update_rule or split.rule
        parts = split.parts

        # HVP directions: the raw gradients (for S) and, where a part of the step is not a
        # multiple of one of them (Adam), the parts themselves.
        linear = split.scale is not None
        directions = [gradients[n] for n in names] + ([] if linear else list(parts.values()))
        # Under Adam, the exact steps of other weights (the counterfactual's stencil): more directions.
        exact = self._exact_counterfactual(optimizer, shared, gradients, linear)
        points = stencil(weights, names, self.counterfactual_radius) if exact is not None else []
        counterfactual_steps = [exact.step(point) for point in points]
        directions += counterfactual_steps
        # Each product is needed only through its dots (S, the parts' quadratic form, the stencil's
        # second-order terms): taken as it is made, no set of products is held.
        raw = [gradients[n] for n in names]
        part_list = list(parts.values())
        against = [raw] * len(names) + ([] if linear else [part_list] * len(parts)) + [[c] for c in counterfactual_steps]
        curvature = self.downstream.curvature(self.model, before, self.hvp_method)
        downstream_grad, dots, _ = curvature.gradient_and_dots(directions, against)
        self.hvp_method = curvature.method
        dots = dots.cpu().numpy()
        s_matrix = dots[:len(names), :len(names)].T  # S_ij = g_iᵀ H g_j, row j holding H g_j's dots
        if linear:  # d = −η α g, so dᵢᵀ H dⱼ = η² αᵢ αⱼ S_ij: no new HVP
            order = [names.index(c) for c in parts]
            scaled = np.array([-split.scale * weights[c] for c in parts])
            quadratic = scaled[:, None] * s_matrix[np.ix_(order, order)] * scaled[None, :]
        else:
            quadratic = dots[len(names):len(names) + len(parts), :len(parts)].T
        counterfactual_second = dots[len(directions) - len(counterfactual_steps):, 0]
        downstream_norm = float(flat_norm(downstream_grad))

        record: StepRecord = {  # type: ignore[typeddict-item]  # finish() adds the rest
            "step": step,
            "weights": dict(weights),
            "losses": dict(losses),
            "downstream_loss": downstream_before,
            "downstream_grad_norm": downstream_norm,
            "alignment": {},
        }
        # Per-sample dots, alignment statistics and each example's first-order score.
        scaled_downstream = split.apply(downstream_grad) if not linear else None
        first_by_part = {c: float(flat_dot(downstream_grad, parts[c])) for c in parts}
        for name in names:
            dots, self_dots, scores, squared_norms = self._per_sample(
                name, batches[name], before, downstream_grad, gradients[name], scaled_downstream, split, weights[name])
            alignment = alignment_stats(dots, self_dots, float(flat_norm(gradients[name])), downstream_norm,
                                        seed_for(self.seed, step, name), squared_norms)
            # The objective's part of the actual step against ∇D: its first-order transfer.
            part_norm = float(flat_norm(parts[name]))
            alignment["update_cosine"] = (-first_by_part[name] / (part_norm * downstream_norm)
                                          if part_norm * downstream_norm > 0 else 0.0)
            record["alignment"][name] = alignment
            if tokens is not None:
                ids = [row[~special].tolist() for row, special in zip(tokens[name].input_ids, tokens[name].is_special)]
                self.attribution.add(name, step, ids, weights[name] / len(ids) * scores)

        # Second order: S on the raw gradients; the Taylor terms of the step, split by part.
        record["second_order"] = upper_pairs(names, s_matrix)
        record["second_order_asymmetry"] = asymmetry(s_matrix)
        part_names = list(parts)

        if self.spectrum and step in (0, self.steps - 1):
            record["spectrum"] = self._spectrum(curvature, before, downstream_grad, gradients)
        if exact is not None:
            record["counterfactual"] = {
                "points": [{"weights": point, "first_order": float(flat_dot(downstream_grad, change)),
                            "second_order": 0.5 * float(second)}
                           for point, change, second in zip(points, counterfactual_steps, counterfactual_second)],
                "grid": [{"weights": point, "first_order": float(flat_dot(downstream_grad, exact.step(point)))}
                         for point in grid(weights, names, self.counterfactual_radius)],
            }
        return Pending(record, before, downstream_before, fit_before, downstream_grad, parts, first_by_part,
                       quadratic_by_pair(part_names, quadratic), split.attribution,
                       self._first_order_errors(optimizer, shared, coalitions, parts, downstream_grad))

    def finish(self, pending: Pending) -> StepRecord:
        """The record, completed with what the step did: ``Δθ``, the new ``D``, the prediction's
        errors and the Taylor-regime diagnostic."""
        before = pending.before
        after = detached(named_shared(self.model, self.shared))
        delta = {n: after[n] - before[n] for n in before}
        residual = {n: delta[n] - t for n, t in weighted_sum(pending.parts, before).items()}
        delta_norm = float(flat_norm(delta))
        downstream_after = self.downstream_loss(after)
        first, second = float(flat_dot(pending.downstream_grad, delta)), sum(pending.second_by_pair.values())
        actual = downstream_after - pending.downstream_before
        like = next(iter(before.values()))
        floor = rounding_floor(pending.downstream_before, downstream_after, self.downstream.unit_roundoff(self.model),
                               float(flat_norm(pending.downstream_grad)), delta_norm,
                               float(torch.finfo(like.dtype).eps) / 2, self.resolution or 0.0)
        fit_after = self.last_fit
        if pending.fit_before is not None and fit_after is not None:  # D* is exact only to its fits' tolerance
            floor += pending.fit_before[1] + fit_after[1]
        norms = {c: float(flat_norm(part)) for c, part in pending.parts.items()}
        record = pending.record
        record["predicted_delta"] = {"first_order": first, "second_order": second}
        record["downstream_loss_after"] = downstream_after
        if pending.fit_before is not None and fit_after is not None:
            record["downstream_fit"] = {"before": pending.fit_before[0], "after": fit_after[0]}
        record["actual_delta"] = actual
        record["taylor"] = taylor_errors(first, second, actual, floor, self.resolution)
        record["update"] = {
            "norm": delta_norm,
            "norms": norms,
            # 1 when the parts point the same way; large when they cancel (each part much larger than the step).
            "conditioning": sum(norms.values()) / delta_norm if delta_norm > 0 else None,
            "decomposition_residual": float(flat_norm(residual)) / delta_norm if delta_norm > 0 else 0.0,
            "attribution": pending.attribution,
            "first_order": pending.first_by_part,
            "second_order": pending.second_by_pair,
        }
        if pending.first_order_errors:
            record["update"]["first_order_standard_error"] = pending.first_order_errors
        return record

    def _exact_counterfactual(self, optimizer: torch.optim.Optimizer, shared: Mapping[str, nn.Parameter],
                              gradients: dict[str, Params], linear: bool) -> AdamCounterfactual | None:
        """Under Adam with two objectives or more, the step Adam would take with other weights
        (None under SGD, whose record gives every weight vector's step exactly)."""
        if linear or len(self.objectives) < 2:
            return None
        return AdamCounterfactual(optimizer, shared, gradients, adam_settings(optimizer, shared))

    @staticmethod
    def _first_order_errors(optimizer: torch.optim.Optimizer, shared: Mapping[str, nn.Parameter],
                            coalitions: CoalitionMoments | None, parts: dict[str, Params],
                            downstream_grad: Params) -> dict[str, float] | None:
        """Sampled Shapley parts (many objectives under Adam): each player's Monte-Carlo standard
        error of its first-order term ``∇D·d_k``."""
        if coalitions is None or coalitions.exact:
            return None
        s = adam_settings(optimizer, shared)
        active = set(stepped(shared))
        full_step = {n: sum(parts[p][n] for p in coalitions.players) for n in shared}  # the parts add up to u_N
        gradient = {n: t if n in active else torch.zeros_like(t) for n, t in downstream_grad.items()}
        return coalitions.first_order_errors(full_step, gradient, s.lr, s.beta1, s.beta2, s.eps)

    def attribution_report(self, top: int) -> dict[str, Any]:
        return self.attribution.top(top, self.decode)

    def _per_sample(
        self, name: str, batch: CorruptedBatch | Any, shared: Params, downstream_grad: Params, gradient: Params,
        scaled_downstream: Params | None, split: StepDecomposition, weight: float,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Every example's ``⟨∇ℓ_i, ∇D⟩``, its ``⟨∇ℓ_i, g_k⟩`` (for the cosine's interval), its
        first-order score ``⟨∇ℓ_i, A ∇D⟩`` before the weight (``A`` the step's fresh-gradient
        map) and its ``‖∇ℓ_i‖²`` (the noise of the batch's mean), over the whole batch in row order."""
        if self.local_batches:
            local, sharded = batch, self.group.distributed
        else:
            local, sharded = local_rows(self.group, self.objectives[name], batch)
        function = ObjectiveFunction(self.model, self.objectives[name], local, shared=self.shared)
        directions = [downstream_grad, gradient]
        if scaled_downstream is not None and weight != 0:
            directions.append(scaled_downstream)
        per_example, squared_norms, method = per_sample_dots_and_norms(function, shared, directions,
                                                                       self.per_sample_method, self.ghost_checks)
        self.methods_used.add(method)
        per_example = [*per_example, squared_norms]
        if sharded:  # every process's rows, in row order
            per_example = self.group.all_gather(per_example)
        *per_example, squared_norms = per_example
        dots_np, self_np = (t.detach().double().cpu().numpy() for t in per_example[:2])
        if scaled_downstream is None:
            scores = split.scale * dots_np
        elif weight != 0:
            scores = per_example[2].detach().double().cpu().numpy()
        else:
            scores = np.zeros_like(dots_np)
        return dots_np, self_np, scores, squared_norms.detach().double().cpu().numpy()

    def _spectrum(self, curvature: Curvature, shared: Params, downstream_grad: Params,
                  gradients: dict[str, Params]) -> Spectrum:
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

