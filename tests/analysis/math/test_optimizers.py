"""The split of an optimizer's step into per-objective parts: it adds up to the step taken, and
under Adam each part is the Shapley value of coalitions whose steps, computed here by replaying
each coalition's gradients through a fresh ``torch.optim.Adam``, are the brute-force reference."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from scipy import stats as scipy_stats
from torch import nn

import objreg
from objreg.analysis.math.optimizers import WEIGHT_DECAY, adam_settings, advance, decompose, make_optimizer, players
from objreg.analysis.math.shapley import (
    MAX_EXACT_PLAYERS,
    SAMPLED_PERMUTATIONS,
    CoalitionMoments,
    exact_coefficients,
    permutation_coefficients,
    sampled_permutations,
)
from objreg.analysis.math.taylor import weighted_sum

OPTIMIZERS = {
    "sgd": lambda params: make_optimizer("sgd", params, 0.1),
    "adam": lambda params: make_optimizer("adam", params, 0.01),
    "adamw": lambda params: make_optimizer("adamw", params, 0.01),
    "adam_l2": lambda params: torch.optim.Adam(params, lr=0.01, weight_decay=0.1, betas=(0.8, 0.95)),
    "adamw_foreach_off": lambda params: torch.optim.AdamW(params, lr=0.01, weight_decay=0.2, foreach=False),
}


def parameters(seed=0):
    generator = torch.Generator().manual_seed(seed)
    return {"a": nn.Parameter(torch.randn(3, 4, generator=generator, dtype=torch.float64)),
            "b": nn.Parameter(torch.randn(5, generator=generator, dtype=torch.float64))}


def random_gradients(params, names, generator, scale=1.0):
    return {k: {n: scale * torch.randn(p.shape, generator=generator, dtype=p.dtype) for n, p in params.items()}
            for k in names}


class Run:
    """An optimizer on ``params`` with the coalition moments the analysis keeps, stepped on given
    per-objective gradients; records what the brute force needs (every step's contributions,
    the parameters before it, and the parts the analysis gave)."""

    def __init__(self, kind, params, names, seed=0):
        self.params = params
        self.optimizer = OPTIMIZERS[kind](list(params.values()))
        self.settings = adam_settings(self.optimizer, params)
        self.coalitions = (CoalitionMoments(players(names, self.settings), seed=seed) if self.settings is not None
                           else None)
        self.history = []

    def step(self, weights, gradients):
        for n, p in self.params.items():
            p.grad = sum(weights[k] * gradients[k][n] for k in weights)
        if self.coalitions is not None:
            advance(self.coalitions, self.optimizer, self.params, weights, gradients)
        state_before = {id(p): {k: v.clone() for k, v in self.optimizer.state[p].items()} for p in self.params.values()}
        split = decompose(self.optimizer, self.params, weights, gradients, self.coalitions)
        for p in self.params.values():  # reading the state changed nothing
            assert all(torch.equal(v, state_before[id(p)][k]) for k, v in self.optimizer.state[p].items())
        before = {n: p.detach().clone() for n, p in self.params.items()}
        self.optimizer.step()
        delta = {n: p.detach() - before[n] for n, p in self.params.items()}
        contributions = {k: {n: weights[k] * gradients[k][n] for n in self.params} for k in weights}
        if self.settings is not None and self.settings.coupled_decay:
            contributions[WEIGHT_DECAY] = {n: self.settings.decay * before[n] for n in self.params}
        self.history.append({"contributions": contributions, "before": before, "delta": delta, "split": split})
        return split, delta


@pytest.mark.parametrize("kind", list(OPTIMIZERS))
def test_parts_add_up_to_the_step_taken(kind):
    params = parameters()
    weights = {"mlm": 1.0, "sop": 0.5}
    run = Run(kind, params, list(weights))
    generator = torch.Generator().manual_seed(1)
    for _step in range(4):
        split, delta = run.step(weights, random_gradients(params, weights, generator))
        predicted = weighted_sum(split.parts, delta)
        for n in params:
            torch.testing.assert_close(predicted[n], delta[n], rtol=1e-12, atol=1e-15)
        expected = {"mlm", "sop"} | ({WEIGHT_DECAY} if kind in ("adamw", "adam_l2", "adamw_foreach_off") else set())
        assert set(split.parts) == expected
        assert split.attribution == ("linear" if kind == "sgd" else "shapley")
        assert split.rule.startswith("sgd" if kind == "sgd" else "adam")


def replayed_steps(run, members, settings):
    """``u_S`` at every step of ``run`` for the coalition ``members``: a fresh ``torch.optim.Adam``
    (no decay: decoupled decay is a part of its own, coupled decay is a player) stepped on the
    members' summed contributions, one parameter per shared tensor."""
    replica = {n: nn.Parameter(torch.zeros_like(p)) for n, p in run.params.items()}
    optimizer = torch.optim.Adam(list(replica.values()), lr=settings.lr, betas=(settings.beta1, settings.beta2),
                                 eps=settings.eps, foreach=False)
    steps = []
    for record in run.history:
        for n, p in replica.items():
            p.grad = sum(record["contributions"][k][n] for k in members) if members else torch.zeros_like(p)
        before = {n: p.detach().clone() for n, p in replica.items()}
        optimizer.step()
        steps.append({n: p.detach() - before[n] for n, p in replica.items()})
    return steps


