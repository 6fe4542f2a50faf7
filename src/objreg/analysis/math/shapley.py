"""Adam's step attributed to the objectives: Shapley values over coalitions of objectives, each
coalition keeping its own Adam moments from the start of the run.

Under Adam the step is not linear in the objectives' gradients: the preconditioner
``1/(√v̂ + ε)`` is built from all of them together, and the momentum carries earlier steps'
gradients. Splitting the step with the shared preconditioner held fixed is exact but
ill-conditioned (where gradients nearly cancel, each part is huge and opposite) and leaves the
momentum to nobody. Instead, every *coalition* ``S`` of players (objectives, plus Adam's coupled
weight decay where there is one) is given the Adam run it would have had along the actual
trajectory: its own moments built from ``G_S(t) = Σ_{k∈S} α_k(t) g_k(t)`` at every step,

    m_S ← β₁ m_S + (1−β₁) G_S,   v_S ← β₂ v_S + (1−β₂) G_S²,
    u_S = −η/(1−β₁ᵗ) · m_S / (√(v_S/(1−β₂ᵗ)) + ε)          (u_∅ = 0)

and the full coalition's step ``u_N`` is the optimizer's own (read off its state). Player ``k``'s
part is its Shapley value,

    φ_k = Σ_{S ⊆ N∖{k}} |S|! (n−|S|−1)! / n! · (u_{S∪{k}} − u_S)

(elementwise), which is: exact (``Σ_k φ_k = u_N``, the step), symmetric, zero for a player that
never had a gradient, the linear split itself when the step is linear (SGD), and bounded: every
``u_S`` is an Adam step, each coordinate at most ``η·C(β₁, β₂)`` (exactly ``η`` at the first step
for ``|G| ≫ ε``), and ``φ_k`` is a weighted average of differences of two of them, so no part
exceeds ``2 max_S |u_S|`` in any coordinate however the gradients cancel. Momentum is attributed
by construction: ``m_S`` holds only ``S``'s past gradients.

``n`` players need ``2ⁿ − 2`` tracked coalitions (``∅`` is zero and ``N`` is the optimizer's),
each two tensors the size of the shared parameters: up to :data:`MAX_EXACT_PLAYERS` players
(four objectives and Adam's coupled weight decay) all of them are tracked and the values are
exact Shapley values. Above that a fixed, seeded set of :data:`SAMPLED_PERMUTATIONS` permutations
(antithetic pairs: each with its reverse) is drawn at the start, and ``φ_k`` is the mean over
them of ``k``'s marginal step ``u_{P∪{k}} − u_P`` (``P`` the players before ``k``): the usual
Monte-Carlo estimate of the Shapley value, still exact in sum (each permutation's marginals
telescope to ``u_N``) and still bounded, with at most ``SAMPLED_PERMUTATIONS·(n−1)`` coalitions
tracked. Its Monte-Carlo error is reported: the antithetic pairs are independent draws, so the
standard error of a part's first-order term ``∇D·φ_k`` is the standard deviation of the pairs'
estimates over ``√(pairs)`` (:meth:`CoalitionMoments.first_order_errors`).

**Memory.** The moments are ``2(2ⁿ − 2)`` parameter-sized tensors (4, 12, 28 at 2, 3, 4 players:
14× Adam's own state at four), so they can be kept in ``bfloat16`` (half the bytes) or on another
device (``"cpu"``: off the accelerator; each step moves them there and back). bfloat16 keeps 8 bits
of mantissa, and Adam's ``v ← β₂ v + (1 − β₂) G²`` adds ``0.1%`` of ``v`` per step at ``β₂ = 0.999``,
under half of bfloat16's spacing: rounded to nearest, ``v`` would stop moving once it is
``(1 − β₂)⁻¹/256 ≈ 4`` steps' worth. So each update is computed in the gradients' dtype and stored
by **stochastic rounding** (rounded up with probability the discarded fraction, from the seeded
``moment_rounding`` stream): unbiased, so the moments follow the exact ones to a relative error
that does not grow with the run (measured: docs/performance.md). float16 is refused: ``G²`` of a
typical gradient (below 2.4e-4) lies under its smallest normal number.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from objreg.analysis.math.functional import Params
from objreg.core.errors import InvalidParameterError
from objreg.toolkit.randomness import stream, stream_seed

MAX_EXACT_PLAYERS = 5
SAMPLED_PERMUTATIONS = 16
#: The dtypes the moments may be kept in (None: the gradients' own).
MOMENT_DTYPES = (None, torch.float32, torch.float64, torch.bfloat16)


def stochastic_bfloat16(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """``x`` (float32) rounded to bfloat16 stochastically: up to the next representable value
    with probability the fraction of the spacing cut off, so the rounding is unbiased. The 16
    low bits of each float32 get a uniform 16-bit draw added before they are cut."""
    bits = x.contiguous().view(torch.int32)
    noise = torch.randint(0, 1 << 16, x.shape, generator=generator, dtype=torch.int32, device=x.device)
    rounded = (bits + noise).bitwise_and_(-65536)  # 0xFFFF0000: the bfloat16 bits of the float32
    return rounded.view(torch.float32).to(torch.bfloat16)  # exact: nothing is left below bfloat16

def exact_coefficients(n: int) -> dict[int, list[float]]:
    """``c[mask][k]``: the weight of ``u_S`` (``S`` the players whose bits are set in ``mask``) in
    player ``k``'s Shapley value, for every non-empty ``S``; ``φ_k = Σ_S c[S][k] u_S``."""
    weight = [math.factorial(s) * math.factorial(n - s - 1) / math.factorial(n) for s in range(n)]
    coefficients: dict[int, list[float]] = {}
    for mask in range(1, 2**n):
        size = bin(mask).count("1")
        # k ∈ S: u_S enters as u_{(S∖k)∪k}, weight w(|S|−1); k ∉ S: as −u_S, weight w(|S|).
        coefficients[mask] = [weight[size - 1] if mask >> k & 1 else -weight[size] for k in range(n)]
    return coefficients


