"""Fill-in-the-middle (Bavarian et al. 2022): causal LM over a document cut into prefix, middle and
suffix and reordered so the middle comes last.

A share ``fim_rate`` of the rows ``[CLS] x_1 … x_n [SEP]`` is split at two points drawn uniformly
from ``0 … n`` (token level, as loubnabnl/santacoder-finetuning; bigcode's Megatron splits
characters of the detokenised text), so any fragment may be empty. PSM trains on
``[CLS] [FIM_PREFIX] prefix [FIM_SUFFIX] suffix [FIM_MIDDLE] middle [SEP]``, SPM (with probability
``fim_spm_rate``; bigcode's variant) on ``[CLS] [FIM_PREFIX] [FIM_SUFFIX] suffix [FIM_MIDDLE] prefix
middle [SEP]``; ``[SEP]`` plays ``<EOT>``, so the model learns where the middle ends. The other rows
are plain causal LM.

The tokens stay in their **original order**, ``[CLS] [FIM_PREFIX] prefix [FIM_MIDDLE] middle
[FIM_SUFFIX] suffix [SEP]``; each position's place in the FIM order is its position id, and the
attention mask is causal in that order. In original order this means: the left part is causal; in
PSM the middle sees all of the left and the right plus the earlier middle, and the right sees the
left and the earlier right but not the middle; in SPM the right comes first (after ``[CLS]
[FIM_PREFIX]``), and the left and middle see it. The mask is a permuted causal mask, so a row of
``n`` real tokens allows exactly ``n(n+1)/2`` connections, and with the FIM position ids the model
computes exactly what it would on the reordered sequence. Every position predicts the token that
follows it in the FIM order, as in the references (loss on every token, sentinels included).
``extras``: ``fim_mode`` (0 plain, 1 PSM, 2 SPM) and ``fim_cuts`` (the two split points, in text
tokens; unused where ``fim_mode`` is 0).

Known problems of the references avoided: the row grows by the three sentinels instead of being
truncated back to its length (bigcode cuts off the end of a long middle); padding is excluded by
position (bigcode keeps ``<fim_pad>`` in the loss); empty fragments keep their sentinels
(NVIDIA/Megatron-LM PR #7552).

A permuted causal mask is none of the patterns of :class:`objreg.AttentionMask`, so the objective
declares ``attention="custom"`` and returns the dense ``[B, T, T]`` mask.

Written like a third-party plugin: it imports only ``objreg``, its toolkit and ``torch``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

import objreg
from objreg import IGNORE_INDEX, masks
from objreg.toolkit import losses, seq2seq

#: Segments of a FIM row in original order.
CLS, PRE, PREFIX, MID, MIDDLE, SUF, SUFFIX, SEP = range(8)
#: The order of the segments in the sequence the model learns from, per mode (none, PSM, SPM).
ORDERS = (
    (CLS, PRE, PREFIX, MID, MIDDLE, SUF, SUFFIX, SEP),  # no FIM: the original text, causal
    (CLS, PRE, PREFIX, SUF, SUFFIX, MID, MIDDLE, SEP),  # PSM
    (CLS, PRE, SUF, SUFFIX, MID, PREFIX, MIDDLE, SEP),  # SPM
)
MARKERS = ("[FIM_PREFIX]", "[FIM_MIDDLE]", "[FIM_SUFFIX]")


@objreg.hookimpl
def objreg_objective_info() -> objreg.ObjectiveInfo:
    return objreg.ObjectiveInfo(
        name="fim",
        description="Fill-in-the-middle: PSM/SPM causal LM, mask and positions in the FIM order, tokens in "
                    "original order.",
        kind="pretrain",
        attention="custom",
        heads=(objreg.HeadSpec("lm", "lm"),),
        params=(
            objreg.Param("fim_rate", 0.5, "Share of rows transformed to fill-in-the-middle; the rest stay "
                         "plain causal LM.", float, 0.0, 1.0),
            objreg.Param("fim_spm_rate", 0.5, "Share of the FIM rows in SPM order (suffix first) rather than PSM.",
                         float, 0.0, 1.0),
        ),
        references=(
            "Bavarian et al. 2022, Efficient Training of Language Models to Fill in the Middle",
            "bigcode-project/Megatron-LM megatron/data/gpt_dataset.py (permute: PSM / SPM, --fim-rate, "
            "--fim-spm-rate)",
            "loubnabnl/santacoder-finetuning fim.py (token-level split points)",
            "NVIDIA/Megatron-LM PR #7552 (separators around empty fragments)",
        ),
        min_seq_len=3,
    )


@objreg.hookimpl
def objreg_check_params(vocab: objreg.Vocabulary | None) -> None:
    seq2seq.require_tokens(vocab, MARKERS, False, "fim")  # before the model loads, with the fix


@objreg.hookimpl
def objreg_corrupt(
    batch: objreg.TokenBatch, generator: torch.Generator, params: Mapping[str, Any], vocab: objreg.Vocabulary
) -> objreg.CorruptedBatch:
    ids, device = batch.input_ids, batch.input_ids.device
    B = ids.shape[0]
    markers = [seq2seq.named_id(vocab, m, "fim") for m in MARKERS]
    length = (~batch.is_padding).sum(dim=1)  # (B,)
    text = (length - 2).clamp(min=0)  # (B,): tokens between [CLS] and [SEP]
    fim = (objreg.uniform((B,), generator, device) < params["fim_rate"]) & (length >= 2)
    spm = fim & (objreg.uniform((B,), generator, device) < params["fim_spm_rate"])
    mode = fim.long() + spm.long()  # (B,): 0 none, 1 PSM, 2 SPM
    # Two split points uniform in 0 … n (bigcode: randint(0, len + 1) twice, sorted).
    cuts = (objreg.uniform((B, 2), generator, device) * (text + 1)[:, None]).long()
    cuts = torch.minimum(cuts, text[:, None]).sort(dim=1).values  # (B, 2)
    start, end = cuts[:, 0], cuts[:, 1]

    one, marker = torch.ones_like(text), fim.long()
    first, last = length.clamp(max=1), (length >= 2).long()  # [CLS] and [SEP], unless the row is shorter
    sizes = torch.stack([first, marker, start, marker, end - start, marker, text - end, last], dim=1)  # (B, 8)
    # Where each segment's tokens come from in the original row (markers come from `markers`).
    origin = torch.stack([0 * one, 0 * one, one, 0 * one, 1 + start, 0 * one, 1 + end, length - 1], dim=1)
    total = sizes.sum(dim=1)  # (B,)
    W = max(int(total.max()), 1)
    p = torch.arange(W, device=device)[None, :]  # (1, W)
    ends = sizes.cumsum(dim=1)  # (B, 8)
    segment = (ends[:, None, :] <= p[:, :, None]).sum(dim=2).clamp(max=SEP)  # (B, W)
    within = p - (ends - sizes).gather(1, segment)  # (B, W): offset inside the segment
    source = (origin.gather(1, segment) + within).clamp(0, ids.shape[1] - 1)
    tokens = ids.gather(1, source)
    for kind, token_id in zip((PRE, MID, SUF), markers):
        tokens = torch.where(segment == kind, token_id, tokens)
    is_padding = p >= total[:, None]  # (B, W)
    tokens = torch.where(is_padding, vocab.pad_id, tokens)

    # Position ids: each token's place in the FIM order; padding keeps its own index (all distinct).
    order = torch.tensor(ORDERS, device=device)[mode]  # (B, 8)
    ordered_sizes = sizes.gather(1, order)
    first_rank = torch.zeros_like(sizes).scatter_(1, order, ordered_sizes.cumsum(dim=1) - ordered_sizes)
    rank = torch.where(is_padding, p, first_rank.gather(1, segment) + within)  # (B, W): a permutation
    # Each position predicts the token that follows it in the FIM order.
    at_rank = torch.empty_like(rank).scatter_(1, rank, p.expand(B, W).contiguous())  # rank -> position
    following = tokens.gather(1, at_rank.gather(1, (rank + 1).clamp(max=W - 1)))
    labels = torch.where(rank + 1 < total[:, None], following, IGNORE_INDEX)
    return objreg.CorruptedBatch(
        input_ids=tokens,
        labels=labels,
        is_padding=is_padding,
        position_ids=rank,
        document_ids=torch.where(is_padding, -1, seq2seq.row_document(batch)[:, None]),
        extras={"fim_mode": mode, "fim_cuts": cuts},
    )


@objreg.hookimpl
def objreg_attention_mask(batch: objreg.CorruptedBatch) -> torch.Tensor:
    order = batch.position_ids  # (B, T): place in the FIM order
    causal_in_fim_order = order[:, :, None] >= order[:, None, :]  # (B, T, T)
    return causal_in_fim_order & masks.bidirectional(batch.is_padding) & masks.same_document(batch.document_ids)


@objreg.hookimpl
def objreg_loss(outputs: objreg.ModelOutputs, batch: objreg.CorruptedBatch) -> torch.Tensor:
    logits = outputs.model.heads["lm"](outputs.hidden)  # (B, T, V)
    nll, labelled = losses.token_nll(logits, batch.labels)  # (B, T), (B, T)
    return losses.weighted_mean(nll, labelled)  # (B,)