def brute_force_shapley(run, settings):
    """Every player's Shapley value at every step, enumerating permutations of the players over
    coalition steps replayed one by one; the full coalition's step is the actual one (less
    AdamW's decoupled decay)."""
    names = run.coalitions.players
    steps = len(run.history)
    full = []
    for record in run.history:
        decay = ({n: -settings.lr * settings.decay * record["before"][n] for n in run.params}
                 if settings.decay and settings.decoupled else {n: 0.0 for n in run.params})
        full.append({n: record["delta"][n] - decay[n] for n in run.params})
    cache = {}

    def u(coalition, t):
        key = frozenset(coalition)
        if not key:
            return {n: torch.zeros_like(p) for n, p in run.params.items()}
        if len(key) == len(names):
            return full[t]
        if key not in cache:
            cache[key] = replayed_steps(run, [k for k in names if k in key], settings)
        return cache[key][t]

    values = []
    orders = list(itertools.permutations(names))
    for t in range(steps):
        phi = {k: {n: torch.zeros_like(p) for n, p in run.params.items()} for k in names}
        for order in orders:
            before = []
            for k in order:
                with_k, without_k = u([*before, k], t), u(before, t)
                for n in run.params:
                    phi[k][n] += (with_k[n] - without_k[n]) / len(orders)
                before.append(k)
        values.append(phi)
    return values


@pytest.mark.parametrize("kind", ["adam", "adamw", "adam_l2"])
def test_adam_parts_are_shapley_values_of_replayed_coalition_steps(kind):
    params = parameters(3)
    weights = {"mlm": 1.0, "sop": 0.5, "nsp": 0.25}
    run = Run(kind, params, list(weights))
    generator = torch.Generator().manual_seed(4)
    for step in range(5):
        # A schedule: nsp is off at step 2, so its part then is only what its earlier momentum carries.
        step_weights = {**weights, "nsp": 0.0 if step == 2 else weights["nsp"]}
        run.step(step_weights, random_gradients(params, weights, generator))
    expected = brute_force_shapley(run, run.settings)
    assert len(run.coalitions.players) == (4 if kind == "adam_l2" else 3)
    for t, record in enumerate(run.history):
        for k in run.coalitions.players:
            for n in params:
                torch.testing.assert_close(record["split"].parts[k][n], expected[t][k][n], rtol=1e-10, atol=1e-13)
    # The switched-off objective still moves θ at step 2, through the momentum its gradients built.
    assert float(sum(t.abs().sum() for t in run.history[2]["split"].parts["nsp"].values())) > 0


