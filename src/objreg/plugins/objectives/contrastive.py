"""Contrastive learning (InfoNCE) with in-batch negatives: two views of one document are pulled
together, views of the other rows pushed apart.

Views: each row ``[CLS] s_0 … s_{n-1} [SEP]`` is split at a sentence boundary chosen uniformly into
two disjoint spans of the same document, ``A = s_0 … s_{k-1}`` and ``B = s_k … s_{n-1}``, the
positive pair (span pairs from one document as in DeCLUTR, Giorgi et al. 2021, and Contriever's
cropping, Izacard et al. 2022; the inverse-cloze task of Lee et al. 2019 is the one-sentence case).
Unsupervised SimCSE instead encodes one sentence twice under different dropout masks; that needs
dropout, which the backbone leaves off (the analysis compares predicted and measured loss changes
and differentiates per-sample losses, so forward passes must be deterministic, and ``F.dropout``
draws from torch's global RNG, which a pure loss may not touch). Disjoint spans also keep the
positive from being solved by matching identical tokens.

Both views go through ONE backbone pass: the row becomes ``[CLS] A [SEP] [CLS] B [SEP]`` (width
``T + 2``) with positions restarting at the second ``[CLS]`` and an attention mask that keeps the
two views apart, so each view is encoded exactly as if alone. The ``projection`` head embeds each
view's ``[CLS]``; the loss is SimCSE's: cosine similarities divided by ``temperature`` (SimCSE
``temp=0.05``; sentence-transformers' ``scale=20``), cross-entropy of view A of row i against the
B views of all rows, the positive being row i's own.

What it avoids: duplicates of a positive are not counted as negatives (false in-batch negatives,
PaddleNLP#8019; sentence-transformers asks for a NO_DUPLICATES sampler instead). Row j is left out
of row i's denominator when the two rows come from the same document or share the text of a view
(any of A_i, B_i equal, token for token, to A_j or B_j). A row left with no negative at all (one
text, or every row from one document) is a :class:`objreg.DataError`: its loss would be a
constant 0.

The loss couples the rows of a batch (``batch_coupled=True``): ``ℓ_i`` depends on every row's
embedding, and its per-sample derivatives are those of ``ℓ_i`` on the whole batch.

Written exactly like a third-party plugin: it imports only ``objreg`` and ``torch``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

import objreg
from objreg import IGNORE_INDEX, masks

#: Width of the embedding the projection head produces (SimCLR's 128-d projection output).
EMBEDDING_SIZE = 128


@objreg.hookimpl
def objreg_objective_info() -> objreg.ObjectiveInfo:
    return objreg.ObjectiveInfo(
        name="contrastive",
        description="Contrastive InfoNCE (SimCSE loss): two spans of a document vs in-batch negatives.",
        kind="pretrain",
        attention="bidirectional",
        heads=(objreg.HeadSpec("embedding", "projection", EMBEDDING_SIZE),),
        params=(
            objreg.Param(
                "temperature", 0.05, "Softmax temperature of the cosine similarities (SimCSE temp; "
                "sentence-transformers scale = 1/temperature = 20).", float, 1e-3, None,
            ),
        ),
        references=(
            "Gao et al. 2021, SimCSE: Simple Contrastive Learning of Sentence Embeddings (temp 0.05, [CLS] pooling)",
            "van den Oord et al. 2018, Representation Learning with Contrastive Predictive Coding (InfoNCE)",
            "Giorgi et al. 2021, DeCLUTR: Deep Contrastive Learning for Unsupervised Textual Representations",
            "Izacard et al. 2022, Unsupervised Dense Information Retrieval with Contrastive Learning (Contriever)",
            "princeton-nlp/SimCSE simcse/models.py cl_forward; sentence-transformers MultipleNegativesRankingLoss",
            "PaddleNLP#8019 (duplicates of a positive counted as in-batch negatives)",
        ),
        batch_coupled=True,
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
    split = _split_positions(batch, length, generator)  # (B,): first token of view B
    len_a, len_b = split - 1, length - 1 - split  # (B,), (B,)
    second = (len_a + 2)[:, None]  # (B, 1): the second [CLS]
    end = length[:, None] + 1  # (B, 1): the final [SEP]

    # Output layout: 0 [CLS] | 1..len_a A | len_a+1 [SEP] | second [CLS] | ..end-1 B | end [SEP]
    j = torch.arange(T + 2, device=device)[None, :]  # (1, T+2)
    in_a = (j >= 1) & (j < second - 1)  # (B, T+2)
    in_b = (j > second) & (j < end)  # (B, T+2)
    source = torch.where(in_a, j, split[:, None] + j - second - 1)  # (B, T+2)
    tokens = ids.gather(1, torch.where(in_a | in_b, source, 0))  # (B, T+2)
    out = torch.where(in_a | in_b, tokens, vocab.pad_id)
    out = torch.where((j == 0) | (j == second), vocab.cls_id, out)
    out = torch.where((j == second - 1) | (j == end), vocab.sep_id, out)
    is_padding = j > end  # (B, T+2)
    view_ids = torch.where(is_padding, -1, (j >= second).long())  # (B, T+2)

    groups = _view_groups(ids, split, len_a, len_b, vocab.pad_id)  # (B, 2)
    document = batch.document_ids[:, 0]  # (B,): one document per row (checked)
    _check_negatives(_duplicates(document, groups))
    return objreg.CorruptedBatch(
        input_ids=out,
        labels=torch.full_like(out, IGNORE_INDEX),
        is_padding=is_padding,
        position_ids=torch.where(j >= second, j - second, j).expand(B, T + 2).clone(),
        document_ids=torch.where(is_padding, -1, document[:, None]),
        extras={
            "view_ids": view_ids,
            "second_view_start": second[:, 0].clone(),
            "view_groups": groups,
            # float64, cast to the model's dtype in the loss: exact for a float64 model.
            "temperature": torch.full((B,), float(params["temperature"]), dtype=torch.float64, device=device),
        },
    )


@objreg.hookimpl
def objreg_attention_mask(batch: objreg.CorruptedBatch) -> torch.Tensor:
    views = batch.extras["view_ids"]  # (B, T): the two views of a row never see each other
    same_view = views[:, :, None] == views[:, None, :]  # (B, T, T)
    return masks.bidirectional(batch.is_padding) & masks.same_document(batch.document_ids) & same_view


@objreg.hookimpl
def objreg_loss(outputs: objreg.ModelOutputs, batch: objreg.CorruptedBatch) -> torch.Tensor:
    hidden = outputs.hidden  # (B, T, H)
    head = outputs.model.heads["embedding"]  # embeds the first token of a [B, T, H] input
    start = batch.extras["second_view_start"]  # (B,)
    second = hidden.gather(1, start[:, None, None].expand(-1, 1, hidden.shape[-1]))  # (B, 1, H)
    anchors = F.normalize(head(hidden[:, :1]), dim=-1)  # (B, D): view A of each row
    candidates = F.normalize(head(second), dim=-1)  # (B, D): view B of each row
    temperature = batch.extras["temperature"].to(hidden.dtype)  # (B,)
    scores = anchors @ candidates.T / temperature[:, None]  # (B, B): row i against every row's B
    B = scores.shape[0]
    positive = torch.eye(B, dtype=torch.bool, device=scores.device)  # (B, B)
    duplicate = _duplicates(batch.document_ids[:, 0], batch.extras["view_groups"]) & ~positive
    scores = torch.where(duplicate, float("-inf"), scores)  # false negatives leave the denominator
    log_probs = torch.log_softmax(scores, dim=-1)  # (B, B)
    return -log_probs.diagonal()  # (B,)


# -- corruption steps ---------------------------------------------------------------------------


def _duplicates(document: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """``[B, B]`` bool: rows i and j come from one document or share the text of a view.

    ``document``: ``[B]``; ``groups``: ``[B, 2]`` ids of the views' token sequences (equal ids =
    identical text). Pure: used in the loss too."""
    same_text = (groups[:, None, :, None] == groups[None, :, None, :]).flatten(2).any(dim=-1)  # (B, B)
    return (document[:, None] == document[None, :]) | same_text


def _check_negatives(duplicate: torch.Tensor) -> None:
    B = duplicate.shape[0]
    lonely = duplicate.all(dim=1)  # (B,): every row, itself included, is a duplicate
    if bool(lonely.any()):
        row = int(lonely.nonzero()[0, 0])
        raise objreg.DataError(
            f"contrastive needs an in-batch negative for every row, but row {row} of {B} has none (every row "
            f"shares its document or a view's text); give rows from at least 2 different documents, e.g. several --text"
        )


def _view_groups(
    ids: torch.Tensor, split: torch.Tensor, len_a: torch.Tensor, len_b: torch.Tensor, pad_id: int
) -> torch.Tensor:
    """``[B, 2]`` long: one id per distinct token sequence among the 2B views (A of each row,
    then B), so two views with the same id are the same text."""
    B, T = ids.shape
    k = torch.arange(T, device=ids.device)[None, :]  # (1, T)
    starts = torch.cat([torch.ones_like(split), split])[:, None]  # (2B, 1)
    lengths = torch.cat([len_a, len_b])[:, None]  # (2B, 1)
    rows = ids.repeat(2, 1)  # (2B, T)
    views = torch.where(k < lengths, rows.gather(1, (starts + k).clamp(max=T - 1)), pad_id)  # (2B, T)
    # The length column keeps a view that ends in a literal pad id apart from a shorter one.
    _, inverse = torch.unique(torch.cat([lengths, views], dim=1), dim=0, return_inverse=True)  # (2B,)
    return torch.stack([inverse[:B], inverse[B:]], dim=1)


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
            f"contrastive needs each row framed as [CLS] sentences [SEP] + padding, from one document; row {row} "
            f"is not (packed rows cannot be split into two views of one document)"
        )


def _split_positions(batch: objreg.TokenBatch, length: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """For each row, the position where a uniformly chosen sentence boundary starts view B."""
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
            f"contrastive needs at least 2 sentences in each row (one per view); row {row} has "
            f"{int(num_sentences[row])} ({int(short.sum())} of {B} rows are too short; sample rows with "
            f"min_sentences=2)"
        )
    # r-th boundary, r uniform in 0 .. n-2 (clamp guards a float rounding up to n-1).
    pick = (objreg.uniform((B,), generator, length.device) * num_boundaries).long()
    pick = torch.minimum(pick, num_boundaries - 1)  # (B,)
    rank = boundary.cumsum(dim=1)  # (B, T): boundaries up to and including t
    chosen = boundary & (rank == (pick + 1)[:, None])  # (B, T): exactly one True per row
    return chosen.long().argmax(dim=1)
