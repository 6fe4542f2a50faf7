"""BART denoising: corrupt the text with any mix of BART's noising functions, then reconstruct the
original text.

The noise pipeline is fairseq's ``DenoisingDataset`` (same order, same parameter names):

1. *Sentence permutation* (``permute_sentences``): ``ceil(sentences · p)`` sentences, chosen at
   random, are shuffled among their slots; sentences stay intact.
2. *Span masking* (``mask``): ``ceil(units · mask)`` units are masked, a unit being a whole word
   (``mask_length`` ``span-poisson`` or ``word``) or a token (``subword``). ``span-poisson`` draws
   span lengths from Poisson(``poisson_lambda``) until the budget is reached (the last one trimmed)
   and starts them at distinct random units; ``word``/``subword`` mask single units.
   ``replace_length`` 1 leaves one ``[MASK]`` per masked run (text infilling), 0 deletes the run
   (token deletion), -1 masks every token (token masking). A share ``mask_random`` of the runs get
   a random ordinary token instead of ``[MASK]``. Zero-length Poisson spans become inserted
   ``[MASK]`` tokens, as in fairseq.
3. *Insertion* (``insert``): ``ceil(length · insert)`` extra ``[MASK]``/random tokens at random
   interior positions.
4. *Document rotation* (with probability ``rotate``): the text is rotated to start at a token chosen
   uniformly (the paper's definition; fairseq's offset range also allows two identity rotations).

BART's five noising functions are single settings: token masking ``mask_length=subword
replace_length=-1 permute_sentences=0``; token deletion ``mask_length=subword replace_length=0
permute_sentences=0``; text infilling ``mask_length=span-poisson replace_length=1
permute_sentences=0``; sentence permutation ``mask=0``; document rotation ``mask=0
permute_sentences=0 rotate=1``. The defaults are the BART-large pretraining recipe (fairseq#1899,
HF PR #18904: mask 0.3, mask_random 0.1, span-poisson, replace_length 1, permute_sentences 1,
rotate 0, insert 0) with the paper's λ = 3 (the recipe used 3.5; HF's Flax example uses 3).
fairseq's task defaults turn everything off except ``rotate=0.5``.

The target is the original row ``[CLS] text [SEP]``; the model sees ``[noised ; original]`` as a
prefix LM (:mod:`objreg.toolkit.seq2seq`). Known bugs avoided: sentence boundaries come from the tokenizer's
sentence ids, so permutation always has sentences to permute (fairseq#3803 stripped the
separators and made it a no-op); random replacements never draw special tokens (fairseq draws
from ``[1, len(vocab))``); ``[CLS]``, ``[SEP]`` and other special tokens are never masked.

Written like a third-party plugin: it imports only ``objreg``, its toolkit and ``torch``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

import objreg
from objreg.toolkit import masked_lm, selection, seq2seq

#: Poisson span lengths are drawn in chunks until every row's budget is reached; this many chunks
#: without reaching it means the budget cannot be reached (it never happens with λ >= 0.1).
MAX_DRAWS = 1000


@objreg.hookimpl
def objreg_objective_info() -> objreg.ObjectiveInfo:
    return objreg.ObjectiveInfo(
        name="bart",
        description="BART denoising: text infilling, sentence permutation, deletion, masking, rotation; "
                    "reconstruct the text.",
        kind="pretrain",
        attention="prefix",
        heads=(objreg.HeadSpec("lm", "lm"),),
        params=(
            objreg.Param("mask", 0.3, "Share of units (words, or tokens for mask_length=subword) to mask.",
                         float, 0.0, 1.0),
            objreg.Param("mask_random", 0.1, "Share of masked runs (and inserted tokens) that get a random "
                         "ordinary token instead of [MASK].", float, 0.0, 1.0),
            objreg.Param("mask_length", "span-poisson", "Masked run length: span-poisson (Poisson whole-word "
                         "spans, text infilling), word (single words) or subword (single tokens).", str,
                         choices=("span-poisson", "word", "subword")),
            objreg.Param("poisson_lambda", 3.0, "Mean span length of span-poisson masking.", float, 0.1, None),
            objreg.Param("replace_length", 1, "What replaces a masked run: 1 one [MASK] (infilling), 0 nothing "
                         "(deletion), -1 a [MASK] per token (token masking).", int, choices=(-1, 0, 1)),
            objreg.Param("permute_sentences", 1.0, "Share of each row's sentences shuffled among themselves.",
                         float, 0.0, 1.0),
            objreg.Param("rotate", 0.0, "Probability that a row is rotated to start at a random token.",
                         float, 0.0, 1.0),
            objreg.Param("insert", 0.0, "Extra [MASK]/random tokens inserted, as a share of the row length.",
                         float, 0.0, 1.0),
        ),
        references=(
            "Lewis et al. 2020, BART: Denoising Sequence-to-Sequence Pre-training for Natural Language "
            "Generation, Translation, and Comprehension",
            "facebookresearch/fairseq fairseq/data/denoising_dataset.py, fairseq/tasks/denoising.py",
            "facebookresearch/fairseq#1899 (the BART-large pretraining arguments), #3803 (permutation without "
            "sentence boundaries)",
        ),
        min_seq_len=4,
    )


@objreg.hookimpl
def objreg_check_params(vocab: objreg.Vocabulary | None) -> None:
    masked_lm.require_mask_token(vocab, "bart")  # before the model loads, with the fix


@objreg.hookimpl
def objreg_corrupt(
    batch: objreg.TokenBatch, generator: torch.Generator, params: Mapping[str, Any], vocab: objreg.Vocabulary
) -> objreg.CorruptedBatch:
    real = ~batch.is_padding  # (B, T)
    tokens, ordinary, words = batch.input_ids, selection.maskable(batch), batch.word_ids
    length = real.sum(dim=1)  # (B,)
    if params["permute_sentences"] > 0:
        order = permuted_order(batch, params["permute_sentences"], generator)  # (B, T)
        tokens, ordinary, words = tokens.gather(1, order), ordinary.gather(1, order), words.gather(1, order)
    inserts = torch.zeros_like(length)
    random_inserts = torch.zeros_like(length)
    if params["mask"] > 0:
        tokens, length, inserts = mask_spans(tokens, real, ordinary, words, generator, params, vocab)
        random_inserts = ceil(inserts, params["mask_random"])
    extra = ceil(length, params["insert"])  # (B,)
    if params["insert"] > 0 or bool(inserts.any()):
        random_inserts = random_inserts + ceil(extra, params["mask_random"])
        tokens, length = insert_tokens(tokens, length, inserts + extra, random_inserts, generator, vocab)
    if params["rotate"] > 0:
        tokens = rotate(tokens, length, params["rotate"], generator)
    target, target_len = seq2seq.compact(batch.input_ids, real, vocab.pad_id)
    source = torch.where(torch.arange(tokens.shape[1], device=tokens.device)[None, :] < length[:, None],
                         tokens, vocab.pad_id)
    return seq2seq.seq2seq_batch((source, length, target, target_len), seq2seq.row_document(batch), vocab.pad_id)


@objreg.hookimpl
def objreg_loss(outputs: objreg.ModelOutputs, batch: objreg.CorruptedBatch) -> torch.Tensor:
    return seq2seq.seq2seq_loss(outputs, batch)  # (B,)


# -- noising functions, each vectorised over the batch -----------------------------------------------


def ceil(counts: torch.Tensor, share: float) -> torch.Tensor:
    """``ceil(counts · share)`` per row, in float64 so that e.g. 10 · 0.3 stays 3."""
    return torch.ceil(counts.double() * share - 1e-9).clamp(min=0).long()


def permuted_order(batch: objreg.TokenBatch, share: float, generator: torch.Generator) -> torch.Tensor:
    """``[B, T]`` gather index that shuffles ``ceil(sentences · share)`` randomly chosen sentences
    among their slots (fairseq ``permute_sentences``). The first and last real tokens ([CLS],
    [SEP]) and padding stay; a special token inside the text moves with its sentence."""
    B, T = batch.input_ids.shape
    device = batch.input_ids.device
    j = torch.arange(T, device=device)[None, :]  # (1, T)
    length = (~batch.is_padding).sum(dim=1, keepdim=True)  # (B, 1)
    body = (j >= 1) & (j <= length - 2)  # (B, T)
    # Sentence of every body token; special tokens (sentence id -1) belong to the sentence before.
    labelled = body & (batch.sentence_ids >= 0)
    last = torch.where(labelled, j, 0).cummax(dim=1).values  # (B, T)
    sentence = batch.sentence_ids.gather(1, last)
    starts = body & ((j == 1) | (sentence != torch.nn.functional.pad(sentence[:, :-1], (1, 0), value=-2)))
    index = (starts.long().cumsum(dim=1) - 1).clamp(min=0)  # (B, T): 0-based sentence of each body token
    count = starts.sum(dim=1)  # (B,)
    S = max(int(count.max()) if B else 0, 1)
    s = torch.arange(S, device=device)[None, :]  # (1, S)
    valid = s < count[:, None]
    keys = torch.where(valid, objreg.uniform((B, S), generator, device), 2.0)
    chosen = valid & selection.smallest_keys(keys, ceil(count, share))  # (B, S)
    # Chosen slots in order, then the others; chosen sentences in random order, then the others.
    slots = torch.where(chosen, s, S + s).argsort(dim=1)
    sources = torch.where(chosen, objreg.uniform((B, S), generator, device), 2.0 + s).argsort(dim=1)
    arrangement = torch.empty_like(slots).scatter_(1, slots, sources)  # slot -> sentence
    slot_of = torch.empty_like(slots).scatter_(1, arrangement, s.expand(B, S).clone())  # sentence -> slot
    # Each body token moves to 1 + (the tokens of the sentences in earlier slots) + (its place in
    # its sentence); [CLS], [SEP] and padding stay: the order a sort by (slot, position) gives.
    sizes = torch.zeros(B, S, dtype=torch.long, device=device).scatter_add_(1, index, body.long())  # (B, S)
    before_sentence = sizes.cumsum(dim=1) - sizes  # (B, S): body tokens of the earlier sentences
    by_slot = sizes.gather(1, arrangement)
    before_slot = (by_slot.cumsum(dim=1) - by_slot).gather(1, slot_of)  # (B, S): per sentence, at its slot
    moved = 1 + (before_slot - before_sentence).gather(1, index) + (j - 1)  # (B, T)
    destination = torch.where(body, moved, j)
    return torch.empty_like(destination).scatter_(1, destination, j.expand(B, T))


def span_lengths(budget: torch.Tensor, lam: float, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Poisson(``lam``) span lengths per row, drawn until their sum reaches ``budget[b]``, the last
    one trimmed so the sum is exactly the budget (fairseq ``add_whole_word_mask``).

    Returns ``(lengths [B, K], zero_length [B])``: the positive lengths in draw order (0-padded) and
    how many drawn spans had length 0 (fairseq turns these into inserted masks).
    """
    B, device = budget.shape[0], budget.device
    size = max(int(math.ceil(1.5 * (int(budget.max()) if B else 0) / lam)) + 8, 8)
    draws = torch.empty(B, 0, dtype=torch.long, device=device)
    rates = torch.full((B, size), lam, dtype=torch.float64, device=generator.device)
    for _ in range(MAX_DRAWS):
        if bool((draws.sum(dim=1) >= budget).all()):
            break
        draws = torch.cat([draws, torch.poisson(rates, generator=generator).long().to(device)], dim=1)
    if not bool((draws.sum(dim=1) >= budget).all()):
        raise objreg.DataError(f"bart: Poisson({lam}) span lengths did not reach the masking budget")
    before = draws.cumsum(dim=1) - draws  # (B, N): masked so far
    used = before < budget[:, None]
    trimmed = torch.where(used, torch.minimum(draws, budget[:, None] - before), 0)
    lengths, _ = seq2seq.compact(trimmed, used & (trimmed > 0), 0)
    return lengths, (used & (trimmed == 0)).sum(dim=1)