def test_adam_parts_stay_bounded_where_the_objectives_gradients_cancel():
    # sop's gradient is almost exactly −mlm's: the step is tiny next to each gradient. Holding the
    # shared preconditioner fixed (the old split) makes each part huge and opposite; the Shapley
    # parts stay within a few step norms.
    params = parameters(5)
    weights = {"mlm": 1.0, "sop": 1.0}
    run = Run("adam", params, list(weights))
    generator = torch.Generator().manual_seed(6)
    for _ in range(3):
        base = random_gradients(params, ["mlm"], generator)["mlm"]
        noise = random_gradients(params, ["sop"], generator, scale=1e-3)["sop"]
        gradients = {"mlm": base, "sop": {n: -base[n] + noise[n] for n in params}}
        split, delta = run.step(weights, gradients)
        step_norm = math.sqrt(sum(float((t * t).sum()) for t in delta.values()))
        for k in weights:
            part_norm = math.sqrt(sum(float((t * t).sum()) for t in split.parts[k].values()))
            assert part_norm <= 3 * step_norm, (k, part_norm / step_norm)
            # The fixed-preconditioner share of this step's gradient alone, −A(α_k g_k):
            fixed = split.apply({n: weights[k] * gradients[k][n] for n in params})
            assert math.sqrt(sum(float((t * t).sum()) for t in fixed.values())) > 20 * step_norm


def test_coefficients_are_shapley_weights_and_permutations_estimate_them():
    for n in range(1, MAX_EXACT_PLAYERS + 1):
        exact = exact_coefficients(n)
        every_order = permutation_coefficients(n, list(itertools.permutations(range(n))))
        assert set(every_order) == set(exact)
        for mask, c in exact.items():
            assert c == pytest.approx(every_order[mask], abs=1e-15)
        full = 2**n - 1
        # Efficiency: the parts add up to u_N (its coefficients sum to 1, every other u_S's to 0).
        for mask, c in exact.items():
            assert sum(c) == pytest.approx(1.0 if mask == full else 0.0, abs=1e-15)
    orders = sampled_permutations(6, 8, torch.Generator().manual_seed(0))
    assert len(orders) == 8 and all(sorted(o) == list(range(6)) for o in orders)
    assert all(orders[i + 1] == orders[i][::-1] for i in range(0, 8, 2))  # antithetic pairs
    sampled = permutation_coefficients(6, orders)
    for mask, c in sampled.items():
        assert sum(c) == pytest.approx(1.0 if mask == 2**6 - 1 else 0.0, abs=1e-12)


def test_more_than_five_players_use_sampled_permutations_and_still_add_up():
    params = parameters(7)
    weights = {f"o{i}": 1.0 / (i + 1) for i in range(6)}
    run = Run("adamw", params, list(weights))
    assert not run.coalitions.exact and len(run.coalitions.tracked) <= SAMPLED_PERMUTATIONS * 5
    generator = torch.Generator().manual_seed(8)
    for _ in range(3):
        split, delta = run.step(weights, random_gradients(params, weights, generator))
        assert split.attribution == "shapley_sampled"
        predicted = weighted_sum(split.parts, delta)
        for n in params:
            torch.testing.assert_close(predicted[n], delta[n], rtol=1e-12, atol=1e-15)


def test_five_players_are_exact():
    # Four objectives and Adam's coupled weight decay: the case the sampled estimate got 33% wrong.
    run = Run("adam_l2", parameters(8), [f"o{i}" for i in range(4)])
    assert run.coalitions.exact and len(run.coalitions.players) == 5 and len(run.coalitions.tracked) == 2**5 - 2


