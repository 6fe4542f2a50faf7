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

Selection, replacement, loss and the modifiers (``masking_policy``, ``label_smoothing``,
``consistency_weight``) are the shared pieces of ``objreg.toolkit``, which ``wwm`` and ``span`` use
too. With a weighted policy a token is selected with probability ``min(1, c · w)``, ``c`` chosen so
the expected count stays ``mask_prob · n``.

Written exactly like a third-party plugin: it imports only ``objreg``, its toolkit and ``torch``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

import objreg
from objreg.toolkit import masked_lm, modifiers, replacement, selection


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
            *replacement.replacement_params(),
            *modifiers.MODIFIER_PARAMS,
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
    uniform = params["masking_policy"] == "uniform"
    # (B, T); None for the uniform policy, whose selection needs one probability per row
    weights = None if uniform else selection.policy_weights(batch, params["masking_policy"], vocab, "mlm")
    view = _view(batch, weights, generator, params, vocab)
    second = _view(batch, weights, generator, params, vocab) if params["consistency_weight"] > 0 else None
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
    masked_lm.require_mask_token(vocab, "mlm")  # before the model loads, with the fix
    replacement.check_replacement(params, "mlm")


def _view(
    batch: objreg.TokenBatch, weights: torch.Tensor | None, generator: torch.Generator, params: Mapping[str, Any],
    vocab: objreg.Vocabulary,
) -> masked_lm.MaskedView:
    """One dynamic mask: Bernoulli selection with BERT's max(1, ·), then 80/10/10 per token."""
    selected = selection.bernoulli_select(weights, selection.maskable(batch), params["mask_prob"], generator)
    fate = objreg.uniform(tuple(batch.input_ids.shape), generator, batch.input_ids.device)  # (B, T)
    corrupted = replacement.replace_selected(batch.input_ids, selected, fate, generator, params, vocab)
    return masked_lm.MaskedView(corrupted, selected)
