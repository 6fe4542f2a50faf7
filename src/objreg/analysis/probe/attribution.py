"""Which pre-training examples helped or hurt the downstream task (TracIn-style, in-run).

An example ``i`` of objective ``k`` drawn at step ``t`` moves the parameters by its share of the
update, ``d_{k,i} = −A(α_k ∇ℓ_i / B)`` (``A = η I`` for SGD, the preconditioner for Adam, see
:mod:`objreg.analysis.math.optimizers`), so its first-order effect on the downstream loss is
``∇D·d_{k,i}``; its *score* is the improvement ``−∇D·d_{k,i} = α_k/B · ⟨∇ℓ_i, A ∇D⟩`` (positive:
it helped). This is TracIn (Pruthi et al. 2020) evaluated along the actual trajectory: an
example's score sums over the probe steps that drew it (the same text drawn twice counts twice,
under different corruptions). The scores of one objective at one step add up to that objective's
first-order part of the predicted improvement with SGD. Under Adam ``A`` is the step's
fresh-gradient map (the preconditioner times ``η(1−β₁)/(1−β₁ᵗ)``): the scores add up to each
objective's *fresh, linearised* share of the step (``totals``), not to its Shapley part, which
also holds the momentum its earlier examples built and Adam's nonlinearity.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class _Entry:
    objective: str
    token_ids: tuple[int, ...]
    score: float = 0.0
    steps: list[int] = field(default_factory=list)


class ExampleScores:
    """Scores of pre-training examples, accumulated over probe steps (plain data: checkpointable)."""

    def __init__(self) -> None:
        self.entries: dict[tuple[str, tuple[int, ...]], _Entry] = {}

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, objective: str, step: int, token_ids: Sequence[Sequence[int]], scores: Sequence[float]) -> None:
        """Add one step's scores of a batch; ``token_ids`` are the uncorrupted examples' ids
        without special tokens and padding (they identify an example and give its text)."""
        for ids, score in zip(token_ids, scores):
            key = (objective, tuple(ids))
            entry = self.entries.setdefault(key, _Entry(objective, key[1]))
            entry.score += float(score)
            entry.steps.append(step)

    def state_dict(self) -> list[list[Any]]:
        """The scores as plain lists (for a checkpoint)."""
        return [[e.objective, list(e.token_ids), e.score, list(e.steps)] for e in self.entries.values()]

    def load_state_dict(self, state: list[list[Any]]) -> None:
        """Replace the scores with those of :meth:`state_dict`."""
        self.entries = {}
        for objective, ids, score, steps in state:
            self.entries[(objective, tuple(ids))] = _Entry(objective, tuple(ids), float(score), list(steps))

    def top(self, n: int, decode: Callable[[Sequence[int]], str] | None = None) -> dict[str, Any]:
        """The ``n`` most helpful (largest positive score) and ``n`` most harmful (most negative)
        examples, each ``{"objective", "score", "steps", "text"}``; ``text`` is decoded by
        ``decode`` (token ids joined by spaces without one); ``totals``: every objective's
        summed scores."""

        def describe(entry: _Entry) -> dict[str, Any]:
            text = decode(entry.token_ids) if decode else " ".join(map(str, entry.token_ids))
            return {"objective": entry.objective, "score": entry.score, "steps": list(entry.steps), "text": text}

        ranked = sorted(self.entries.values(), key=lambda e: (e.score, e.objective, e.token_ids))
        helpful = [describe(e) for e in reversed(ranked) if e.score > 0][:n]
        harmful = [describe(e) for e in ranked if e.score < 0][:n]
        totals: dict[str, float] = {}
        for entry in self.entries.values():
            totals[entry.objective] = totals.get(entry.objective, 0.0) + entry.score
        return {"examples": len(self.entries), "totals": totals, "helpful": helpful, "harmful": harmful}
