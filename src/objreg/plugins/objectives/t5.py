"""T5 span corruption: noise spans become sentinels in the input, the target spells them out.

Each row ``[CLS] x_1 … x_n [SEP]`` gets exactly ``clip(round(n · noise_density), 1, n - 1)`` noise
tokens in ``max(1, round(noise / mean_noise_span_length))`` spans, ``n`` counting the row's own
ordinary tokens (T5's ``random_spans_noise_mask``). Span ``k`` becomes the sentinel
``vocab.sentinel_ids[k]`` in the input (reused in turn past the last one); the target is
``[S0] span_0 [S1] span_1 … [EOS]``, so input and target together give back the row exactly. The model sees ``[input ; target]`` as a
prefix LM (bidirectional input, causal target, loss on the target only; :mod:`objreg.toolkit.seq2seq`).

Known bugs of the references avoided here:

* Sentinels come from the vocabulary's declared list, first span first, rather than counting
  down from the vocabulary's end, which once produced ids past the vocabulary
  (huggingface/transformers#14282). A row with more spans than the list holds (long rows: 2,048
  tokens at density 0.15 make about 100 spans; the default vocabulary declares 64) reuses the
  sentinels in turn, span ``k`` getting ``sentinel_ids[k mod 64]``: source and target list the
  spans in the same order, so the ``k``-th sentinel of one still pairs with the ``k``-th of the other
  (T5's own ids only repeat past ``<extra_id_99>`` by running into ordinary ids).
* Tokens are kept or dropped by position, never by id, so a literal ``<pad>``/0 id inside the
  text neither disappears nor breaks the lengths (transformers#15443, #23248).
* The mask does not always end with a noise span (t5#905): the outer non-noise gaps may be empty,
  so spans fall anywhere while the noise and span counts stay exact (:mod:`objreg.toolkit.spans`).

Special tokens never become noise. Written like a third-party plugin: it imports only ``objreg``,
its toolkit and ``torch``.
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
        name="t5",
        description="T5 span corruption: spans -> sentinels, target spells them out (prefix LM over input ; target).",
        kind="pretrain",
        attention="prefix",
        heads=(objreg.HeadSpec("lm", "lm"),),
        params=(
            objreg.Param(
                "noise_density", 0.15, "Share of each row's ordinary tokens that become noise (rounded; at "
                "least 1, at most all but 1).", float, 0.0, 1.0,
            ),
            objreg.Param(
                "mean_noise_span_length", 3.0, "Mean length of a noise span: the row gets "
                "max(1, round(noise tokens / this)) spans.", float, 1.0, None,
            ),
        ),
        references=(
            "Raffel et al. 2020, Exploring the Limits of Transfer Learning with a Unified Text-to-Text "
            "Transformer (T5)",
            "google-research/text-to-text-transfer-transformer t5/data/preprocessors.py (span_corruption, "
            "random_spans_noise_mask)",
            "huggingface/transformers#14282, #15443 (sentinel ids, literal pad ids); t5#905 (trailing span)",
        ),
        min_seq_len=4,
    )


@objreg.hookimpl
def objreg_check_params(params: Mapping[str, Any], vocab: objreg.Vocabulary | None) -> None:
    seq2seq.require_tokens(vocab, (), params["noise_density"] > 0, "t5")  # before the model loads, with the fix


@objreg.hookimpl
def objreg_corrupt(
    batch: objreg.TokenBatch, generator: torch.Generator, params: Mapping[str, Any], vocab: objreg.Vocabulary
) -> objreg.CorruptedBatch:
    return seq2seq.span_corruption_batch(
        batch, params["noise_density"], params["mean_noise_span_length"], generator, vocab, "t5"
    )


@objreg.hookimpl
def objreg_loss(outputs: objreg.ModelOutputs, batch: objreg.CorruptedBatch) -> torch.Tensor:
    return seq2seq.seq2seq_loss(outputs, batch)  # (B,)
