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
``T + 2``; the split and the layout are :mod:`objreg.toolkit.segments`, shared with ``sop`` and
``nsp``) with positions restarting at the second ``[CLS]`` and a bidirectional attention mask in
which each view is a block of its own, so each view is encoded exactly as if alone. The
``projection`` head embeds each view's ``[CLS]``; the loss is SimCSE's: cosine similarities
divided by the ``temperature`` parameter (SimCSE ``temp=0.05``; sentence-transformers'
``scale=20``), cross-entropy of view A of row i against the B views of all rows, the positive
being row i's own.

What it avoids: duplicates of a positive are not counted as negatives (false in-batch negatives,
PaddleNLP#8019; sentence-transformers asks for a NO_DUPLICATES sampler instead). Row j is left out
of row i's denominator when the two rows come from the same document or share the text of a view
(any of A_i, B_i equal, token for token, to A_j or B_j). A row left with no negative at all (one
text, or every row from one document) is a :class:`objreg.DataError`: its loss would be a
constant 0.

The loss couples the rows of a batch (``batch_coupled=True``): ``ℓ_i`` depends on every row's
embedding, and its per-sample derivatives are those of ``ℓ_i`` on the whole batch.

Written exactly like a third-party plugin: it imports only ``objreg``, its toolkit and ``torch``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

import objreg
from objreg.toolkit import losses, segments

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
    ids = batch.input_ids
    B, T = ids.shape
    a, b = segments.split_pair(batch, vocab, generator, "contrastive")
    tokens, is_padding, second = segments.join_pair(ids, a, b, vocab, second_cls=True)  # second: the second [CLS]
    j = torch.arange(T + 2, device=ids.device)[None, :]  # (1, T+2)
    after = j >= second[:, None]  # (B, T+2): the second view
    groups = _view_groups(ids, a, b, vocab.pad_id)  # (B, 2)
    document = batch.document_ids[:, 0]  # (B,): one document per row (checked)
    _check_negatives(_duplicates(document, groups))
    return objreg.CorruptedBatch(
        input_ids=tokens,
        labels=torch.full_like(tokens, objreg.IGNORE_INDEX),
        is_padding=is_padding,
        position_ids=torch.where(after, j - second[:, None], j),
        document_ids=torch.where(is_padding, -1, document[:, None]),
        extras={
            "view_ids": torch.where(is_padding, -1, after.long()),
            "second_view_start": second,
            "view_groups": groups,
        },
    )


@objreg.hookimpl
def objreg_attention_mask(batch: objreg.CorruptedBatch) -> objreg.AttentionMask:
    # Each view is a block of its own: the two views of a row never see each other.
    views = batch.extras["view_ids"]  # (B, T): 0, 1, -1 at padding
    blocks = torch.where(views < 0, -1, 2 * batch.document_ids + views)
    return objreg.AttentionMask.bidirectional(batch.is_padding, blocks)


@objreg.hookimpl
def objreg_loss(outputs: objreg.ModelOutputs, batch: objreg.CorruptedBatch, params: Mapping[str, Any]) -> torch.Tensor:
    hidden = outputs.hidden  # (B, T, H)
    head = outputs.model.heads["embedding"]  # embeds the first token of a [B, T, H] input
    second = losses.gather_positions(hidden, batch.extras["second_view_start"][:, None])  # (B, 1, H)
    anchors = F.normalize(head(hidden[:, :1]), dim=-1)  # (B, D): view A of each row
    candidates = F.normalize(head(second), dim=-1)  # (B, D): view B of each row
    scores = anchors @ candidates.T / params["temperature"]  # (B, B): row i against every row's B
    B = scores.shape[0]
    positive = torch.eye(B, dtype=torch.bool, device=scores.device)  # (B, B)
    duplicate = _duplicates(batch.document_ids[:, 0], batch.extras["view_groups"]) & ~positive
    scores = torch.where(duplicate, float("-inf"), scores)  # false negatives leave the denominator
    return losses.class_nll(scores, torch.arange(B, device=scores.device))  # (B,): the positive is row i's own


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


def _view_groups(ids: torch.Tensor, a: segments.Segment, b: segments.Segment, pad_id: int) -> torch.Tensor:
    """``[B, 2]`` long: one id per distinct token sequence among the 2B views (A of each row,
    then B), so two views with the same id are the same text."""
    B, T = ids.shape
    k = torch.arange(T, device=ids.device)[None, :]  # (1, T)
    starts = torch.cat([a.start, b.start])[:, None]  # (2B, 1)
    lengths = torch.cat([a.length, b.length])[:, None]  # (2B, 1)
    rows = ids.repeat(2, 1)  # (2B, T)
    views = torch.where(k < lengths, rows.gather(1, (starts + k).clamp(max=T - 1)), pad_id)  # (2B, T)
    # The length column keeps a view that ends in a literal pad id apart from a shorter one.
    _, inverse = torch.unique(torch.cat([lengths, views], dim=1), dim=0, return_inverse=True)  # (2B,)
    return torch.stack([inverse[:B], inverse[B:]], dim=1)
