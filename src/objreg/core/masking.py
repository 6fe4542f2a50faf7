"""The masked-LM family's shared machinery (``mlm``, ``wwm``, ``span``) and its modifiers.

Exported as ``objreg.masking``, so a third-party masking objective builds on exactly the same
pieces and accepts the same modifiers. Everything is vectorised over the batch and draws its
randomness from the ``torch.Generator`` it is given.

**Selection.** A masking policy gives every maskable position (real, non-special) a weight;
selection then follows one of two budgets:

* Bernoulli (Hugging Face, RoBERTa-style): each position independently, with probability
  ``min(1, c · w_i)`` where ``c`` makes the expected count ``rate · n`` (:func:`bernoulli_select`),
  plus BERT's ``max(1, ·)``;
* exact (google-research/bert, SpanBERT): units (words, spans) in a weighted random order until a
  fixed token budget is spent (:func:`greedy_fill`). The order comes from Pareto order sampling
  (:func:`pareto_keys`), which keeps each unit's selection probability close to ``min(1, c · w)``
  under the fixed budget, or from Efraimidis & Spirakis keys (:func:`sampling_keys`).

Policies (:func:`policy_weights`): ``uniform``; ``inverse_frequency``, weight ``1 / p(token)`` from
the corpus counts in ``Vocabulary.token_counts``, so every token *type* is masked about equally
often (the masked tokens' distribution over frequency ranks is flat); ``entropy``, weight = the
model's surprisal of the token (``TokenBatch.surprisal``, from
``objreg.analysis.surprisal.token_surprisal``), so harder tokens are masked more often.

**Replacement** (:func:`replace_selected`): BERT's 80/10/10 among the selected positions, one
uniform draw deciding each position's fate (the caller decides whether per token, word or span).
Random replacements are ordinary tokens only: Hugging Face and google-research/bert can draw
special ids there; fairseq cannot, nor can this.

**Loss** (:func:`masked_lm_loss`): the LM head runs only at the selected positions, gathered into
fixed-size lists (BERT's ``masked_lm_positions``/``_weights``), with optional label smoothing ε
(the ``torch.nn.functional.cross_entropy`` convention: ε spread uniformly over all V classes) and
optional consistency regularisation between two independently masked views of the same text:
``KL(p(v₁) ‖ sg[p(v₂)])`` at the positions selected in both views, ``sg`` a true stop-gradient
(``detach``), added with weight ``consistency_weight`` to the NLL of view 1. The loss options
travel in ``extras`` as ``[B]`` tensors, because ``objreg_loss`` receives no parameters.

**Character noise** (:func:`char_noise`): insert / delete / substitute characters of the *text*
before tokenising (an augmentation of the data, not of a batch).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from objreg.core import masks
from objreg.core.errors import DataError, InvalidParameterError
from objreg.core.randomness import uniform
from objreg.core.types import IGNORE_INDEX, Corpus, CorruptedBatch, ModelOutputs, Param, TokenBatch, Vocabulary

if TYPE_CHECKING:
    from objreg.core.tokenizer import Tokenizer

POLICIES = ("uniform", "entropy", "inverse_frequency")

#: Rounds of the water-filling in :func:`inclusion_probabilities`; each round can only raise the
#: scale, and rows need more than a few only for extremely skewed weights.
_WATER_FILLING_ROUNDS = 8


# -- parameters and modifiers -------------------------------------------------------------------


def replacement_params() -> tuple[Param, ...]:
    """The 80/10/10 parameters, declared identically by every masking objective."""
    return (
        Param("mask_replace_prob", 0.8, "Share of the selected tokens replaced by [MASK].", float, 0.0, 1.0),
        Param(
            "random_replace_prob", 0.1, "Share of the selected tokens replaced by a random ordinary token; the "
            "rest stay unchanged. mask_replace_prob + random_replace_prob must be at most 1.", float, 0.0, 1.0,
        ),
    )


#: The modifier parameters every masking objective declares (``objreg.masking.MODIFIER_PARAMS``).
MODIFIER_PARAMS: tuple[Param, ...] = (
    Param(
        "masking_policy", "uniform", "Which tokens are masked more often: uniform; entropy (probability "
        "proportional to the model's surprisal of the token; the batch needs surprisal); inverse_frequency "
        "(proportional to 1/p(token) from the corpus counts, which flattens the masking rate across "
        "frequency ranks).", str, choices=POLICIES,
    ),
    Param(
        "label_smoothing", 0.0, "Label smoothing epsilon of the masked-token cross-entropy (mass spread "
        "uniformly over the vocabulary, as torch's cross_entropy does).", float, 0.0, 1.0,
    ),
    Param(
        "consistency_weight", 0.0, "Weight of KL(p(view 1) || stop-gradient p(view 2)) between two independently "
        "masked views, at the positions masked in both; 0 switches it off (and the second view with it).",
        float, 0.0, None,
    ),
)

#: The data-level modifier: applied to the text before tokenising (:func:`char_noise`).
CHAR_NOISE_PARAM = Param(
    "char_noise", 0.0, "Share of the non-space characters hit by character noise (one of insert, delete, "
    "substitute, equally likely) before tokenising.", float, 0.0, 1.0,
)


@dataclass(frozen=True)
class Modifier:
    """A modifier of the masking objectives, for ``objreg list``.

    Attributes:
        name: Short name.
        description: One line.
        params: Its parameters.
        scope: ``"objective"``: the params are parameters of every objective that declares them
            (``objreg list`` shows which); ``"text"``: applied to the text before tokenising.
    """

    name: str
    description: str
    params: tuple[Param, ...]
    scope: str = "objective"


MODIFIERS: tuple[Modifier, ...] = (
    Modifier("masking_policy", "Which positions are masked: uniform, entropy (model surprisal) or "
             "inverse_frequency (1/p(token)).", MODIFIER_PARAMS[:1]),
    Modifier("label_smoothing", "Label smoothing epsilon on the masked-token cross-entropy.", MODIFIER_PARAMS[1:2]),
    Modifier("consistency", "KL(p(v1) || sg[p(v2)]) between two independently masked views, true stop-gradient.",
             MODIFIER_PARAMS[2:3]),
    Modifier("char_noise", "Character insert/delete/substitute noise on the text before tokenising "
             "(objreg.masking.char_noise).", (CHAR_NOISE_PARAM,), scope="text"),
)


def check_replacement(params: Mapping[str, Any], owner: str) -> None:
    """``mask_replace_prob + random_replace_prob <= 1`` (each is bounds-checked by its Param)."""
    total = params["mask_replace_prob"] + params["random_replace_prob"]
    if total > 1 + 1e-9:
        raise InvalidParameterError(
            f"{owner}: mask_replace_prob ({params['mask_replace_prob']}) + random_replace_prob "
            f"({params['random_replace_prob']}) = {total:g} must be at most 1 (the rest of the selected "
            f"tokens stay unchanged)"
        )


# -- positions, words and policy weights --------------------------------------------------------


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
                f"token_counts; use TokenizedCorpus(...).vocab or objreg.masking.vocab_with_counts(vocab, batch)"
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
                f"none; compute it with objreg.analysis.surprisal.token_surprisal(model, batch, vocab)"
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


# -- selection ----------------------------------------------------------------------------------


def sampling_keys(weights: torch.Tensor, valid: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Random keys whose descending order is a weighted sample without replacement: ``log(u) / w``
    (Efraimidis & Spirakis 2006). ``-inf`` at invalid units. Zero weights are floored at 1e-6 of the
    row's largest, so they come last but can still fill a budget the others cannot."""
    floor = 1e-6 * weights.amax(dim=1, keepdim=True).clamp(min=1e-30)
    w = torch.maximum(weights.float(), floor)
    u = uniform(tuple(weights.shape), generator, weights.device).clamp(min=1e-12)
    return torch.where(valid, u.log() / w, -math.inf)


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
    weights: torch.Tensor, can: torch.Tensor, rate: float, generator: torch.Generator, at_least_one: bool = True
) -> torch.Tensor:
    """Independent selection, position ``i`` with probability ``min(1, c · w_i)``, expected count
    ``rate · n`` per row (``n`` maskable positions); with uniform weights exactly Bernoulli(rate).

    ``at_least_one`` is BERT's ``max(1, ·)``: a row with something to mask and nothing selected gets
    one position, drawn by weight. Both draws happen for every row, so the generator advances the
    same way whatever the data.
    """
    B, T = can.shape
    device = can.device
    w = torch.where(can, weights.float(), 0.0)
    total = w.sum(dim=1, keepdim=True)
    w = torch.where(total > 0, w, can.float())  # a row whose weights are all 0 falls back to uniform
    n = can.sum(dim=1, keepdim=True)
    probability = inclusion_probabilities(w, rate * n)  # (B, T)
    selected = (uniform((B, T), generator, device) < probability) & can
    keys = sampling_keys(w, can, generator)  # (B, T)
    if not at_least_one:
        return selected
    forced = (torch.arange(T, device=device) == keys.argmax(dim=1, keepdim=True)) & can  # one-hot
    return selected | (forced & ~selected.any(dim=1, keepdim=True))


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


