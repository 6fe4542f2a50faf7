"""Causal language modelling: predict every next token under a causal mask (GPT).

Two things other implementations get wrong, both handled here:

* Padding is excluded from the loss by *position* (``is_padding``), never by token id. When the
  pad id equals the end-of-text id, a real end-of-text token stays in the loss, so the model
  learns to stop (huggingface/transformers#23530).
* Packed rows keep documents apart: a token never predicts the first token of the next document,
  the attention mask is block-diagonal per document and positions restart at each document
  (Megatron's ``--reset-attention-mask --reset-position-ids``).

Written exactly like a third-party plugin: it imports only ``objreg``, its toolkit and ``torch``.
"""

from __future__ import annotations

import torch

import objreg
from objreg import IGNORE_INDEX, masks
from objreg.toolkit import losses


@objreg.hookimpl
def objreg_objective_info() -> objreg.ObjectiveInfo:
    return objreg.ObjectiveInfo(
        name="clm",
        description="Causal LM: next-token prediction with a causal, per-document attention mask.",
        kind="pretrain",
        attention="causal",
        heads=(objreg.HeadSpec("lm", "lm"),),
        params=(),
        references=(
            "Radford et al. 2018, Improving Language Understanding by Generative Pre-Training (GPT)",
            "Radford et al. 2019, Language Models are Unsupervised Multitask Learners (GPT-2)",
            "NVIDIA/Megatron-LM megatron/utils.py get_ltor_masks_and_position_ids (document-boundary "
            "masks, position resets)",
            "huggingface/transformers#23530 (padding masked by token id drops end-of-text from the loss)",
        ),
        min_seq_len=2,
    )


# No generator, params or vocab: causal LM has no randomness and no parameters (pluggy passes
# only the arguments a hook names).
@objreg.hookimpl
def objreg_corrupt(batch: objreg.TokenBatch) -> objreg.CorruptedBatch:
    ids, docs = batch.input_ids, batch.document_ids  # (B, T)
    real = ~batch.is_padding  # (B, T)
    # Position t predicts token t+1 when both are real tokens of the same document.
    has_next = real[:, :-1] & real[:, 1:] & (docs[:, :-1] == docs[:, 1:])  # (B, T-1)
    next_ids = torch.where(has_next, ids[:, 1:], IGNORE_INDEX)  # (B, T-1)
    last = torch.full_like(ids[:, :1], IGNORE_INDEX)  # (B, 1): nothing follows the last position
    labels = torch.cat([next_ids, last], dim=1)  # (B, T)
    return objreg.CorruptedBatch(
        input_ids=ids.clone(),
        labels=labels,
        is_padding=batch.is_padding.clone(),
        position_ids=masks.positions_within_documents(docs),
        document_ids=docs.clone(),
        extras={},
    )


@objreg.hookimpl
def objreg_loss(outputs: objreg.ModelOutputs, batch: objreg.CorruptedBatch) -> torch.Tensor:
    logits = outputs.model.heads["lm"](outputs.hidden)  # (B, T, V)
    nll, labelled = losses.token_nll(logits, batch.labels)  # (B, T), (B, T)
    return losses.weighted_mean(nll, labelled)  # (B,); a row with no labels gets loss 0, not NaN
