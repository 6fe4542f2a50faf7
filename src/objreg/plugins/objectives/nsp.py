"""Next-sentence prediction (BERT): is segment B the text that follows segment A, or text from
another document?

Each row ``[CLS] s_0 … s_{n-1} [SEP]`` is split at a sentence boundary chosen uniformly into
``A = s_0 … s_{k-1}`` and its true continuation ``B = s_k … s_{n-1}``, and becomes
``[CLS] A [SEP] B [SEP]``. With probability ``random_next_prob`` (BERT: 0.5) B is replaced by the
B segment of another row of the batch whose *document differs*, drawn uniformly among those rows.
Labels follow google-research/bert: ``next_sentence_label`` 1 = random next (B from another
document), 0 = actual next. A random B longer than the row's width is cut at the end (BERT's
``truncate_seq_pair`` trims too), so it always starts at a sentence boundary of its document.

What it avoids: google-research/bert draws the random document from the whole corpus and, after
10 failed tries, accepts the *same* document, labelling a true continuation "random". Here a
negative never comes from its own document. A batch that holds a single document (e.g. one text)
has no valid negative at all: that is a :class:`objreg.DataError`, not a silent all-positive
batch (which would train the classifier on one label only). With ``random_next_prob=0`` no
negative is needed and one document is fine.

The pair is one sequence to the model: the attention is bidirectional over all of it (both
segments carry the row's own document id; ``next_document`` in ``extras`` records where B came
from). The extra ``[SEP]`` makes rows one token longer: the output has width ``T + 1``. Built
with index arithmetic and one ``gather``, vectorised over the batch.

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
        name="nsp",
        description="Next-sentence prediction (BERT): is segment B the continuation, or from another document?",
        kind="pretrain",
        attention="bidirectional",
        heads=(objreg.HeadSpec("next_sentence", "classifier", 2),),
        params=(
            objreg.Param(
                "random_next_prob", 0.5, "Probability that segment B comes from another document of the batch "
                "(label 1, BERT's 'random next'); otherwise B is the true continuation (label 0).", float, 0.0, 1.0,
            ),
        ),
        references=(
            "Devlin et al. 2019, BERT: Pre-training of Deep Bidirectional Transformers for Language Understanding",
            "google-research/bert create_pretraining_data.py create_instances_from_document (random next with "
            "probability 0.5, next_sentence_label = 1 if random else 0)",
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
    _check_layout(batch, length, vocab)
    split = _split_positions(batch, length, generator)  # (B,): first token of the true B
    random_next = objreg.uniform((B,), generator, device) < params["random_next_prob"]  # (B,)
    partner = _other_document_rows(batch.document_ids[:, 0], generator, needed=params["random_next_prob"] > 0)
    source = torch.where(random_next, partner, torch.arange(B, device=device))  # (B,): row B is taken from

    len_a = split - 1  # (B,)
    start_b = split[source]  # (B,)
    # A random B is cut to the row's width: [CLS] A [SEP] B [SEP] fits in T + 1 positions.
    len_b = torch.minimum(length[source] - 1 - start_b, T - 2 - len_a)  # (B,)
    end = (len_a + len_b + 2)[:, None]  # (B, 1): index of the final [SEP]

    # Output layout: 0 [CLS] | 1..len_a A | len_a+1 [SEP] | len_a+2..end-1 B | end [SEP]
    j = torch.arange(T + 1, device=device)[None, :]  # (1, T+1)
    in_a = (j >= 1) & (j <= len_a[:, None])  # (B, T+1)
    in_b = (j >= len_a[:, None] + 2) & (j < end)  # (B, T+1)
    row = torch.where(in_b, source[:, None], torch.arange(B, device=device)[:, None])  # (B, T+1)
    column = torch.where(in_b, start_b[:, None] + j - len_a[:, None] - 2, j)  # (B, T+1)
    column = torch.where(in_a | in_b, column, 0)
    tokens = ids.flatten()[row * T + column]  # (B, T+1): one gather across rows

    out = torch.where(in_a | in_b, tokens, vocab.pad_id)
    out = torch.where(j == 0, vocab.cls_id, out)
    out = torch.where((j == len_a[:, None] + 1) | (j == end), vocab.sep_id, out)
    is_padding = j > end  # (B, T+1)
    segment_ids = ((j >= len_a[:, None] + 2) & (j <= end)).long()  # (B, T+1)
    document = batch.document_ids[:, 0]  # (B,): one document per row (checked)
    return objreg.CorruptedBatch(
        input_ids=out,
        labels=torch.full_like(out, IGNORE_INDEX),
        is_padding=is_padding,
        position_ids=j.expand(B, T + 1).clone(),
        # The pair is one sequence: both segments carry the row's document id, so the block-diagonal
        # mask does not cut A off from a B of another document.
        document_ids=torch.where(is_padding, -1, document[:, None]),
        extras={
            "next_sentence_label": random_next.long(),
            "segment_ids": segment_ids,
            "next_document": document[source],
        },
    )


@objreg.hookimpl
def objreg_attention_mask(batch: objreg.CorruptedBatch) -> torch.Tensor:
    return masks.bidirectional(batch.is_padding) & masks.same_document(batch.document_ids)  # (B, T, T)


@objreg.hookimpl
def objreg_loss(outputs: objreg.ModelOutputs, batch: objreg.CorruptedBatch) -> torch.Tensor:
    logits = outputs.model.heads["next_sentence"](outputs.hidden)  # (B, 2), from the first token
    log_probs = torch.log_softmax(logits, dim=-1)  # (B, 2)
    label = batch.extras["next_sentence_label"]  # (B,)
    return -log_probs.gather(-1, label.unsqueeze(-1)).squeeze(-1)  # (B,)


# -- corruption steps ---------------------------------------------------------------------------


def _check_layout(batch: objreg.TokenBatch, length: torch.Tensor, vocab: objreg.Vocabulary) -> None:
    """Rows must be ``[CLS] sentences [SEP]`` + right padding, from one document, as objreg's
    tokenizers build them: the sentence tokens are exactly positions ``1 .. length-2``."""
    ids = batch.input_ids
    j = torch.arange(ids.shape[1], device=ids.device)[None, :]  # (1, T)
    right_padded = (batch.is_padding == (j >= length[:, None])).all(dim=1)  # (B,)
    last = ids.gather(1, (length - 1).clamp(min=0)[:, None])[:, 0]  # (B,)
    framed = (ids[:, 0] == vocab.cls_id) & (last == vocab.sep_id) & (length >= 3)
    one_document = ((batch.document_ids == batch.document_ids[:, :1]) | batch.is_padding).all(dim=1)
    bad = ~(right_padded & framed & one_document)  # (B,)
    if bool(bad.any()):
        row = int(bad.nonzero()[0, 0])
        raise objreg.DataError(
            f"nsp needs each row framed as [CLS] sentences [SEP] + padding, from one document; row {row} is not "
            f"(packed rows cannot be split into sentence pairs)"
        )


def _split_positions(batch: objreg.TokenBatch, length: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """For each row, the position where a uniformly chosen sentence boundary starts segment B."""
    B, T = batch.input_ids.shape
    j = torch.arange(T, device=length.device)[None, :]  # (1, T)
    body = (j >= 1) & (j <= (length - 2)[:, None])  # (B, T)
    # A special token inside the text ([UNK], a literal "[MASK]") has sentence id -1: it joins the
    # sentence before it (sentence ids never decrease along a row).
    sentence = torch.where(body, batch.sentence_ids.cummax(dim=1).values.clamp(min=0), -1)  # (B, T)
    boundary = torch.zeros_like(batch.is_padding)  # (B, T): True at the first token of s_1 … s_{n-1}
    boundary[:, 1:] = (sentence[:, 1:] >= 0) & (sentence[:, :-1] >= 0) & (sentence[:, 1:] != sentence[:, :-1])
    num_boundaries = boundary.sum(dim=1)  # (B,) = sentences - 1
    num_sentences = num_boundaries + (length > 2).long()
    short = num_sentences < 2
    if bool(short.any()):
        row = int(short.nonzero()[0, 0])
        raise objreg.DataError(
            f"nsp needs at least 2 sentences in each row; row {row} has {int(num_sentences[row])} "
            f"({int(short.sum())} of {B} rows are too short; sample rows with min_sentences=2)"
        )
    # r-th boundary, r uniform in 0 .. n-2 (clamp guards a float rounding up to n-1).
    pick = (objreg.uniform((B,), generator, length.device) * num_boundaries).long()
    pick = torch.minimum(pick, num_boundaries - 1)  # (B,)
    rank = boundary.cumsum(dim=1)  # (B, T): boundaries up to and including t
    chosen = boundary & (rank == (pick + 1)[:, None])  # (B, T): exactly one True per row
    return chosen.long().argmax(dim=1)


def _other_document_rows(document: torch.Tensor, generator: torch.Generator, needed: bool) -> torch.Tensor:
    """For each row, a row of the batch drawn uniformly among those of another document.

    ``document``: ``[B]``. Random keys over a ``[B, B]`` grid, rows of the same document knocked
    out, argmax per row. The keys are drawn whatever the data, so the generator always advances
    the same way. Raises :class:`objreg.DataError` when ``needed`` and the batch holds one document.
    """
    B = document.shape[0]
    other = document[:, None] != document[None, :]  # (B, B)
    keys = torch.where(other, objreg.uniform((B, B), generator, document.device), -1.0)  # (B, B)
    if needed and not bool(other.any()):
        raise objreg.DataError(
            f"nsp takes a random next segment from another document of the batch, but all {B} row(s) come "
            f"from one document; give rows from at least 2 documents (e.g. several --text), or set "
            f"random_next_prob=0"
        )
    return keys.argmax(dim=1)  # (B,): with >= 2 documents every row has another-document row
