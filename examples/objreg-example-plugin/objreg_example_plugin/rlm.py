"""Right-to-left language modelling ("rlm"): every token predicts the token before it.

The mirror image of causal language modelling, as in the backward language model of ELMo:
position ``i`` reads itself and the tokens to its right (keys ``j >= i``) and predicts token
``i - 1``. The mask is anti-causal, so no position ever sees the token it has to predict.

Written against the public ``objreg`` API only, exactly as a third-party plugin must be.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

import objreg


@objreg.hookimpl
def objreg_objective_info() -> objreg.ObjectiveInfo:
    return objreg.ObjectiveInfo(
        name="rlm",  # must equal the entry-point name in pyproject.toml
        description="Right-to-left language modelling: predict the previous token (anti-causal mask).",
        kind="pretrain",
        attention="anti-causal",
        heads=(objreg.HeadSpec("lm", "lm"),),
        params=(
            objreg.Param(
                "predict_special",
                False,
                "Also predict special tokens such as [CLS]; off because they are trivially predictable.",
                type=bool,
            ),
        ),
        references=(
            "Peters et al. 2018, Deep contextualized word representations (ELMo's backward LM), "
            "https://arxiv.org/abs/1802.05365",
        ),
        min_seq_len=3,
    )


@objreg.hookimpl
def objreg_corrupt(batch: objreg.TokenBatch, params: Mapping[str, Any]) -> objreg.CorruptedBatch:
    # A plugin names only the hook arguments it uses: no generator, because nothing here is
    # random; the input is the text itself and only the labels and mask differ from plain LM.
    input_ids = batch.input_ids  # (B, T)
    previous = torch.full_like(input_ids, objreg.IGNORE_INDEX)
    previous[:, 1:] = input_ids[:, :-1]

    # Position i has a target when it and i - 1 are real tokens of the same (packed) document.
    has_target = torch.zeros_like(batch.is_padding)
    has_target[:, 1:] = (
        ~batch.is_padding[:, 1:]
        & ~batch.is_padding[:, :-1]
        & (batch.document_ids[:, 1:] == batch.document_ids[:, :-1])
    )
    if not params["predict_special"]:
        has_target[:, 1:] &= ~batch.is_special[:, :-1]

    return objreg.CorruptedBatch(
        input_ids=input_ids.clone(),
        labels=torch.where(has_target, previous, torch.full_like(previous, objreg.IGNORE_INDEX)),
        is_padding=batch.is_padding.clone(),
        position_ids=objreg.masks.positions_within_documents(batch.document_ids),
        document_ids=batch.document_ids.clone(),
        extras={},
    )


@objreg.hookimpl
def objreg_attention_mask(batch: objreg.CorruptedBatch) -> torch.Tensor:
    # Pure: runs under torch.func transforms. Anti-causal (query i sees keys j >= i), and
    # same_document keeps packed documents apart and never attends to padding.
    T = batch.input_ids.shape[1]
    right_of_query = torch.ones(T, T, dtype=torch.bool, device=batch.input_ids.device).triu()
    return right_of_query[None] & objreg.masks.same_document(batch.document_ids)  # (B, T, T)


@objreg.hookimpl
def objreg_loss(outputs: objreg.ModelOutputs, batch: objreg.CorruptedBatch) -> torch.Tensor:
    # Pure and transform-safe: fixed shapes throughout (no boolean indexing, no .item()).
    logits = outputs.model.heads["lm"](outputs.hidden)  # (B, T, V)
    log_probs = torch.log_softmax(logits, dim=-1)
    has_label = batch.labels != objreg.IGNORE_INDEX  # (B, T)
    # gather needs a valid id everywhere; positions without a label read id 0 and are zeroed.
    targets = torch.where(has_label, batch.labels, torch.zeros_like(batch.labels))
    nll = -log_probs.gather(-1, targets[..., None])[..., 0]  # (B, T)
    nll = torch.where(has_label, nll, torch.zeros_like(nll))
    # Mean over the labelled tokens of each row; a row without labels has loss 0, not NaN.
    return nll.sum(dim=-1) / has_label.sum(dim=-1).clamp(min=1)  # (B,)
