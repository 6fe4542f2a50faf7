"""The masked-LM family's batch, attention and loss (``mlm``, ``wwm``, ``span`` and third-party
masking objectives).

The LM head runs only at the selected positions, gathered into fixed-size lists (BERT's
``masked_lm_positions``/``_weights``), with optional label smoothing ε (the
``torch.nn.functional.cross_entropy`` convention: ε spread uniformly over all V classes) and
optional consistency regularisation between two independently masked views of the same text:
``KL(p(v₁) ‖ sg[p(v₂)])`` at the positions selected in both views, ``sg`` a true stop-gradient
(``detach``), added with weight ``consistency_weight`` to the NLL of view 1. Both options are the
objective's parameters (:data:`objreg.toolkit.modifiers.MODIFIER_PARAMS`), read from ``params``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import torch

from objreg.core import masks
from objreg.core.errors import DataError
from objreg.core.model import Model
from objreg.core.types import IGNORE_INDEX, CorruptedBatch, ModelOutputs, TokenBatch, Vocabulary
from objreg.toolkit.losses import consistency_kl, gather_positions, smoothed_nll, weighted_mean
from objreg.toolkit.selection import selection_lists
from objreg.toolkit.surprisal import token_surprisal


class MaskedView(NamedTuple):
    """One masked view of a batch: the corrupted ids and which positions are to be predicted."""

    input_ids: torch.Tensor
    selected: torch.Tensor


def masked_lm_batch(batch: TokenBatch, view: MaskedView, second: MaskedView | None = None) -> CorruptedBatch:
    """The :class:`CorruptedBatch` of a masking objective, with the extras :func:`masked_lm_loss`
    reads: ``masked_positions``/``masked_weights`` always; the second view
    (``consistency_input_ids``, ``consistency_positions``/``_weights`` at the positions selected in
    both views) when it is given."""
    positions, weights = selection_lists(view.selected)
    extras = {"masked_positions": positions, "masked_weights": weights}
    if second is not None:
        both_positions, both_weights = selection_lists(view.selected & second.selected)
        extras |= {
            "consistency_input_ids": second.input_ids,
            "consistency_positions": both_positions,
            "consistency_weights": both_weights,
        }
    return CorruptedBatch(
        input_ids=view.input_ids,
        labels=torch.where(view.selected, batch.input_ids, IGNORE_INDEX),
        is_padding=batch.is_padding.clone(),
        position_ids=document_positions(batch.document_ids),
        document_ids=batch.document_ids.clone(),
        extras=extras,
    )


def document_positions(document_ids: torch.Tensor) -> torch.Tensor:
    """:func:`objreg.masks.positions_within_documents`, with a shortcut for batches whose rows
    hold one document each (what ``Tokenizer.assemble`` builds): no document starts after the
    first token, so the positions are ``0 … T-1`` (the same tensor, without the scan)."""
    B, T = document_ids.shape
    if T > 1:
        # In numpy on the CPU, whose any() stops at the first True (torch's reads the whole batch).
        documents = document_ids.numpy() if document_ids.device.type == "cpu" else document_ids
        later = documents[:, 1:]
        if not ((later != documents[:, :-1]) & (later >= 0)).any():
            return torch.arange(T, device=document_ids.device).expand(B, T).clone()
    return masks.positions_within_documents(document_ids)


def attention(batch: CorruptedBatch) -> masks.AttentionMask:
    """Bidirectional within each document: the attention of every masking objective."""
    return masks.AttentionMask.bidirectional(batch.is_padding, batch.document_ids)


def masked_lm_loss(
    outputs: ModelOutputs, batch: CorruptedBatch, params: Mapping[str, Any], mask: torch.Tensor, head: str = "lm"
) -> torch.Tensor:
    """Per-sample masked-LM loss ``[B]``: mean (smoothed, ``params["label_smoothing"]``) NLL over the
    selected positions, plus ``params["consistency_weight"]`` × mean KL over the positions selected
    in both views when the batch has a second view. ``mask`` is the batch's dense attention mask,
    which the second view's backbone pass uses. Pure and transform-safe; a row with nothing
    selected gets 0."""
    lm = outputs.model.heads[head]
    extras = batch.extras
    positions = extras["masked_positions"]  # (B, K)
    logits = lm(gather_positions(outputs.hidden, positions))  # (B, K, V)
    # clamp: list padding points at position 0, whose label is IGNORE_INDEX; its weight is 0.
    targets = batch.labels.gather(1, positions).clamp(min=0)  # (B, K)
    nll = smoothed_nll(logits, targets, float(params.get("label_smoothing", 0.0)))  # (B, K)
    loss = weighted_mean(nll, extras["masked_weights"])  # (B,)
    if "consistency_input_ids" not in extras:
        return loss
    both = extras["consistency_positions"]  # (B, K2)
    with torch.no_grad():  # the second view only serves as a stopped target; detach below makes it exact
        other = outputs.model.encode(extras["consistency_input_ids"], mask, batch.position_ids)
    kl = consistency_kl(lm(gather_positions(outputs.hidden, both)), lm(gather_positions(other, both)))  # (B, K2)
    return loss + float(params["consistency_weight"]) * weighted_mean(kl, extras["consistency_weights"])


def prepare(batch: TokenBatch, model: Model, params: Mapping[str, Any], vocab: Vocabulary) -> TokenBatch | None:
    """What ``objreg_prepare_batch`` of a masking objective does: the ``entropy`` policy needs
    the current model's surprisal of each token; every other policy needs nothing (``None``)."""
    if params.get("masking_policy") != "entropy":
        return None
    return batch._replace(surprisal=token_surprisal(model, batch, vocab))


def require_mask_token(vocab: Vocabulary | None, objective: str) -> None:
    """Before any model is loaded (``objreg_check_params``): a :class:`DataError` with the fix
    when the vocabulary's mask token is no token of its own but the row or padding token (a
    GPT-2-style tokenizer has no mask token, and objreg's Hugging Face loader then lets its
    end-of-text token stand in for it, which masking must not insert). Nothing to check without
    a vocabulary (None)."""
    if vocab is not None and vocab.mask_id in (vocab.cls_id, vocab.sep_id, vocab.pad_id):
        raise DataError(
            f"{objective} needs a mask token of its own, which the tokenizer lacks; add one "
            f"(tokenizer.add_tokens(['[MASK]'], special_tokens=True)), resize the model "
            f"(model.resize_token_embeddings(len(tokenizer))) and save both to the model directory"
        )
