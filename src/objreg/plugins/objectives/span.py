"""SpanBERT span masking: contiguous spans of whole words, about 15% of the tokens.

Follows facebookresearch/SpanBERT ``PairWithSpanMaskingScheme`` with the paper's recipe
(``pretraining/README.md``: ``--geometric-p 0.2 --span-lower 1 --span-upper 10 --mask-ratio 0.15
--replacement-method span``; the code's own defaults differ, p=0.3 and per-token replacement, and
are *not* the paper's):

* a budget of ``n · mask_prob`` tokens per row (``n`` = maskable tokens), at least 1, rounded up or
  down at random so that its expectation is exact (SpanBERT's ``ceil`` adds up to one token, which
  is a third more than 15% for a 20-token row);
* spans are drawn one after another until the budget is spent: a length ``ℓ`` in words from the
  length distribution and an anchor word drawn at random; the span covers ``ℓ`` whole words from
  the anchor to the right (clipped at the end of the row). With a weighted masking policy a span
  is drawn by the mean weight of the words it covers (its neighbours come along, so the policy
  shifts which spans are masked rather than setting each token's probability);
  overlapping spans merge; the span that would overflow the budget is cut at the word boundary
  nearest the budget (the reference cuts it mid-word; here masks are always complete words, and
  a row can end up to half a word over or under its budget);
* 80/10/10 is decided **per span** (SpanBERT's ``span`` replacement): every token of a span is
  ``[MASK]``, or every token a random ordinary token (one draw each), or every token kept.

Vectorised: all words of a row are candidate anchors, in one weighted random order; where each
word is first covered, how many new tokens each candidate adds and where the budget runs out
are cumsums and scatters over the batch, with no loop over spans. A candidate whose anchor
already lies inside an earlier span extends it to the right (the reference skips such a
candidate; both merge overlaps).

The span length distribution is pluggable: ``geometric`` (default, ``P(ℓ) ∝ p(1-p)^(ℓ-lower)``
on ``lower..upper``, mean 3.797 words for 0.2 on 1..10) or ``empirical`` from a
``"length:weight,..."`` string, e.g. the answer lengths of a QA set
(``lengths.format_lengths(lengths.answer_length_distribution(path, tokenizer))``).

Not included: SpanBERT's span boundary objective (SBO). Its head (boundary states + a learned
relative-position embedding + a two-layer MLP over the tied embeddings) is not one of the head
kinds a plugin can declare, and an approximation would not be SpanBERT's objective.

Written exactly like a third-party plugin: it imports only ``objreg``, its toolkit and ``torch``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import torch

import objreg
from objreg.toolkit import lengths, masked_lm, modifiers, replacement, selection


@objreg.hookimpl
def objreg_objective_info() -> objreg.ObjectiveInfo:
    return objreg.ObjectiveInfo(
        name="span",
        description="SpanBERT span masking: whole-word spans (geometric p=0.2, 1..10 words), 15% budget, "
        "80/10/10 per span.",
        kind="pretrain",
        attention="bidirectional",
        heads=(objreg.HeadSpec("lm", "lm"),),
        params=(
            objreg.Param(
                "mask_prob", 0.15, "Share of the ordinary tokens to predict: a budget of n * mask_prob tokens "
                "per row (randomly rounded, at least 1), filled with spans of whole words (SpanBERT's mask_ratio).",
                float, 0.0, 1.0,
            ),
            *replacement.replacement_params(),
            objreg.Param(
                "length_distribution", "geometric", "Span lengths in words: geometric (P(l) ~ p(1-p)^(l-lower) "
                "on span_lower..span_upper) or empirical (from empirical_lengths).", str,
                choices=("geometric", "empirical"),
            ),
            objreg.Param("geometric_p", 0.2, "p of the geometric length distribution (SpanBERT paper: 0.2).",
                         float, 0.0, 1.0),
            objreg.Param("span_lower", 1, "Shortest span in words (geometric).", int, 1),
            objreg.Param("span_upper", 10, "Longest span in words (geometric).", int, 1),
            objreg.Param(
                "empirical_lengths", "", "Empirical length distribution as length:weight pairs, e.g. "
                "\"1:0.4,2:0.3,3:0.3\" (weights are normalised); see objreg.toolkit.lengths.answer_length_distribution.",
                str,
            ),
            *modifiers.MODIFIER_PARAMS,
        ),
        references=(
            "Joshi et al. 2020, SpanBERT: Improving Pre-training by Representing and Predicting Spans",
            "facebookresearch/SpanBERT pretraining/fairseq/data/masking.py PairWithSpanMaskingScheme "
            "(paper recipe from pretraining/README.md, not the code defaults)",
        ),
        min_seq_len=3,
    )


@objreg.hookimpl
def objreg_corrupt(
    batch: objreg.TokenBatch, generator: torch.Generator, params: Mapping[str, Any], vocab: objreg.Vocabulary
) -> objreg.CorruptedBatch:
    words = selection.words(batch)
    weights = selection.per_word(selection.policy_weights(batch, params["masking_policy"], vocab, "span"), words)
    distribution = length_distribution(params)
    view = _view(batch, words, weights, distribution, generator, params, vocab)
    second = None
    if params["consistency_weight"] > 0:
        second = _view(batch, words, weights, distribution, generator, params, vocab)
    return masked_lm.masked_lm_batch(batch, view, second)


@objreg.hookimpl
def objreg_prepare_batch(
    batch: objreg.TokenBatch, model: objreg.Model, params: Mapping[str, Any], vocab: objreg.Vocabulary
) -> objreg.TokenBatch | None:
    return masked_lm.prepare(batch, model, params, vocab)  # the model's surprisal, for masking_policy=entropy


@objreg.hookimpl
def objreg_loss(
    outputs: objreg.ModelOutputs, batch: objreg.CorruptedBatch, params: Mapping[str, Any], mask: torch.Tensor
) -> torch.Tensor:
    return masked_lm.masked_lm_loss(outputs, batch, params, mask)


@objreg.hookimpl
def objreg_check_params(params: Mapping[str, Any], vocab: objreg.Vocabulary | None) -> None:
    masked_lm.require_mask_token(vocab, "span")  # before the model loads, with the fix
    replacement.check_replacement(params, "span")
    if params["span_lower"] > params["span_upper"]:
        raise objreg.InvalidParameterError(
            f"span: span_lower ({params['span_lower']}) must be at most span_upper ({params['span_upper']})"
        )
    if params["geometric_p"] <= 0:
        raise objreg.InvalidParameterError("span: geometric_p must be in (0, 1]")
    if params["length_distribution"] == "empirical" and not params["empirical_lengths"].strip():
        raise objreg.InvalidParameterError(
            "span: length_distribution=empirical needs empirical_lengths, e.g. \"1:0.4,2:0.3,3:0.3\""
        )
    length_distribution(params)  # a malformed empirical_lengths fails here, before any data


def length_distribution(params: Mapping[str, Any]) -> lengths.LengthDistribution:
    """The span length distribution the parameters describe."""
    if params["length_distribution"] == "empirical":
        return lengths.parse_lengths(params["empirical_lengths"])
    return lengths.geometric_lengths(params["geometric_p"], params["span_lower"], params["span_upper"])


class Spans(NamedTuple):
    """Which words the spans cover, and the candidates behind them (``W`` = words in the widest row).

    Attributes:
        chosen: ``[B, W]`` bool, words masked.
        owner: ``[B, W]`` long, rank of the candidate span that first covers each word (``W``: none).
        lengths: ``[B, W]`` long, the length drawn for each candidate, in rank order.
        used: ``[B]`` long, candidates used: those taken whole plus the one cut at the budget.
    """

    chosen: torch.Tensor
    owner: torch.Tensor
    lengths: torch.Tensor
    used: torch.Tensor


def select_spans(
    words: selection.Words, weights: torch.Tensor, distribution: lengths.LengthDistribution, budget: torch.Tensor,
    generator: torch.Generator,
) -> Spans:
    """Spans of whole words until ``budget`` ``[B]`` tokens are covered (see the module docstring)."""
    B, W = words.size.shape
    device = words.size.device
    valid = torch.arange(W, device=device)[None, :] < words.count[:, None]  # (B, W)
    # Each word, as an anchor, gets its span's length; the span is drawn by the mean weight of the
    # words it would cover, so a policy weighs whole spans (uniform weights: uniform anchors).
    reach = distribution.sample((B, W), generator).to(device)  # (B, W): length of the span anchored here
    end = (torch.arange(W, device=device)[None, :] + reach).minimum(words.count[:, None].clamp(min=1))  # (B, W)
    cumulative = torch.cat([torch.zeros_like(weights[:, :1]), weights.cumsum(dim=1)], dim=1)  # (B, W + 1)
    span_weight = (cumulative.gather(1, end) - cumulative[:, :W]) / (end - torch.arange(W, device=device)).clamp(min=1)
    keys = selection.sampling_keys(span_weight, valid, generator)  # (B, W)
    anchors = keys.argsort(dim=1, descending=True)  # (B, W): candidate of rank c starts at word anchors[:, c]
    is_candidate = keys.gather(1, anchors) > -torch.inf  # (B, W)
    lengths = reach.gather(1, anchors)  # (B, W): in rank order

    offsets = torch.arange(int(distribution.lengths.max()), device=device)  # (L,)
    covers = anchors[:, :, None] + offsets  # (B, W, L): the words each candidate covers
    inside = is_candidate[:, :, None] & (offsets < lengths[:, :, None]) & (covers < words.count[:, None, None])
    rank = torch.arange(W, device=device)[None, :, None].expand_as(covers)
    owner = torch.full((B, W + 1), W, dtype=torch.long, device=device)
    owner = owner.scatter_reduce(1, torch.where(inside, covers, W).flatten(1), rank.flatten(1), "amin")[:, :W]

    added = torch.zeros(B, W + 1, dtype=torch.long, device=device).scatter_add(1, owner, words.size)[:, :W]
    spent = added.cumsum(dim=1)  # (B, W): tokens covered by candidates of rank <= c
    whole = (spent <= budget[:, None]).sum(dim=1)  # (B,): a prefix, since spent only grows
    before = torch.where(whole > 0, spent.gather(1, (whole - 1).clamp(min=0)[:, None])[:, 0], 0)  # (B,)
    # The candidate that overflows is cut at the word boundary nearest the budget (a word whose
    # middle falls exactly on it: a coin flip), so on average the budget is met, not undershot.
    cut = owner == whole[:, None]  # (B, W): words of the candidate that overflows
    through = before[:, None] + torch.where(cut, words.size, 0).cumsum(dim=1)  # (B, W): tokens up to this word
    over = 2 * through - words.size - 2 * budget[:, None]  # (B, W): < 0 when the word's middle fits
    coin = objreg.uniform((B, 1), generator, device) < 0.5
    chosen = valid & ((owner < whole[:, None]) | (cut & ((over < 0) | ((over == 0) & coin))))
    return Spans(chosen, owner, lengths, (whole + 1).clamp(max=W))


def _view(
    batch: objreg.TokenBatch, words: selection.Words, weights: torch.Tensor, distribution: lengths.LengthDistribution,
    generator: torch.Generator, params: Mapping[str, Any], vocab: objreg.Vocabulary,
) -> masked_lm.MaskedView:
    """One span mask with its per-span 80/10/10."""
    n = selection.maskable(batch).sum(dim=1)  # (B,)
    rounding = objreg.uniform(tuple(n.shape), generator, n.device).double()  # (B,): E[budget] = n * mask_prob
    budget = (n.double() * params["mask_prob"] + rounding).floor().long().clamp(min=1)
    budget = torch.where(n > 0, budget, 0)  # (B,)
    spans = select_spans(words, weights, distribution, budget, generator)
    B, W = words.size.shape
    span_fate = objreg.uniform((B, W), generator, n.device)  # (B, W): one draw per candidate span
    word_fate = span_fate.gather(1, spans.owner.clamp(max=W - 1))  # (B, W): the fate of each word's span
    selected = selection.per_token(spans.chosen, words, fill=False)  # (B, T)
    fate = selection.per_token(word_fate, words, fill=1.0)  # (B, T)
    corrupted = replacement.replace_selected(batch.input_ids, selected, fate, generator, params, vocab)
    return masked_lm.MaskedView(corrupted, selected)