def permutation_coefficients(n: int, permutations: Sequence[Sequence[int]]) -> dict[int, list[float]]:
    """The same for the mean over ``permutations`` of each player's marginal step."""
    coefficients: dict[int, list[float]] = {}
    share = 1.0 / len(permutations)
    for order in permutations:
        before = 0
        for k in order:
            after = before | 1 << k
            coefficients.setdefault(after, [0.0] * n)[k] += share
            if before:
                coefficients.setdefault(before, [0.0] * n)[k] -= share
            before = after
    return {mask: c for mask, c in sorted(coefficients.items()) if any(c)}


def sampled_permutations(n: int, count: int, generator: torch.Generator) -> list[list[int]]:
    """``count`` permutations of ``n`` players in antithetic pairs (a random order and its reverse)."""
    orders = []
    for _ in range(max(count // 2, 1)):
        order = torch.randperm(n, generator=generator).tolist()
        orders += [order, order[::-1]]
    return orders


class CoalitionMoments:
    """The Adam moments of every coalition of ``players`` that the attribution needs, tracked along
    the actual trajectory (see the module docstring). Plain tensors: checkpointable.

    Args:
        players: The objectives, in the report's order (plus ``weight_decay`` for Adam's
            coupled decay).
        seed: Seeds the permutations drawn above :data:`MAX_EXACT_PLAYERS` players (and the
            stochastic rounding of bfloat16 moments).
        dtype: The dtype the moments are kept in: None (the gradients'), ``torch.float32``,
            ``torch.float64`` or ``torch.bfloat16`` (stochastically rounded; module docstring).
        device: Where the moments are kept (None: beside the gradients; ``"cpu"``: off the
            accelerator, moved to the gradients' device for each update and back).
    """

    def __init__(self, players: Sequence[str], seed: int = 0, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None):
        if dtype not in MOMENT_DTYPES:
            hint = (": G² of a typical gradient lies under float16's smallest normal number; use torch.bfloat16"
                    if dtype == torch.float16 else "")
            raise InvalidParameterError(f"the coalition moments' dtype must be None, torch.float32, torch.float64 or "
                                        f"torch.bfloat16, got {dtype!r}{hint}")
        try:
            self.device = None if device is None else torch.device(device)
        except (RuntimeError, TypeError):
            raise InvalidParameterError(f"the coalition moments' device must be a torch.device or its name, got "
                                        f"{device!r}") from None
        self.dtype = dtype
        self.rounding_seed = stream_seed(seed, "moment_rounding")
        self._generators: dict[str, torch.Generator] = {}  # one per device the rounding draws on
        self.players = list(players)
        n = len(self.players)
        if n <= MAX_EXACT_PLAYERS:
            self.exact = True
            self.coefficients = exact_coefficients(n)
        else:
            self.exact = False
            generator = stream(seed, "permutations")
            self.permutations = sampled_permutations(n, SAMPLED_PERMUTATIONS, generator)
            self.coefficients = permutation_coefficients(n, self.permutations)
        self.full = 2**n - 1
        self.tracked = [mask for mask in self.coefficients if mask != self.full]
        self.exp_avg: dict[int, Params] = {}
        self.exp_avg_sq: dict[int, Params] = {}
        self.steps: dict[str, int] = {}

    def members(self, mask: int) -> list[str]:
        return [p for k, p in enumerate(self.players) if mask >> k & 1]

    def coalition_gradient(self, mask: int, contributions: Mapping[str, Params], name: str) -> torch.Tensor | None:
        """``G_S`` on one parameter: the sum of its members' contributions, in player order (None: no member has one)."""
        total = None
        for player in self.members(mask):
            part = contributions.get(player)
            if part is None:
                continue
            total = part[name] if total is None else total + part[name]
        return total

    def advance(self, contributions: Mapping[str, Params], stepped: Sequence[str], beta1: float, beta2: float) -> None:
        """Take this step's gradients into every tracked coalition's moments. ``contributions``:
        each player's ``α_k g_k`` on the shared parameters; ``stepped``: the parameters the
        optimizer updates this step (those with a gradient), whose step counts advance."""
        for name in stepped:
            like = next(iter(contributions.values()))[name]
            self.steps[name] = self.steps.get(name, 0) + 1
            for mask in self.tracked:
                gradient = self.coalition_gradient(mask, contributions, name)
                if gradient is None:
                    gradient = torch.zeros_like(like)
                m = self._loaded(self.exp_avg.setdefault(mask, {}).get(name), gradient)
                v = self._loaded(self.exp_avg_sq.setdefault(mask, {}).get(name), gradient)
                m = (1 - beta1) * gradient if m is None else beta1 * m + (1 - beta1) * gradient
                v = (1 - beta2) * gradient * gradient if v is None else beta2 * v + (1 - beta2) * gradient * gradient
                self.exp_avg[mask][name], self.exp_avg_sq[mask][name] = self._stored(m), self._stored(v)

    def _loaded(self, kept: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor | None:
        """A kept moment in the gradients' dtype and on their device (itself when it is already)."""
        return None if kept is None else kept.to(device=like.device, dtype=like.dtype)

    def _stored(self, value: torch.Tensor) -> torch.Tensor:
        """``value`` as the moments are kept (itself in the default float, same-device case)."""
        if self.dtype == torch.bfloat16 and value.dtype != torch.bfloat16:
            key = str(value.device)
            if key not in self._generators:
                self._generators[key] = torch.Generator(device=value.device).manual_seed(self.rounding_seed)
            value = stochastic_bfloat16(value.float(), self._generators[key])
        elif self.dtype is not None:
            value = value.to(self.dtype)
        return value if self.device is None else value.to(self.device)

    def coalition_step(self, mask: int, name: str, lr: float, beta1: float, beta2: float, eps: float,
                       like: torch.Tensor) -> torch.Tensor:
        """``u_S`` on one parameter (zeros where the coalition has no moments yet)."""
        m = self._loaded(self.exp_avg.get(mask, {}).get(name), like)
        if m is None:
            return torch.zeros_like(like)
        step = self.steps[name]
        bias1, bias2 = 1 - beta1**step, 1 - beta2**step
        v = self._loaded(self.exp_avg_sq[mask][name], like)
        return -lr / bias1 * m / (v.sqrt() / math.sqrt(bias2) + eps)

    def shapley(self, full_step: Params, lr: float, beta1: float, beta2: float, eps: float) -> dict[str, Params]:
        """Every player's part ``φ_k`` of the step; ``full_step``: ``u_N``, the optimizer's step
        without decoupled weight decay. The parts add up to ``full_step`` (to rounding)."""
        parts: dict[str, Params] = {p: {} for p in self.players}
        for name, like in full_step.items():
            totals = [torch.zeros_like(like) for _ in self.players]
            for mask, coefficients in self.coefficients.items():
                u = full_step[name] if mask == self.full else self.coalition_step(mask, name, lr, beta1, beta2, eps,
                                                                                  like)
                for k, c in enumerate(coefficients):
                    if c:
                        totals[k] = totals[k] + c * u
            for player, total in zip(self.players, totals):
                parts[player][name] = total
        return parts

    def first_order_errors(self, full_step: Params, downstream_grad: Params, lr: float, beta1: float, beta2: float,
                           eps: float) -> dict[str, float]:
        """The Monte-Carlo standard error of each player's first-order term ``∇D·φ_k`` (sampled
        values only): each antithetic pair of permutations is one independent estimate of the
        Shapley value, ``∇D·φ_k`` is the mean of the pairs' ``∇D``-projections, and its standard
        error their standard deviation over ``√(pairs)``. ``downstream_grad``: ``∇D``, zero
        where the step leaves a parameter alone."""
        if self.exact:
            return {}
        projected = {}  # ∇D·u_S for every coalition any permutation passes through
        for mask in self.coefficients:
            projected[mask] = sum(
                float((downstream_grad[name] * (full_step[name] if mask == self.full else self.coalition_step(
                    mask, name, lr, beta1, beta2, eps, like))).sum())
                for name, like in full_step.items())
        pairs = [self.permutations[i:i + 2] for i in range(0, len(self.permutations), 2)]
        estimates = [[sum(c[k] * projected[mask] for mask, c in permutation_coefficients(len(self.players),
                                                                                          pair).items())
                      for k in range(len(self.players))] for pair in pairs]
        spread = torch.tensor(estimates, dtype=torch.float64).std(dim=0, correction=1) / math.sqrt(len(pairs))
        return dict(zip(self.players, map(float, spread)))

    def state_dict(self) -> dict[str, Any]:
        state = {
            "players": list(self.players),
            "steps": dict(self.steps),
            "exp_avg": {str(mask): dict(v) for mask, v in self.exp_avg.items()},
            "exp_avg_sq": {str(mask): dict(v) for mask, v in self.exp_avg_sq.items()},
        }
        if self._generators:  # bfloat16 moments: where the rounding's draws go on
            state["rounding"] = {key: g.get_state() for key, g in self._generators.items()}
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if list(state["players"]) != self.players:
            raise ValueError(f"coalition players differ: {state['players']} vs {self.players}")
        self.steps = {n: int(s) for n, s in state["steps"].items()}
        self.exp_avg = {int(mask): {n: self._stored(t) for n, t in v.items()} for mask, v in state["exp_avg"].items()}
        self.exp_avg_sq = {int(mask): {n: self._stored(t) for n, t in v.items()}
                           for mask, v in state["exp_avg_sq"].items()}
        self._generators = {}
        for key, generator_state in state.get("rounding", {}).items():
            self._generators[key] = torch.Generator(device=key)
            self._generators[key].set_state(generator_state)

    @property
    def tensors(self) -> int:
        """Parameter-sized tensors the moments hold (two per tracked coalition)."""
        return 2 * len(self.tracked)

    @property
    def description(self) -> str:
        n = len(self.players)
        if self.exact:
            return f"exact Shapley values over {n} players ({len(self.tracked)} coalitions tracked)"
        return (f"Shapley values estimated over {SAMPLED_PERMUTATIONS} seeded permutations of {n} players "
                f"({len(self.tracked)} coalitions tracked)")
