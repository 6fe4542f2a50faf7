"""Whole-word masking: every token of a selected word is masked together (BERT-wwm).

Words come from ``TokenBatch.word_ids``, which the tokenizer's pre-tokeniser provides, so this
works for any tokenizer: WordPiece, SentencePiece, byte-level BPE. The references group tokens by
the ``##`` continuation prefix (google-research/bert, Hugging Face's ``DataCollatorForWholeWordMask``),
which silently degrades to token-level masking for every other tokenizer (huggingface/transformers
#11768, #9866, #6491).

Selection follows google-research/bert ``create_masked_lm_predictions`` with
``do_whole_word_mask``: a budget of ``max(1, round(n · mask_prob))`` tokens (``n`` = maskable tokens
of the row; the reference counts ``[CLS]``/``[SEP]`` too), words visited in random order, each taken
when all its tokens still fit the budget and skipped otherwise. So about ``mask_prob`` of the
*tokens* are predicted (Hugging Face's newer offset-based variant samples word starts instead,
which makes the token rate depend on word length). With a weighted masking policy the random order
is a weighted one (Pareto order sampling), so a word is selected with probability about
``min(1, c · w)``, ``w`` the mean of its tokens' weights.

The 80/10/10 replacement is decided **per token**, as the reference does (its draw sits inside the
loop over a word's pieces): a selected word can end up partly ``[MASK]``, partly random, partly kept.
Random replacements are ordinary tokens only (the reference draws from the whole vocabulary).

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
        name="wwm",
        description="Whole-word masking (BERT-wwm): ~15% of tokens, whole words via word ids, 80/10/10 per token.",
        kind="pretrain",
        attention="bidirectional",
        heads=(objreg.HeadSpec("lm", "lm"),),
        params=(
            objreg.Param(
                "mask_prob", 0.15, "Share of the ordinary tokens to predict: a budget of max(1, round(n * "
                "mask_prob)) tokens per row, filled with whole words.", float, 0.0, 1.0,
            ),
            *replacement.replacement_params(),
            *modifiers.MODIFIER_PARAMS,
        ),
        references=(
            "Devlin et al. 2019, BERT (whole word masking release, google-research/bert README, 2019-05-31)",
            "google-research/bert create_pretraining_data.py create_masked_lm_predictions (do_whole_word_mask)",
            "Cui et al. 2021, Pre-Training with Whole Word Masking for Chinese BERT",
            "huggingface/transformers#11768 (## grouping silently fails for non-WordPiece tokenizers)",
        ),
        min_seq_len=3,
    )


@objreg.hookimpl
def objreg_corrupt(
    batch: objreg.TokenBatch, generator: torch.Generator, params: Mapping[str, Any], vocab: objreg.Vocabulary
) -> objreg.CorruptedBatch:
    words = selection.words(batch)
    weights = selection.per_word(selection.policy_weights(batch, params["masking_policy"], vocab, "wwm"), words)  # (B, W)
    view = _view(batch, words, weights, generator, params, vocab)
    second = _view(batch, words, weights, generator, params, vocab) if params["consistency_weight"] > 0 else None
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
    masked_lm.require_mask_token(vocab, "wwm")  # before the model loads, with the fix
    replacement.check_replacement(params, "wwm")


def _view(
    batch: objreg.TokenBatch, words: selection.Words, weights: torch.Tensor, generator: torch.Generator,
    params: Mapping[str, Any], vocab: objreg.Vocabulary,
) -> masked_lm.MaskedView:
    """One whole-word mask: words in weighted random order, greedily into the token budget."""
    n = selection.maskable(batch).sum(dim=1)  # (B,)
    budget = torch.where(n > 0, (n.double() * params["mask_prob"]).round().long().clamp(min=1), 0)  # (B,)
    valid = torch.arange(words.size.shape[1], device=n.device)[None, :] < words.count[:, None]  # (B, W)
    # Each word with probability about min(1, c * weight), c spending the budget in expectation.
    target = selection.inclusion_probabilities(torch.where(valid, weights, 0.0), budget[:, None], words.size)
    keys = selection.pareto_keys(target, valid, generator)  # (B, W)
    chosen = selection.greedy_fill(words.size, keys, budget)  # (B, W)
    selected = selection.per_token(chosen, words, fill=False)  # (B, T)
    fate = objreg.uniform(tuple(batch.input_ids.shape), generator, batch.input_ids.device)  # per token, as BERT
    corrupted = replacement.replace_selected(batch.input_ids, selected, fate, generator, params, vocab)
    return masked_lm.MaskedView(corrupted, selected)