# -- replacement and the corrupted batch ------------------------------------------------------------


_ORDINARY_IDS: dict[tuple[int, tuple[int, ...], str], torch.Tensor] = {}


def ordinary_ids(vocab: Vocabulary, device: torch.device | str | None = None) -> torch.Tensor:
    """The ids that are not special, ``[V_ordinary]`` long. Cached per vocabulary layout and
    device, since every corruption asks for it: treat the result as read-only."""
    key = (vocab.size, vocab.special_ids, str(torch.device(device or "cpu")))
    ids = _ORDINARY_IDS.get(key)
    if ids is None:
        ids = torch.nonzero(vocab.normal_token_weights(device) > 0).flatten()
        if len(ids) == 0:
            raise DataError("the vocabulary has no ordinary token to draw random replacements from")
        if len(_ORDINARY_IDS) >= 32:
            _ORDINARY_IDS.clear()
        _ORDINARY_IDS[key] = ids
    return ids


def replace_selected(
    ids: torch.Tensor,
    selected: torch.Tensor,
    fate: torch.Tensor,
    generator: torch.Generator,
    params: Mapping[str, Any],
    vocab: Vocabulary,
) -> torch.Tensor:
    """BERT's 80/10/10 (``mask_replace_prob`` / ``random_replace_prob`` / the rest kept) among the
    ``selected`` positions. ``fate`` ``[B, T]`` in [0, 1) decides each position: draw it per token,
    or spread one draw per word or span. ``ids`` is not modified."""
    p_mask, p_random = params["mask_replace_prob"], params["random_replace_prob"]
    out = torch.where(selected & (fate < p_mask), vocab.mask_id, ids)
    if p_random > 0:
        to_random = selected & (fate >= p_mask) & (fate < p_mask + p_random)
        pool = ordinary_ids(vocab, generator.device)
        picks = torch.randint(len(pool), tuple(ids.shape), generator=generator, device=generator.device)
        out = torch.where(to_random, pool[picks].to(ids.device), out)
    return out


