"""Lengths: distributions over span lengths (in words), SpanBERT's clipped geometric, empirical
ones from a ``"1:0.4,2:0.3"`` string and the answer lengths of a SQuAD-format file; and the
longest-first cut of several texts to a token budget."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import torch

from objreg.core.errors import DataError, InvalidParameterError
from objreg.toolkit.squadfiles import read_squad

if TYPE_CHECKING:
    from objreg.toolkit.tokenizer import Tokenizer

class LengthDistribution(NamedTuple):
    """A distribution over span lengths (in words): ``lengths`` ``[L]`` long, ``probs`` ``[L]``."""

    lengths: torch.Tensor
    probs: torch.Tensor

    @property
    def mean(self) -> float:
        return float((self.lengths.double() * self.probs.double()).sum())

    def sample(self, shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
        """Lengths of ``shape``, drawn on the generator's device."""
        count = math.prod(shape)
        picks = torch.multinomial(self.probs.to(generator.device), max(count, 1), replacement=True, generator=generator)
        return self.lengths.to(generator.device)[picks[:count]].view(shape)


def geometric_lengths(p: float, lower: int = 1, upper: int = 10) -> LengthDistribution:
    """SpanBERT's span lengths: ``P(ℓ) ∝ p (1-p)^(ℓ-lower)`` on ``lower..upper`` (p=0.2, 1..10:
    mean 1/p - n q^n / (1 - q^n) = 3.797 words, q = 1-p, n = 10)."""
    if not 0 < p <= 1 or not 1 <= lower <= upper:
        raise InvalidParameterError(
            f"geometric span lengths need 0 < p <= 1 and 1 <= lower <= upper, got {p}, {lower}, {upper}"
        )
    lengths = torch.arange(lower, upper + 1)
    probs = p * (1 - p) ** (lengths - lower).double()
    return LengthDistribution(lengths, probs / probs.sum())


def parse_lengths(text: str) -> LengthDistribution:
    """An empirical distribution from ``"1:0.4,2:0.3,3:0.3"`` (length:weight pairs; the weights are
    normalised, so counts work too)."""
    pairs: dict[int, float] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        match = re.fullmatch(r"(\d+)\s*:\s*([0-9.eE+-]+)", item)
        try:
            length, weight = int(match[1]), float(match[2])  # type: ignore[index]
        except (TypeError, ValueError):
            raise InvalidParameterError(
                f"span lengths: {item!r} is not length:weight (write e.g. \"1:0.4,2:0.3,3:0.3\")"
            ) from None
        if length < 1 or not math.isfinite(weight) or weight < 0:
            raise InvalidParameterError(f"span lengths: {item!r} needs a length >= 1 and a finite weight >= 0")
        pairs[length] = pairs.get(length, 0.0) + weight
    total = sum(pairs.values())
    if not pairs or total <= 0:
        raise InvalidParameterError(f"span lengths {text!r}: give at least one length with a positive weight, "
                                    f"e.g. \"1:0.4,2:0.3,3:0.3\"")
    lengths = sorted(pairs)
    probs = torch.tensor([pairs[n] / total for n in lengths], dtype=torch.float64)
    return LengthDistribution(torch.tensor(lengths), probs)


def format_lengths(distribution: LengthDistribution | Mapping[int, float]) -> str:
    """The ``"1:0.4,2:0.3"`` string :func:`parse_lengths` reads (for the ``empirical_lengths`` param)."""
    if isinstance(distribution, LengthDistribution):
        distribution = dict(zip(distribution.lengths.tolist(), distribution.probs.tolist()))
    return ",".join(f"{n}:{p:.6g}" for n, p in sorted(distribution.items()))


def answer_length_distribution(
    squad_json_path: str | Path, tokenizer: Tokenizer, max_length: int | None = None
) -> dict[int, float]:
    """The distribution of answer lengths, in words as ``tokenizer`` splits them, over the first
    answer of every question of a SQuAD-format file: span masking that imitates what the
    downstream task extracts. ``max_length`` drops longer answers. Returns ``{length: probability}``;
    :func:`format_lengths` turns it into the ``empirical_lengths`` parameter.

    Raises:
        DataError: the file is missing, not SQuAD JSON (:func:`objreg.toolkit.squadfiles.read_squad`),
            or has no answer.
    """
    path = Path(squad_json_path)
    answers = read_squad(path, what="SQuAD file").first_answers
    counts: dict[int, int] = {}
    for _, word_ids in tokenizer.encode_sentences(answers):
        n = len({w for w in word_ids if w >= 0})
        if n > 0 and (max_length is None or n <= max_length):
            counts[n] = counts.get(n, 0) + 1
    total = sum(counts.values())
    if total == 0:
        raise DataError(f"{path} has no answer with at least one word")
    return {n: c / total for n, c in sorted(counts.items())}


def fit_lengths(lengths: Sequence[int], budget: int) -> list[int]:
    """Lengths cut to fit ``budget`` in total, longest first: the result of removing one token at
    a time from the currently longest text (ties: the earlier text keeps the extra token), i.e.
    Hugging Face's ``"longest_first"`` truncation, generalised to n texts."""
    if sum(lengths) <= budget:
        return list(lengths)
    # The largest cap c with sum(min(l, c)) <= budget, then the leftover tokens to the earliest
    # texts that reach the cap.
    cap = max(c for c in range(max(lengths) + 1) if sum(min(n, c) for n in lengths) <= budget)
    out = [min(n, cap) for n in lengths]
    left = budget - sum(out)
    for i, n in enumerate(lengths):
        if left and n > cap:
            out[i] += 1
            left -= 1
    return out
