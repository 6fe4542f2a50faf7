"""Masked language modelling with BERT's 80/10/10 replacement and RoBERTa's dynamic masking.

Each call draws a fresh mask from the given generator (dynamic masking). Selection is i.i.d.
Bernoulli(``mask_prob``) over ordinary tokens, as in Hugging Face's collator, plus BERT's
``max(1, ·)``: a row with something to mask always predicts at least one token. Of the selected
tokens, ``mask_replace_prob`` become ``[MASK]``, ``random_replace_prob`` a random *ordinary* token
(Hugging Face and google-research/bert can draw special tokens here; fairseq cannot, nor can we)
and the rest stay unchanged.

The loss runs the LM head only at the selected positions, gathered into fixed-size lists
(``masked_positions``/``masked_weights``, like BERT's ``masked_lm_positions``/``_weights``): about
15% of the head's work, with shapes that do not depend on the data inside the transforms.

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
        name="mlm",
        description="Masked LM (BERT/RoBERTa): dynamic 15% masking, 80% [MASK] / 10% random / 10% kept.",
        kind="pretrain",
        attention="bidirectional",
        heads=(objreg.HeadSpec("lm", "lm"),),
        params=(
            objreg.Param(
                "mask_prob", 0.15, "Probability that each ordinary (non-special, non-padding) token is "
                "selected for prediction; a row with none selected still predicts one.", float, 0.0, 1.0,
            ),
            objreg.Param(
                "mask_replace_prob", 0.8, "Share of the selected tokens replaced by [MASK].", float, 0.0, 1.0,
            ),
            objreg.Param(
                "random_replace_prob", 0.1, "Share of the selected tokens replaced by a random ordinary "
                "token; the rest stay unchanged. mask_replace_prob + random_replace_prob must be at most 1.",
                float, 0.0, 1.0,
            ),
        ),
        references=(
            "Devlin et al. 2019, BERT: Pre-training of Deep Bidirectional Transformers for Language Understanding",
            "Liu et al. 2019, RoBERTa: A Robustly Optimized BERT Pretraining Approach (dynamic masking)",
            "google-research/bert create_pretraining_data.py (80/10/10, max(1, ·), masked_lm_positions)",
            "facebookresearch/fairseq fairseq/data/mask_tokens_dataset.py (special tokens never drawn)",
            "huggingface/transformers DataCollatorForLanguageModeling (mask_replace_prob, random_replace_prob)",
        ),
        min_seq_len=3,
    )


@objreg.hookimpl
def objreg_corrupt(
    batch: objreg.TokenBatch, generator: torch.Generator, params: Mapping[str, Any], vocab: objreg.Vocabulary
) -> objreg.CorruptedBatch:
    ids = batch.input_ids  # (B, T)
    selected = _select(batch, generator, params["mask_prob"])  # (B, T) bool
    corrupted = _replace(ids, selected, generator, params, vocab)  # (B, T)
    positions, weights = _selection_lists(selected)  # (B, K), (B, K)
    return objreg.CorruptedBatch(
        input_ids=corrupted,
        labels=torch.where(selected, ids, IGNORE_INDEX),
        is_padding=batch.is_padding.clone(),
        position_ids=masks.positions_within_documents(batch.document_ids),
        document_ids=batch.document_ids.clone(),
        extras={"masked_positions": positions, "masked_weights": weights},
    )


@objreg.hookimpl
def objreg_attention_mask(batch: objreg.CorruptedBatch) -> torch.Tensor:
    return masks.bidirectional(batch.is_padding) & masks.same_document(batch.document_ids)  # (B, T, T)


@objreg.hookimpl
def objreg_loss(outputs: objreg.ModelOutputs, batch: objreg.CorruptedBatch) -> torch.Tensor:
    positions = batch.extras["masked_positions"]  # (B, K)
    H = outputs.hidden.shape[-1]
    picked = outputs.hidden.gather(1, positions.unsqueeze(-1).expand(-1, -1, H))  # (B, K, H)
    logits = outputs.model.heads["lm"](picked)  # (B, K, V)
    targets = batch.labels.gather(1, positions)  # (B, K)
    weights = batch.extras["masked_weights"].to(logits.dtype)  # (B, K): 0 at list padding
    log_probs = torch.log_softmax(logits, dim=-1)  # (B, K, V)
    # clamp: list padding points at position 0, whose label is IGNORE_INDEX; its weight is 0.
    nll = -log_probs.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)  # (B, K)
    return (nll * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1)


@objreg.hookimpl
def objreg_check_params(params: Mapping[str, Any]) -> None:
    # Each value is bounds-checked by its Param; only the sum spans two parameters.
    total = params["mask_replace_prob"] + params["random_replace_prob"]
    if total > 1 + 1e-9:
        raise objreg.InvalidParameterError(
            f"mlm: mask_replace_prob ({params['mask_replace_prob']}) + random_replace_prob "
            f"({params['random_replace_prob']}) = {total:g} must be at most 1 (the rest of the selected "
            f"tokens stay unchanged)"
        )


# -- corruption steps ---------------------------------------------------------------------------


def _select(batch: objreg.TokenBatch, generator: torch.Generator, mask_prob: float) -> torch.Tensor:
    """Bernoulli(mask_prob) over ordinary tokens, then at least one per row that has any."""
    B, T = batch.input_ids.shape
    device = batch.input_ids.device
    maskable = ~(batch.is_special | batch.is_padding)  # (B, T)
    selected = (objreg.uniform((B, T), generator, device) < mask_prob) & maskable  # (B, T)
    # BERT's max(1, ·): a uniformly random maskable position, the argmax of random keys. Drawn
    # for every row, so the generator advances the same way whatever the data.
    keys = torch.where(maskable, objreg.uniform((B, T), generator, device), -1.0)  # (B, T)
    forced = torch.nn.functional.one_hot(keys.argmax(dim=1), T).bool() & maskable  # (B, T)
    nothing_yet = ~selected.any(dim=1, keepdim=True)  # (B, 1)
    return selected | (forced & nothing_yet)


def _replace(
    ids: torch.Tensor, selected: torch.Tensor, generator: torch.Generator, params: Mapping[str, Any],
    vocab: objreg.Vocabulary,
) -> torch.Tensor:
    """80/10/10 (by default) among the selected positions; ``ids`` is not modified."""
    B, T = ids.shape
    p_mask, p_random = params["mask_replace_prob"], params["random_replace_prob"]
    u = objreg.uniform((B, T), generator, ids.device)  # (B, T): one draw decides each position's fate
    to_mask = selected & (u < p_mask)
    out = torch.where(to_mask, vocab.mask_id, ids)
    if p_random > 0:
        to_random = selected & (u >= p_mask) & (u < p_mask + p_random)
        weights = vocab.normal_token_weights(generator.device)  # (V,): 0 at special ids
        if not bool(weights.any()):
            raise objreg.DataError("mlm: the vocabulary has no ordinary token to draw random replacements from")
        random_ids = torch.multinomial(weights, B * T, replacement=True, generator=generator)
        out = torch.where(to_random, random_ids.view(B, T).to(ids.device), out)
    return out


def _selection_lists(selected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
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
