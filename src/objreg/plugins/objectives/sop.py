"""Sentence-order prediction (ALBERT): are two consecutive segments of one document in order?

Each row ``[CLS] s_0 … s_{n-1} [SEP]`` is split at a sentence boundary chosen uniformly,
``A = s_0 … s_{k-1}``, ``B = s_k … s_{n-1}``, and becomes ``[CLS] A [SEP] B [SEP]`` (label 0) or,
with probability ``swap_prob``, ``[CLS] B [SEP] A [SEP]`` (label 1). Both segments always come
from the same document, so the task is about order, not topic (unlike BERT's NSP). Unlike
google-research/albert, a row with one sentence is an error rather than a silent NSP-style
negative from another document.

The extra ``[SEP]`` makes each row one token longer: the output has width ``T + 1``. The split and
the layout are :mod:`objreg.toolkit.segments`, shared with ``nsp`` and ``contrastive``.

Written exactly like a third-party plugin: it imports only ``objreg``, its toolkit and ``torch``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

import objreg
from objreg.toolkit import losses, segments


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
    ids = batch.input_ids
    B, T = ids.shape
    a, b = segments.split_pair(batch, vocab, generator, "sop")
    swap = objreg.uniform((B,), generator, ids.device) < params["swap_prob"]  # (B,)
    tokens, is_padding, _ = segments.join_pair(ids, segments.choose(swap, b, a), segments.choose(swap, a, b), vocab)
    document = batch.document_ids[:, :1]  # (B, 1): one document per row (checked)
    return objreg.CorruptedBatch(
        input_ids=tokens,
        labels=torch.full_like(tokens, objreg.IGNORE_INDEX),
        is_padding=is_padding,
        position_ids=torch.arange(T + 1, device=ids.device).expand(B, T + 1).clone(),
        document_ids=torch.where(is_padding, -1, document),
        extras={"order_label": swap.long()},
    )


@objreg.hookimpl
def objreg_loss(outputs: objreg.ModelOutputs, batch: objreg.CorruptedBatch) -> torch.Tensor:
    logits = outputs.model.heads["order"](outputs.hidden)  # (B, 2), from the first token
    return losses.class_nll(logits, batch.extras["order_label"])  # (B,)