def selection_lists(selected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Selected positions as fixed-size lists: ``positions`` [B, K] long (ascending, padded with
    0) and ``weights`` [B, K] float (1.0 real, 0.0 padding), K = most selections in a row (>= 1)."""
    B, T = selected.shape
    count = selected.sum(dim=1)  # (B,)
    K = max(1, int(count.max())) if B else 1
    index = torch.arange(T, device=selected.device).expand(B, T)
    # Selected positions sort first (in order), the rest after them.
    order = torch.where(selected, index, index + T).argsort(dim=1)[:, :K]  # (B, K)
    real = torch.arange(K, device=selected.device)[None, :] < count[:, None]  # (B, K)
    return torch.where(real, order, 0), real.float()


class MaskedView(NamedTuple):
    """One masked view of a batch: the corrupted ids and which positions are to be predicted."""

    input_ids: torch.Tensor
    selected: torch.Tensor


def masked_lm_batch(
    batch: TokenBatch, view: MaskedView, params: Mapping[str, Any], second: MaskedView | None = None
) -> CorruptedBatch:
    """The :class:`CorruptedBatch` of a masking objective, with the extras :func:`masked_lm_loss`
    reads: ``masked_positions``/``masked_weights`` always; ``label_smoothing`` ``[B]`` when
    ε > 0; the second view (``consistency_input_ids``, ``consistency_positions``/``_weights`` at
    the positions selected in both views, ``consistency_weight`` ``[B]``) when it is given."""
    B = batch.input_ids.shape[0]
    device = batch.input_ids.device

    def per_row(value: float) -> torch.Tensor:  # float64: the loss sees exactly this value, whatever its dtype
        return torch.full((B,), float(value), dtype=torch.float64, device=device)

    positions, weights = selection_lists(view.selected)
    extras = {"masked_positions": positions, "masked_weights": weights}
    if params.get("label_smoothing", 0.0) > 0:
        extras["label_smoothing"] = per_row(params["label_smoothing"])
    if second is not None:
        both_positions, both_weights = selection_lists(view.selected & second.selected)
        extras |= {
            "consistency_input_ids": second.input_ids,
            "consistency_positions": both_positions,
            "consistency_weights": both_weights,
            "consistency_weight": per_row(params["consistency_weight"]),
        }
    return CorruptedBatch(
        input_ids=view.input_ids,
        labels=torch.where(view.selected, batch.input_ids, IGNORE_INDEX),
        is_padding=batch.is_padding.clone(),
        position_ids=masks.positions_within_documents(batch.document_ids),
        document_ids=batch.document_ids.clone(),
        extras=extras,
    )


def attention_mask(batch: CorruptedBatch) -> torch.Tensor:
    """Bidirectional within each document: the mask of every masking objective."""
    return masks.bidirectional(batch.is_padding) & masks.same_document(batch.document_ids)  # (B, T, T)


# -- loss ---------------------------------------------------------------------------------------


def gather_positions(hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """``hidden[b, positions[b, k]]``: ``[B, T, H]`` and ``[B, K]`` to ``[B, K, H]``."""
    return hidden.gather(1, positions.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))


def smoothed_nll(logits: torch.Tensor, targets: torch.Tensor, epsilon: torch.Tensor | float = 0.0) -> torch.Tensor:
    """Per-position cross-entropy with label smoothing: ``(1-ε)(-log p_y) + ε · mean_v(-log p_v)``,
    the ``torch.nn.functional.cross_entropy(label_smoothing=ε)`` convention. ``logits`` ``[B, K, V]``,
    ``targets`` ``[B, K]`` (valid ids), ``epsilon`` a float or ``[B]``; returns ``[B, K]``."""
    log_probs = torch.log_softmax(logits, dim=-1)
    nll = -log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (B, K)
    if isinstance(epsilon, float) and epsilon == 0.0:  # a Python constant, not a tensor value
        return nll
    eps = torch.as_tensor(epsilon, dtype=logits.dtype, device=logits.device)
    eps = eps[:, None] if eps.dim() == 1 else eps
    return (1 - eps) * nll + eps * -log_probs.mean(dim=-1)


def consistency_kl(logits: torch.Tensor, stopped_logits: torch.Tensor) -> torch.Tensor:
    """``KL(p ‖ sg[q]) = Σ_v p_v (log p_v − log q_v)`` per position, ``p = softmax(logits)``,
    ``q = softmax(stopped_logits)`` behind a true stop-gradient: no gradient (reverse or forward
    mode) reaches ``stopped_logits``. Shapes ``[..., V]`` to ``[...]``."""
    log_p = torch.log_softmax(logits, dim=-1)
    log_q = torch.log_softmax(stopped_logits.detach(), dim=-1)
    return (log_p.exp() * (log_p - log_q)).sum(dim=-1)


def _weighted_mean(values: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    weights = weights.to(values.dtype)
    return (values * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1)


def masked_lm_loss(outputs: ModelOutputs, batch: CorruptedBatch, head: str = "lm") -> torch.Tensor:
    """Per-sample masked-LM loss ``[B]``: mean (smoothed) NLL over the selected positions, plus
    ``consistency_weight`` × mean KL over the positions selected in both views when the batch has a
    second view. Pure and transform-safe; a row with nothing selected gets 0."""
    lm = outputs.model.heads[head]
    extras = batch.extras
    positions = extras["masked_positions"]  # (B, K)
    logits = lm(gather_positions(outputs.hidden, positions))  # (B, K, V)
    # clamp: list padding points at position 0, whose label is IGNORE_INDEX; its weight is 0.
    targets = batch.labels.gather(1, positions).clamp(min=0)  # (B, K)
    nll = smoothed_nll(logits, targets, extras.get("label_smoothing", 0.0))  # (B, K)
    loss = _weighted_mean(nll, extras["masked_weights"])  # (B,)
    if "consistency_input_ids" not in extras:
        return loss
    both = extras["consistency_positions"]  # (B, K2)
    with torch.no_grad():  # the second view only serves as a stopped target; detach below makes it exact
        other = outputs.model.encode(extras["consistency_input_ids"], attention_mask(batch), batch.position_ids)
    kl = consistency_kl(lm(gather_positions(outputs.hidden, both)), lm(gather_positions(other, both)))  # (B, K2)
    weight = extras["consistency_weight"].to(loss.dtype)
    return loss + weight * _weighted_mean(kl, extras["consistency_weights"])


# -- span lengths ---------------------------------------------------------------------------------


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
        DataError: the file is missing, not SQuAD JSON, or has no answer.
    """
    path = Path(squad_json_path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))["data"]
        answers = [
            qa["answers"][0]["text"]
            for article in data for paragraph in article["paragraphs"] for qa in paragraph["qas"] if qa.get("answers")
        ]
    except FileNotFoundError:
        raise DataError(f"SQuAD file {path} does not exist") from None
    except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
        raise DataError(
            f"{path} is not SQuAD-format JSON (data/paragraphs/qas/answers): {type(e).__name__}: {e}"
        ) from None
    counts: dict[int, int] = {}
    for _, word_ids in tokenizer.encode_sentences(answers):
        n = len({w for w in word_ids if w >= 0})
        if n > 0 and (max_length is None or n <= max_length):
            counts[n] = counts.get(n, 0) + 1
    total = sum(counts.values())
    if total == 0:
        raise DataError(f"{path} has no answer with at least one word")
    return {n: c / total for n, c in sorted(counts.items())}


