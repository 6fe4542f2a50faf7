"""Sentence-order prediction (ALBERT): are two consecutive segments of one document in order?

Each row ``[CLS] s_0 … s_{n-1} [SEP]`` is split at a sentence boundary chosen uniformly,
``A = s_0 … s_{k-1}``, ``B = s_k … s_{n-1}``, and becomes ``[CLS] A [SEP] B [SEP]`` (label 0) or,
with probability ``swap_prob``, ``[CLS] B [SEP] A [SEP]`` (label 1). Both segments always come
from the same document, so the task is about order, not topic (unlike BERT's NSP). Unlike
google-research/albert, a row with one sentence is an error rather than a silent NSP-style
negative from another document.

The extra ``[SEP]`` makes each row one token longer: the output has width ``T + 1``. Built with
index arithmetic and one ``gather``, vectorised over the batch.

Written exactly like a third-party plugin: it imports only ``objreg`` and ``torch``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

import objreg
from objreg import IGNORE_INDEX, masks


@objreg.hookimpl
def objreg_objective_info() -> objreg.ObjectiveInfo:
    return objreg.ObjectiveInfo(
        name="sop",
        description="Sentence-order prediction (ALBERT): were two consecutive segments swapped?",
        kind="pretrain",
        attention="bidirectional",
        heads=(objreg.HeadSpec("order", "classifier", 2),),
        params=(
            objreg.Param(
                "swap_prob", 0.5, "Probability that the two segments are swapped (label 1).", float, 0.0, 1.0,
            ),
        ),
        references=(
            "Lan et al. 2020, ALBERT: A Lite BERT for Self-supervised Learning of Language Representations",
            "google-research/albert create_pretraining_data.py (random_next_sentence=False: swap A and B)",
        ),
        min_seq_len=4,
        min_sentences=2,
    )


@objreg.hookimpl
def objreg_corrupt(
    batch: objreg.TokenBatch, generator: torch.Generator, params: Mapping[str, Any], vocab: objreg.Vocabulary
) -> objreg.CorruptedBatch:
    ids, device = batch.input_ids, batch.input_ids.device
    B, T = ids.shape
    length = (~batch.is_padding).sum(dim=1)  # (B,): real tokens, [CLS] and [SEP] included
    _check_layout(batch, length)
    split = _split_positions(batch, length, generator)  # (B,): first token of segment B
    swap = objreg.uniform((B,), generator, device) < params["swap_prob"]  # (B,)

    # The first output segment starts at `first` and has `first_len` tokens, the second at `second`.
    len_a, len_b = split - 1, length - 1 - split  # (B,), (B,)
    first = torch.where(swap, split, 1)[:, None]  # (B, 1)
    first_len = torch.where(swap, len_b, len_a)[:, None]  # (B, 1)
    second = torch.where(swap, 1, split)[:, None]  # (B, 1)
    end = length[:, None]  # (B, 1): the final [SEP] lands at index `length`

    # Output layout: 0 [CLS] | 1..first_len first | first_len+1 [SEP] | ..end-1 second | end [SEP]
    j = torch.arange(T + 1, device=device)[None, :]  # (1, T+1)
    in_first = (j >= 1) & (j <= first_len)  # (B, T+1)
    in_second = (j >= first_len + 2) & (j < end)  # (B, T+1)
    source = torch.where(in_first, first + j - 1, second + j - first_len - 2)  # (B, T+1)
    source = torch.where(in_first | in_second, source, 0)
    tokens = ids.gather(1, source)  # (B, T+1)

    out = torch.where(in_first | in_second, tokens, vocab.pad_id)
    out = torch.where(j == 0, vocab.cls_id, out)
    out = torch.where((j == first_len + 1) | (j == end), vocab.sep_id, out)
    is_padding = j > end  # (B, T+1)
    segment_ids = ((j >= first_len + 2) & (j <= end)).long()  # (B, T+1)
    document = batch.document_ids[:, :1]  # (B, 1): one document per row (checked)
    return objreg.CorruptedBatch(
        input_ids=out,
        labels=torch.full_like(out, IGNORE_INDEX),
        is_padding=is_padding,
        position_ids=j.expand(B, T + 1).clone(),
        document_ids=torch.where(is_padding, -1, document),
        extras={"order_label": swap.long(), "segment_ids": segment_ids},
    )


@objreg.hookimpl
def objreg_attention_mask(batch: objreg.CorruptedBatch) -> torch.Tensor:
    return masks.bidirectional(batch.is_padding) & masks.same_document(batch.document_ids)  # (B, T, T)


@objreg.hookimpl
def objreg_loss(outputs: objreg.ModelOutputs, batch: objreg.CorruptedBatch) -> torch.Tensor:
    logits = outputs.model.heads["order"](outputs.hidden)  # (B, 2), from the first token
    log_probs = torch.log_softmax(logits, dim=-1)  # (B, 2)
    label = batch.extras["order_label"]  # (B,)
    return -log_probs.gather(-1, label.unsqueeze(-1)).squeeze(-1)  # (B,)


# -- corruption steps ---------------------------------------------------------------------------


def _check_layout(batch: objreg.TokenBatch, length: torch.Tensor) -> None:
    """Rows must be ``[CLS] sentences [SEP]`` + right padding, from one document, as objreg's
    tokenizers build them: every sentence token lies in positions ``1 .. length-2`` (a special
    token written literally in the text may sit among them, with no sentence)."""
    T = batch.input_ids.shape[1]
    j = torch.arange(T, device=length.device)[None, :]  # (1, T)
    body = (j >= 1) & (j <= (length - 2)[:, None])  # (B, T)
    framed = ~((batch.sentence_ids >= 0) & ~body)
    one_document = (batch.document_ids == batch.document_ids[:, :1]) | batch.is_padding
    bad = ~(framed & one_document).all(dim=1)  # (B,)
    if bool(bad.any()):
        row = int(bad.nonzero()[0, 0])
        raise objreg.DataError(
            f"sop needs each row framed as [CLS] sentences [SEP] + padding, from one document; row {row} is not "
            f"(packed rows cannot be split into sentence pairs)"
        )


def _split_positions(batch: objreg.TokenBatch, length: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """For each row, the position where a uniformly chosen sentence boundary starts segment B."""
    # -1 at [CLS], [SEP], padding and literal special tokens; sentence ids only grow along a row,
    # so a running maximum gives a literal special token the sentence it sits in.
    sentence = torch.cummax(batch.sentence_ids, dim=1).values  # (B, T)
    B, T = sentence.shape
    j = torch.arange(T, device=length.device)[None, :]  # (1, T)
    body = (j >= 1) & (j <= (length - 2)[:, None])  # (B, T)
    boundary = torch.zeros_like(batch.is_padding)  # (B, T): True at the first token of s_1 … s_{n-1}
    boundary[:, 1:] = body[:, 1:] & (sentence[:, :-1] >= 0) & (sentence[:, 1:] != sentence[:, :-1])
    num_boundaries = boundary.sum(dim=1)  # (B,) = sentences - 1
    num_sentences = num_boundaries + (batch.sentence_ids >= 0).any(dim=1).long()
    short = num_sentences < 2
    if bool(short.any()):
        row = int(short.nonzero()[0, 0])
        raise objreg.DataError(
            f"sop needs at least 2 sentences in each row; row {row} has {int(num_sentences[row])} "
            f"({int(short.sum())} of {B} rows are too short; sample rows with min_sentences=2)"
        )
    # r-th boundary, r uniform in 0 .. n-2 (clamp guards a float rounding up to n-1).
    pick = (objreg.uniform((B,), generator, sentence.device) * num_boundaries).long()
    pick = torch.minimum(pick, num_boundaries - 1)  # (B,)
    rank = boundary.cumsum(dim=1)  # (B, T): boundaries up to and including t
    chosen = boundary & (rank == (pick + 1)[:, None])  # (B, T): exactly one True per row
    return chosen.long().argmax(dim=1)