def test_sampled_parts_carry_a_standard_error_that_covers_the_exact_part():
    """Six players, sampled permutations (each seed its own): the t interval of each part's
    first-order term ``d·φ_k`` from its Monte-Carlo standard error covers the exact Shapley
    value's (brute force over all 720 orders) about 95% of the time."""
    pairs = SAMPLED_PERMUTATIONS // 2
    quantile = float(scipy_stats.t.ppf(0.975, pairs - 1))
    covered, scaled = [], []
    for seed in range(10):
        params = parameters(20 + seed)
        weights = {f"o{i}": 1.0 / (i + 1) for i in range(6)}
        run = Run("adam", params, list(weights), seed=seed)
        generator = torch.Generator().manual_seed(40 + seed)
        for _ in range(3):
            split, delta = run.step(weights, random_gradients(params, weights, generator))
        exact = brute_force_shapley(run, run.settings)[-1]
        direction = {n: torch.randn(p.shape, generator=generator, dtype=p.dtype) for n, p in params.items()}
        s = run.settings
        errors = run.coalitions.first_order_errors(delta, direction, s.lr, s.beta1, s.beta2, s.eps)
        assert set(errors) == set(weights)
        for k in weights:
            sampled = sum(float((direction[n] * split.parts[k][n]).sum()) for n in params)
            truth = sum(float((direction[n] * exact[k][n]).sum()) for n in params)
            covered.append(abs(sampled - truth) <= quantile * errors[k])
            scaled.append(abs(sampled - truth) / errors[k])
    assert sum(covered) / len(covered) >= 0.85, sum(covered) / len(covered)
    assert 0.3 < float(np.median(scaled)) < 2.0  # an error bar of the error's size, neither vacuous nor tight
    assert run.coalitions.first_order_errors(delta, direction, s.lr, s.beta1, s.beta2, s.eps) == errors
    assert Run("adam", parameters(), ["a", "b"]).coalitions.first_order_errors({}, {}, 0.1, 0.9, 0.99, 1e-8) == {}


def test_coalition_moments_checkpoint_and_continue():
    params = parameters()
    weights = {"mlm": 1.0, "sop": 0.5}
    run = Run("adamw", params, list(weights))
    generator = torch.Generator().manual_seed(9)
    for _ in range(2):
        run.step(weights, random_gradients(params, weights, generator))
    copy = CoalitionMoments(run.coalitions.players)
    copy.load_state_dict(run.coalitions.state_dict())
    gradients = random_gradients(params, weights, generator)
    for n, p in params.items():
        p.grad = sum(weights[k] * gradients[k][n] for k in weights)
    for moments in (run.coalitions, copy):
        advance(moments, run.optimizer, params, weights, gradients)
    first = decompose(run.optimizer, params, weights, gradients, run.coalitions)
    second = decompose(run.optimizer, params, weights, gradients, copy)
    for k in first.parts:
        assert all(torch.equal(first.parts[k][n], second.parts[k][n]) for n in params)
    with pytest.raises(ValueError, match="players differ"):
        CoalitionMoments(["sop", "mlm"]).load_state_dict(run.coalitions.state_dict())


def test_sgd_part_is_minus_lr_times_the_weighted_gradient():
    params = parameters()
    optimizer = make_optimizer("sgd", list(params.values()), 0.25)
    for p in params.values():
        p.grad = torch.ones_like(p)
    ones = {n: torch.ones_like(p) for n, p in params.items()}
    split = decompose(optimizer, params, {"mlm": 2.0}, {"mlm": ones})
    assert split.scale == 0.25 and split.diagonal is None and set(split.parts) == {"mlm"}
    assert all(torch.equal(t, torch.full_like(t, -0.5)) for t in split.parts["mlm"].values())


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9), "plain SGD only"),
        (lambda ps: torch.optim.Adam(ps, lr=0.1, amsgrad=True), "without amsgrad"),
        (lambda ps: torch.optim.RMSprop(ps, lr=0.1), "cannot split the step of RMSprop"),
    ],
)
def test_unsupported_optimizers_are_clear_errors(build, message):
    params = parameters()
    with pytest.raises(objreg.InvalidParameterError, match=message):
        decompose(build(list(params.values())), params, {}, {})
    with pytest.raises(objreg.InvalidParameterError, match="optimizer must be one of"):
        make_optimizer("lamb", list(params.values()), 0.1)


def test_adam_without_coalition_moments_is_a_clear_error():
    params = parameters()
    optimizer = make_optimizer("adam", list(params.values()), 0.1)
    with pytest.raises(objreg.InvalidParameterError, match="coalition moments"):
        decompose(optimizer, params, {}, {})