# -- character noise ------------------------------------------------------------------------------

CHAR_OPERATIONS = ("insert", "delete", "substitute")


def char_noise(
    texts: Sequence[str],
    rate: float,
    generator: torch.Generator,
    alphabet: str | None = None,
    operations: Sequence[str] = CHAR_OPERATIONS,
) -> list[str]:
    """Character-level noise before tokenising: each non-whitespace character is hit with
    probability ``rate`` by one of ``operations`` (equally likely): ``delete`` it, ``substitute``
    a random character for it, or ``insert`` a random character after it. Whitespace is never
    touched, so word boundaries stay (a word can vanish when every character is deleted).

    Random characters come from ``alphabet`` (default: the non-whitespace characters of ``texts``,
    so the noise stays in the script of the text). Vectorised per text; deterministic for a
    generator state.
    """
    if not 0 <= rate <= 1:
        raise InvalidParameterError(f"char_noise: rate must lie in [0, 1], got {rate}")
    unknown = set(operations) - set(CHAR_OPERATIONS)
    if unknown or not operations:
        raise InvalidParameterError(f"char_noise: operations must be a non-empty subset of {CHAR_OPERATIONS}")
    if isinstance(texts, str):
        raise InvalidParameterError("char_noise takes a list of texts, not a single string")
    chars = alphabet if alphabet is not None else "".join(sorted({c for t in texts for c in t if not c.isspace()}))
    if rate == 0 or not chars:
        return list(texts)
    table = _code_points(chars)
    wanted = torch.tensor([op in operations for op in CHAR_OPERATIONS])
    choices = torch.nonzero(wanted).flatten()  # indices into CHAR_OPERATIONS
    out = []
    for text in texts:
        codes = _code_points(text)  # (N,)
        N = len(codes)
        spaces = torch.isin(codes, _code_points("".join({c for c in text if c.isspace()}) or " "))
        hit = (torch.rand(N, generator=generator) < rate) & ~spaces
        op = choices[torch.randint(len(choices), (N,), generator=generator)]  # 0 insert, 1 delete, 2 substitute
        randoms = table[torch.randint(len(table), (N, 2), generator=generator)]  # (N, 2)
        first = torch.where(hit & (op == 2), randoms[:, 0], codes)
        emitted = torch.stack([first, randoms[:, 1]], dim=1)  # (N, 2): the character, then an insertion
        keep = torch.stack([~(hit & (op == 1)), hit & (op == 0)], dim=1)
        out.append(_from_code_points(emitted[keep]))
    return out


def noisy_corpus(corpus: Corpus, rate: float, generator: torch.Generator, alphabet: str | None = None) -> Corpus:
    """``corpus`` with :func:`char_noise` applied to every sentence (a static augmentation: apply it
    before ``TokenizedCorpus``)."""
    sentences = [s for document in corpus.documents for s in document]
    noisy = iter(char_noise(sentences, rate, generator, alphabet))
    documents = tuple(tuple(next(noisy) for _ in document) for document in corpus.documents)
    return Corpus(corpus.name, documents, f"{corpus.description} (character noise {rate:g})".strip())


def _code_points(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(text.encode("utf-32-le")), dtype=torch.int32).long()


def _from_code_points(codes: torch.Tensor) -> str:
    return "".join(map(chr, codes.tolist()))
