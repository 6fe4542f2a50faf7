"""Prefix LM: a bidirectional prefix, then a causal continuation with the loss on it alone.

Each row ``[CLS] x_1 … x_n [SEP]`` is split after ``k`` text tokens: the source ``[CLS] x_1 … x_k``
is attended to bidirectionally, the target ``x_{k+1} … x_n [SEP]`` causally, and only the target
is predicted (``[SEP]`` included, as the end of text, so the model learns to stop). The split
follows T5's ``prefix_lm`` (``random_prefix_noise_mask``): ``k`` uniform in
``[max(1, round((1 - 2·noise_density)·(n - 1))), n - 1]``, so with the default density 0.5 every
split that leaves both sides non-empty is equally likely, and the target's expected share is
about ``noise_density``.

The row keeps its tokens and width; positions run on from the prefix into the continuation. Last
prefix token predicts the first target token: the bidirectional region is exactly the source, which
is seqio's ``PrefixLMFeatureConverter`` "inputs + 1" region once its shift-right is undone. What
other implementations get wrong: the loss covers the continuation only
(``loss_on_targets_only=True``); padding is excluded by position (T5X's decoder mask assumes pad id
0).

Written like a third-party plugin: it imports only ``objreg``, its toolkit and ``torch``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

import objreg
from objreg.toolkit import seq2seq


@objreg.hookimpl
def objreg_objective_info() -> objreg.ObjectiveInfo:
    return objreg.ObjectiveInfo(
        name="prefix_lm",
        description="Prefix LM: bidirectional random prefix, causal continuation, loss on the continuation only.",
        kind="pretrain",
        attention="prefix",
        heads=(objreg.HeadSpec("lm", "lm"),),
        params=(
            objreg.Param(
                "noise_density", 0.5, "Expected share of the text in the continuation (T5 prefix_lm): the prefix "
                "length is uniform in [max(1, round((1 - 2 d)(n - 1))), n - 1]; 0.5 makes every split equally "
                "likely.", float, 0.0, 1.0,
            ),
        ),
        references=(
            "Raffel et al. 2020, Exploring the Limits of Transfer Learning with a Unified Text-to-Text "
            "Transformer (T5), prefix LM objective",
            "google-research/text-to-text-transfer-transformer t5/data/preprocessors.py (prefix_lm, "
            "random_prefix_noise_mask)",
            "google/seqio feature_converters.py PrefixLMFeatureConverter (loss_on_targets_only=True)",
        ),
        min_seq_len=4,
    )


@objreg.hookimpl
def objreg_corrupt(
    batch: objreg.TokenBatch, generator: torch.Generator, params: Mapping[str, Any], vocab: objreg.Vocabulary
) -> objreg.CorruptedBatch:
    parts = seq2seq.prefix_lm_parts(batch, params["noise_density"], generator, vocab.pad_id)
    return seq2seq.seq2seq_batch(parts, seq2seq.row_document(batch), vocab.pad_id)


@objreg.hookimpl
def objreg_loss(outputs: objreg.ModelOutputs, batch: objreg.CorruptedBatch) -> torch.Tensor:
    return seq2seq.seq2seq_loss(outputs, batch)  # (B,)
