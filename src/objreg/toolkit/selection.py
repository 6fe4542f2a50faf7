"""Which positions a masking objective selects: maskable positions, whole words, selection
weights of a masking policy, and the two budgets.

* Bernoulli (Hugging Face, RoBERTa-style): each position independently, with probability
  ``min(1, c · w_i)`` where ``c`` makes the expected count ``rate · n`` (:func:`bernoulli_select`),
  plus BERT's ``max(1, ·)``;
* exact (google-research/bert, SpanBERT): units (words, spans) in a weighted random order until a
  fixed token budget is spent (:func:`greedy_fill`). The order comes from Pareto order sampling
  (:func:`pareto_keys`), which keeps each unit's selection probability close to ``min(1, c · w)``
  under the fixed budget, or from Efraimidis & Spirakis keys (:func:`sampling_keys`).

Policies (:func:`policy_weights`): ``uniform``; ``inverse_frequency``, weight ``1 / p(token)`` from
the corpus counts in ``Vocabulary.token_counts``, so every token *type* is masked about equally
often; ``entropy``, weight = the model's surprisal of the token (``TokenBatch.surprisal``, filled in
by the objective's ``objreg_prepare_batch`` with :func:`objreg.toolkit.surprisal.token_surprisal`),
so harder tokens are masked more often.

Everything is vectorised over the batch and draws its randomness from the given generator.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, NamedTuple

import numpy as np
import torch

from objreg.core.errors import DataError, InvalidParameterError
from objreg.core.types import TokenBatch, Vocabulary
from objreg.toolkit.randomness import uniform

POLICIES = ("uniform", "entropy", "inverse_frequency")


#: Rounds of the water-filling in :func:`inclusion_probabilities`; each round can only raise the
#: scale, and rows need more than a few only for extremely skewed weights.
_WATER_FILLING_ROUNDS = 8


def maskable(batch: TokenBatch) -> torch.Tensor:
    """``[B, T]`` bool: real, non-special tokens, the only ones masking may touch."""
    return ~(batch.is_special | batch.is_padding)


class Words(NamedTuple):
    """Whole words of each row, numbered left to right.

    Attributes:
        index: ``[B, T]`` long, the word of each token, ``-1`` at tokens that cannot be masked.
        count: ``[B]`` long, words per row.
        size: ``[B, W]`` long, tokens per word, 0 beyond ``count`` (``W`` = most words in a row, >= 1).
    """

    index: torch.Tensor
    count: torch.Tensor
    size: torch.Tensor


def words(batch: TokenBatch) -> Words:
    """Group maskable tokens into whole words by ``batch.word_ids``.

    Only *changes* of the word id matter: a token starts a word where its id differs from the
    previous token's, or the previous token cannot be masked, or its id is ``-1``. So any
    tokenizer that reports word ids works (WordPiece ``##``, SentencePiece ``▁``, byte-level BPE),
    and ids need not be contiguous.
    """
    can = maskable(batch)
    ids = batch.word_ids
    B, T = ids.shape
    previous_can = torch.cat([torch.zeros_like(can[:, :1]), can[:, :-1]], dim=1)
    previous_id = torch.cat([torch.full_like(ids[:, :1], -1), ids[:, :-1]], dim=1)
    starts = can & (~previous_can | (ids != previous_id) | (ids < 0))  # (B, T)
    index = torch.where(can, starts.long().cumsum(dim=1) - 1, -1)  # (B, T)
    count = starts.sum(dim=1)  # (B,)
    W = max(1, int(count.max())) if B else 1
    size = torch.zeros(B, W + 1, dtype=torch.long, device=ids.device)
    size.scatter_add_(1, torch.where(can, index, W), can.long())  # column W collects the rest
    return Words(index, count, size[:, :W])


def per_word(values: torch.Tensor, w: Words) -> torch.Tensor:
    """Mean of a ``[B, T]`` float tensor over each word's tokens: ``[B, W]``."""
    B, W = w.size.shape
    total = torch.zeros(B, W + 1, dtype=values.dtype, device=values.device)
    total.scatter_add_(1, torch.where(w.index >= 0, w.index, W), torch.where(w.index >= 0, values, 0))
    return total[:, :W] / w.size.clamp(min=1)


def per_token(values: torch.Tensor, w: Words, fill: Any = 0) -> torch.Tensor:
    """Spread a ``[B, W]`` per-word tensor back to ``[B, T]`` (``fill`` at unmaskable tokens)."""
    picked = values.gather(1, w.index.clamp(min=0))
    return torch.where(w.index >= 0, picked, torch.as_tensor(fill, dtype=values.dtype, device=values.device))


def policy_weights(batch: TokenBatch, policy: str, vocab: Vocabulary, owner: str) -> torch.Tensor:
    """``[B, T]`` float selection weights of ``policy``, 0 at tokens that cannot be masked.

    Raises:
        DataError: ``inverse_frequency`` without ``vocab.token_counts``, or ``entropy`` without a
            usable ``batch.surprisal``.
    """
    can = maskable(batch)
    if policy == "uniform":
        return can.float()
    if policy == "inverse_frequency":
        if vocab.token_counts is None:
            raise DataError(
                f"{owner}: masking_policy=inverse_frequency needs token frequencies, but the vocabulary has no "
                f"token_counts; use TokenizedCorpus(...).vocab or objreg.toolkit.selection.vocab_with_counts(vocab, batch)"
            )
        counts = vocab.token_counts.to(batch.input_ids.device, torch.float64)
        # Add-one smoothing: an id never seen in the corpus gets a large but finite weight.
        probability = (counts + 1) / (counts.sum() + vocab.size)  # (V,)
        weights = (1 / probability)[batch.input_ids].float()  # (B, T)
        return torch.where(can, weights, 0.0)
    if policy == "entropy":
        surprisal = batch.surprisal
        if surprisal is None:
            raise DataError(
                f"{owner}: masking_policy=entropy needs the model's surprisal of each token, but the batch has "
                f"none; prepare the batch with objective.prepare(batch, model) "
                f"(or objreg.toolkit.surprisal.token_surprisal)"
            )
        if tuple(surprisal.shape) != tuple(batch.input_ids.shape):
            raise DataError(
                f"{owner}: batch.surprisal has shape {tuple(surprisal.shape)}, expected {tuple(batch.input_ids.shape)}"
            )
        real = torch.where(can, surprisal.float(), 0.0)
        if not bool(torch.isfinite(real).all()) or bool((real < 0).any()):
            raise DataError(f"{owner}: batch.surprisal must be finite and non-negative at maskable tokens")
        return real
    raise InvalidParameterError(f"{owner}: masking_policy must be one of {', '.join(POLICIES)}, got {policy!r}")


def vocab_with_counts(vocab: Vocabulary, batch: TokenBatch) -> Vocabulary:
    """``vocab`` with ``token_counts`` counted from the maskable tokens of ``batch`` (for
    ``inverse_frequency`` where no corpus counts are at hand, e.g. a preview of a few texts)."""
    ids = batch.input_ids[maskable(batch)]
    return replace(vocab, token_counts=torch.bincount(ids.cpu(), minlength=vocab.size))


def sampling_keys(weights: torch.Tensor, valid: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Random keys whose descending order is a weighted sample without replacement: ``log(u) / w``
    (Efraimidis & Spirakis 2006). ``-inf`` at invalid units. Zero weights are floored at 1e-6 of the
    row's largest, so they come last but can still fill a budget the others cannot."""
    u = uniform(tuple(weights.shape), generator, weights.device)
    return _keys_from(u, weights, valid)


def _keys_from(u: torch.Tensor, weights: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """:func:`sampling_keys` from its uniform draw ``u`` (row by row: any subset of rows gives
    the same keys for those rows)."""
    floor = 1e-6 * weights.amax(dim=1, keepdim=True).clamp(min=1e-30)
    w = torch.maximum(weights.float(), floor)
    return torch.where(valid, u.clamp(min=1e-12).log() / w, -math.inf)


def inclusion_probabilities(
    weights: torch.Tensor, target: torch.Tensor, sizes: torch.Tensor | None = None
) -> torch.Tensor:
    """``π = min(1, c · w)`` per unit, the per-row scale ``c`` chosen so that ``Σ π · size`` equals
    ``target`` ``[B, 1]`` (sizes default to 1: the expected count). Water-filling: units that
    would exceed 1 are capped and the rest of the budget is spread over the others."""
    w = weights.double()
    size = torch.ones_like(w) if sizes is None else sizes.double()
    target = target.double()
    scale = target / (w * size).sum(dim=1, keepdim=True).clamp(min=1e-300)
    for _ in range(_WATER_FILLING_ROUNDS):
        capped = scale * w >= 1
        if not bool(capped.any()):  # nothing capped: the first scale is exact (always, for uniform weights)
            break
        free = torch.where(capped, 0.0, w * size).sum(dim=1, keepdim=True)
        raised = (target - torch.where(capped, size, 0.0).sum(dim=1, keepdim=True)) / free.clamp(min=1e-300)
        scale = torch.where(free > 0, torch.maximum(scale, raised), scale)
    return (scale * w).clamp(max=1).float()


def pareto_keys(probabilities: torch.Tensor, valid: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Random keys whose descending order, cut at a fixed size, includes each unit with about its
    target probability ``π`` (Pareto order sampling, Rosén 1997: key ``-odds(u) / odds(π)``). A
    plain weighted order (:func:`sampling_keys`) under-selects heavy units when a sizeable share of
    the row is taken; this keeps ``P(selected) ∝ weight`` for an exact budget. ``-inf`` at invalid
    units."""
    u = uniform(tuple(probabilities.shape), generator, probabilities.device).double().clamp(1e-12, 1 - 1e-12)
    pi = probabilities.double().clamp(1e-12, 1 - 1e-12)
    keys = -(u / (1 - u)) / (pi / (1 - pi))
    return torch.where(valid, keys, -math.inf)


def bernoulli_select(
    weights: torch.Tensor | None, can: torch.Tensor, rate: float, generator: torch.Generator, at_least_one: bool = True
) -> torch.Tensor:
    """Independent selection, position ``i`` with probability ``min(1, c · w_i)``, expected count
    ``rate · n`` per row (``n`` maskable positions); with uniform weights exactly Bernoulli(rate).
    ``weights=None`` means uniform weights (the ``uniform`` policy): the same selection, with one
    probability per row instead of a ``[B, T]`` water-filling.

    ``at_least_one`` is BERT's ``max(1, ·)``: a row with something to mask and nothing selected gets
    one position, drawn by weight. Both draws happen for every row, so the generator advances the
    same way whatever the data; the weighted keys of the second draw are computed only for the
    rows that need them.
    """
    B, T = can.shape
    device = can.device
    n = can.sum(dim=1, keepdim=True)
    if weights is None:
        # What inclusion_probabilities gives every maskable position of a uniform row, from the
        # same float64 operations (the water-filling never moves a uniform row's scale): (B, 1).
        scale = (rate * n).double() / n.double().clamp(min=1e-300)
        probability = scale.clamp(max=1).float()
        w = None
    else:
        w = torch.where(can, weights.float(), 0.0)
        total = w.sum(dim=1, keepdim=True)
        w = torch.where(total > 0, w, can.float())  # a row whose weights are all 0 falls back to uniform
        probability = inclusion_probabilities(w, rate * n)  # (B, T)
    selected = (uniform((B, T), generator, device) < probability) & can
    u = uniform((B, T), generator, device)  # the keys' draw, taken whether or not a row needs it
    if not at_least_one:
        return selected
    rows = ((selected.sum(dim=1) == 0) & (n[:, 0] > 0)).nonzero().flatten()  # nothing selected, something to
    if len(rows) == 0:
        return selected
    row_w = can[rows].float() if w is None else w[rows]
    keys = _keys_from(u[rows], row_w, can[rows])  # (R, T): sampling_keys of those rows
    forced = (torch.arange(T, device=device) == keys.argmax(dim=1, keepdim=True)) & can[rows]  # one-hot
    selected[rows] = forced
    return selected


def greedy_fill(sizes: torch.Tensor, keys: torch.Tensor, budget: torch.Tensor) -> torch.Tensor:
    """google-research/bert's whole-word budget: visit units in descending ``keys`` order and take
    each one whose ``sizes`` still fits the remaining ``budget`` ``[B]``, skipping those that do not.

    Vectorised as passes: each pass takes, in order, the run of units that fit until the first one
    that overflows; the next pass drops every unit larger than what is left. That is the
    sequential greedy exactly; the number of passes is bounded by the largest unit size + 1.
    Returns ``[B, U]`` bool over the units in their original order.
    """
    order = keys.argsort(dim=1, descending=True)  # (B, U)
    size = sizes.gather(1, order)
    valid = keys.gather(1, order) > -math.inf
    taken = torch.zeros_like(valid)
    used = torch.zeros_like(budget)[:, None]  # (B, 1)
    left = budget[:, None]
    for _ in range(int(sizes.max()) + 1 if sizes.numel() else 0):
        fits = valid & ~taken & (size <= left - used) & (size > 0)
        run = used + torch.where(fits, size, 0).cumsum(dim=1)
        add = fits & (run <= left)
        if not bool(add.any()):
            break
        taken |= add
        used = used + torch.where(add, size, 0).sum(dim=1, keepdim=True)
    return torch.zeros_like(taken).scatter(1, order, taken)


def selection_lists(selected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Selected positions as fixed-size lists: ``positions`` [B, K] long (ascending, padded with
    0) and ``weights`` [B, K] float (1.0 real, 0.0 padding), K = most selections in a row (>= 1).
    One scatter of each selected position to its rank among the row's selections (no sort)."""
    B, T = selected.shape
    rank = selected.cumsum(dim=1)  # (B, T) long: selections up to and including each position
    count = rank[:, -1].clone() if T else rank.sum(dim=1)  # (B,)
    K = max(1, int(count.max())) if B else 1
    positions = torch.zeros(B, K + 1, dtype=torch.long, device=selected.device)
    # Selection r (1-based) goes to column r; the rest to column 0, dropped.
    positions.scatter_(1, torch.where(selected, rank, 0), torch.arange(T, device=selected.device).expand(B, T))
    real = torch.arange(K, device=selected.device)[None, :] < count[:, None]  # (B, K)
    return positions[:, 1:].contiguous(), real.float()


def smallest_keys(keys: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """``[B, G]`` bool: the ``count[b]`` smallest entries of each row of ``keys``, as the first
    ``count[b]`` places of ``keys.argsort(dim=1)`` would pick them.

    A partial selection of the largest count instead of a sort of the whole row, which costs many
    times more on the CPU (docs/performance.md has the timings). A row whose ``count``-th and
    ``count + 1``-th smallest keys are equal (a tie at the cut, rare for float keys) takes the
    argsort of that row, so the pick is the sort's in every case.
    """
    B, G = keys.shape
    count = count.clamp(0, G)
    K = int(count.max()) if B and G else 0
    if K == 0:
        return torch.zeros_like(keys, dtype=torch.bool)
    k = min(K + 1, G)
    top = smallest_sorted(keys, k)  # (B, k), ascending
    last = top.gather(1, (count - 1).clamp(min=0)[:, None])  # (B, 1): the count-th smallest
    picked = keys <= last
    if not bool((count > 0).all()):  # (a broadcast over the whole [B, G] costs twice the comparison)
        picked &= (count > 0)[:, None]
    following = top.gather(1, count.clamp(max=k - 1)[:, None])  # the count+1-th smallest (where count < G)
    tied = ((following == last)[:, 0] & (count > 0) & (count < G)).nonzero().flatten()
    if len(tied):
        order = keys[tied].argsort(dim=1)
        first = torch.arange(G, device=keys.device)[None, :] < count[tied][:, None]
        picked[tied] = torch.zeros_like(first).scatter_(1, order, first)
    return picked


def smallest_positions(keys: torch.Tensor, count: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Row and column of each of the ``count[b]`` smallest entries of each row of ``keys``
    ``[B, G]`` (:func:`smallest_keys`' picks), row by row and left to right within a row: ``[N]``
    long each, ``N = count.sum()``."""
    return nonzero_positions(smallest_keys(keys, count))


def nonzero_positions(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``mask.nonzero(as_tuple=True)`` of a ``[B, G]`` mask, through numpy's ``flatnonzero`` on the
    CPU (several times faster there)."""
    if mask.device.type == "cpu":
        row, column = np.divmod(np.flatnonzero(mask.numpy()), max(mask.shape[1], 1))
        return torch.from_numpy(row), torch.from_numpy(column)
    return mask.nonzero(as_tuple=True)


def smallest_ranks(keys: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """``[B, G]`` long: the rank (0 = smallest) of each of the ``count[b]`` smallest entries of
    its row, as ``keys.argsort(dim=1).argsort(dim=1)`` gives it; every other entry gets a rank of
    at least ``count[b]``. From the ``count + 1`` smallest values, sorted (:func:`smallest_sorted`),
    and one batched ``searchsorted`` instead of two sorts of the whole row; a row with equal
    values among those (whose ranks the sort's tie order decides) takes the two sorts."""
    B, G = keys.shape
    count = count.clamp(0, G)
    K = int(count.max()) if B and G else 0
    if K == 0:
        return torch.full(keys.shape, G, dtype=torch.long, device=keys.device)
    top = smallest_sorted(keys, min(K + 1, G))  # (B, k), ascending
    rank = torch.searchsorted(top, keys.contiguous())  # (B, G): how many of them are smaller
    k = top.shape[1]
    first = torch.arange(k - 1, device=keys.device)[None, :] < count[:, None]  # pairs inside the count + 1
    tied = ((top[:, 1:] == top[:, :-1]) & first).any(dim=1).nonzero().flatten()
    if len(tied):
        rank[tied] = keys[tied].argsort(dim=1).argsort(dim=1)
    return rank


def smallest_sorted(keys: torch.Tensor, k: int) -> torch.Tensor:
    """The ``k`` smallest values of each row of ``keys`` ``[B, G]``, ascending: the values of
    ``keys.topk(k, dim=1, largest=False)``, through numpy's ``partition`` for CPU floats."""
    if keys.device.type == "cpu" and keys.dtype in (torch.float32, torch.float64) and not keys.requires_grad:
        part = np.partition(keys.contiguous().numpy(), k - 1, axis=1)[:, :k]
        return torch.from_numpy(np.sort(part, axis=1))
    return keys.topk(k, dim=1, largest=False).values