def mask_spans(
    tokens: torch.Tensor, real: torch.Tensor, ordinary: torch.Tensor, words: torch.Tensor,
    generator: torch.Generator, params: Mapping[str, Any], vocab: objreg.Vocabulary,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Span masking over units (words or tokens). Returns ``(tokens, lengths, inserts)``: the
    compacted rows, their lengths and the number of zero-length spans per row."""
    B, T = tokens.shape
    device = tokens.device
    previous_word = torch.nn.functional.pad(words[:, :-1], (1, 0), value=-1)
    previous_ordinary = torch.nn.functional.pad(ordinary[:, :-1], (1, 0), value=False)
    same_word = previous_ordinary & (words == previous_word) & (words >= 0)
    unit_start = ordinary & ~same_word if params["mask_length"] != "subword" else ordinary  # (B, T)
    unit = (unit_start.long().cumsum(dim=1) - 1).clamp(min=0)  # (B, T): unit of each ordinary token
    units = unit_start.sum(dim=1)  # (B,)
    budget = ceil(units, params["mask"])
    if params["mask_length"] == "span-poisson":
        lengths, inserts = span_lengths(budget, params["poisson_lambda"], generator)
    else:
        k = torch.arange(max(int(budget.max()), 1), device=device)[None, :]
        lengths, inserts = (k < budget[:, None]).long(), budget * 0  # single units
    runs = (lengths > 0).sum(dim=1)  # (B,) positive spans, at most the budget, so at most the units

    # Spans start at distinct random units; the one with random rank r gets the r-th length.
    U = max(int(units.max()), 1)
    u = torch.arange(U, device=device)[None, :]  # (1, U)
    valid = u < units[:, None]
    rank = selection.smallest_ranks(torch.where(valid, objreg.uniform((B, U), generator, device), 2.0), runs)
    start = valid & (rank < runs[:, None])  # (B, U)
    span = lengths.gather(1, rank.clamp(max=lengths.shape[1] - 1))
    reach = torch.where(start, u + span, 0).cummax(dim=1).values  # (B, U): end of the spans so far
    covered = valid & (reach > u)
    reach_before = torch.nn.functional.pad(reach[:, :-1], (1, 0), value=0)
    head = start & (reach_before <= u)  # first unit of a masked run (overlapping spans merge)
    run_of = torch.where(head, u, 0).cummax(dim=1).values  # (B, U): head of the run a unit is in
    random_run = head & (objreg.uniform((B, U), generator, device) < params["mask_random"])
    random_unit = random_run.gather(1, run_of)

    # Back to tokens.
    masked = ordinary & covered.gather(1, unit)  # (B, T)
    first = unit_start & head.gather(1, unit)  # first token of each run
    randomised = masked & random_unit.gather(1, unit)
    replace_length = params["replace_length"]
    replace = first if replace_length == 1 else masked if replace_length == -1 else torch.zeros_like(masked)
    delete = masked & ~replace
    out = torch.where(replace, vocab.mask_id, tokens)
    if params["mask_random"] > 0:
        at = replace & randomised
        out = torch.where(at, random_tokens((B, T), generator, vocab, device, at), out)
    compacted, new_length = seq2seq.compact(out, real & ~delete, vocab.pad_id)
    return compacted, new_length, inserts


def insert_tokens(
    tokens: torch.Tensor, length: torch.Tensor, count: torch.Tensor, random_count: torch.Tensor,
    generator: torch.Generator, vocab: objreg.Vocabulary,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Insert ``count[b]`` tokens at distinct random interior positions of the lengthened row (never
    first or last); the first ``random_count[b]`` of them (in random order) random ordinary tokens,
    the rest ``[MASK]`` (fairseq ``add_insertion_noise``)."""
    B, device = tokens.shape[0], tokens.device
    new_length = length + count
    W = max(int(new_length.max()), 1)
    j = torch.arange(W, device=device)[None, :]  # (1, W)
    interior = (j >= 1) & (j <= (new_length - 2)[:, None])
    rank = selection.smallest_ranks(torch.where(interior, objreg.uniform((B, W), generator, device), 2.0), count)
    slot = interior & (rank < count[:, None])
    source = ((~slot).long().cumsum(dim=1) - 1).clamp(0, tokens.shape[1] - 1)
    out = torch.where(slot, vocab.mask_id, tokens.gather(1, source))
    if bool(random_count.any()):
        at = slot & (rank < random_count[:, None])
        out = torch.where(at, random_tokens((B, W), generator, vocab, device, at), out)
    return torch.where(j < new_length[:, None], out, vocab.pad_id), new_length


def rotate(tokens: torch.Tensor, length: torch.Tensor, probability: float, generator: torch.Generator) -> torch.Tensor:
    """With ``probability``, rotate the text between the first and last token to start at a
    uniformly chosen token (fairseq ``add_rolling_noise``)."""
    B, W = tokens.shape
    device = tokens.device
    text = (length - 2).clamp(min=1)  # (B,)
    rotated = objreg.uniform((B,), generator, device) < probability
    offset = torch.where(rotated, (objreg.uniform((B,), generator, device) * text).long().clamp(max=text - 1), 0)
    j = torch.arange(W, device=device)[None, :]
    inside = (j >= 1) & (j <= (length - 2)[:, None])
    source = torch.where(inside, 1 + (j - 1 + offset[:, None]) % text[:, None], j)
    return tokens.gather(1, source)


def random_tokens(shape: tuple[int, int], generator: torch.Generator, vocab: objreg.Vocabulary,
                  device: torch.device, where: torch.Tensor | None = None) -> torch.Tensor:
    """Random ordinary (never special) token ids of ``shape``: one multinomial draw per entry,
    whichever entries are used. With ``where`` (``shape`` bool), only those entries are
    guaranteed; the others may be anything (the draws still advance the generator for all)."""
    weights = vocab.normal_token_weights(generator.device)
    if not bool(weights.any()):
        raise objreg.DataError("bart: the vocabulary has no ordinary token to draw random replacements from")
    drawn = multinomial_draws(weights, shape[0] * shape[1], generator, None if where is None else where.flatten())
    return drawn.view(shape).to(device)


def multinomial_draws(
    weights: torch.Tensor, count: int, generator: torch.Generator, where: torch.Tensor | None = None
) -> torch.Tensor:
    """``torch.multinomial(weights, count, replacement=True, generator=generator)``, the same draws:
    on the CPU that kernel takes one float64 uniform per sample (``random64``, as ``torch.rand``
    in float64 does) and binary-searches the float32 cumulative weights normalised by their sum,
    the last set to 1, for the first entry not below it, one sample at a time (a third of bart's
    corruption time at B=256). Here: the same uniforms in one ``torch.rand``, the same cumulative
    weights (a float32 cumsum of 0/1 weights is exact, so it equals the kernel's running sum),
    and one ``searchsorted`` of the samples ``where`` selects (``[count]`` bool; all when None),
    the others 0. One sample (which that kernel draws another way), other weights or devices take
    ``torch.multinomial`` itself."""
    whole = bool((weights == weights.round()).all()) and float(weights.sum()) < 2**24
    if generator.device.type != "cpu" or weights.dtype != torch.float32 or not whole or count < 2:
        return torch.multinomial(weights, count, replacement=True, generator=generator)
    cumulative = weights.cumsum(0) / weights.sum()
    cumulative[-1] = 1.0
    uniforms = torch.rand(count, dtype=torch.float64, generator=generator)
    if where is None:
        return torch.searchsorted(cumulative.double(), uniforms, side="left")
    where = where.to(uniforms.device)
    drawn = torch.zeros(count, dtype=torch.long)
    drawn[where] = torch.searchsorted(cumulative.double(), uniforms[where], side="left")
    return drawn
