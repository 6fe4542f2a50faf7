"""A row split into a sentence pair, and pairs joined into model input (``sop``, ``nsp``,
``contrastive``).

Rows come as objreg's tokenizers build them: ``[CLS] s_0 … s_{n-1} [SEP]`` + right padding, one
document per row (:func:`check_rows`). :func:`split_pair` cuts each row at a sentence boundary
chosen uniformly into ``A = s_0 … s_{k-1}`` and ``B = s_k … s_{n-1}``; :func:`join_pair` writes any
two segments, of the same row or of other rows, as ``[CLS] first [SEP] second [SEP]``.

A special token inside the text (``[UNK]``, a literal ``"[MASK]"``) has sentence id ``-1``: it
belongs to the sentence before it, so it never starts a sentence of its own and never splits one.
Special tokens at the start of the text count as sentence 0: they join the first sentence where the
tokenizer numbered it 0, and are a sentence of their own where it numbered it 1 (its sentence 0 was
special tokens only).

Built with index arithmetic and one gather, vectorised over the batch; draws one uniform number
per row from the generator.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from objreg.core.errors import DataError
from objreg.core.types import TokenBatch, Vocabulary
from objreg.toolkit.randomness import uniform


class Segment(NamedTuple):
    """One contiguous segment per row: tokens ``start … start + length - 1`` of row ``row``.

    Attributes:
        row: ``[B]`` long, the row of the batch the segment comes from.
        start: ``[B]`` long, its first position in that row.
        length: ``[B]`` long, its number of tokens.
    """

    row: torch.Tensor
    start: torch.Tensor
    length: torch.Tensor


def check_rows(batch: TokenBatch, vocab: Vocabulary, owner: str) -> torch.Tensor:
    """The real length of each row ``[B]`` (``[CLS]`` and ``[SEP]`` included), after checking that
    every row is ``[CLS] sentences [SEP]`` + right padding from one document: ``[CLS]`` first,
    ``[SEP]`` last, every sentence token between them. (A row with no text between them is
    framed; it has no sentence, which :func:`split_pair` reports.)

    Raises:
        DataError: naming the first row that is not (packed rows are not).
    """
    ids = batch.input_ids
    length = (~batch.is_padding).sum(dim=1)  # (B,)
    j = torch.arange(ids.shape[1], device=ids.device)[None, :]  # (1, T)
    right_padded = (batch.is_padding == (j >= length[:, None])).all(dim=1)  # (B,)
    last = ids.gather(1, (length - 1).clamp(min=0)[:, None])[:, 0]  # (B,)
    framed = (ids[:, 0] == vocab.cls_id) & (last == vocab.sep_id) & (length >= 2)
    body = (j >= 1) & (j <= (length - 2)[:, None])  # (B, T)
    sentences_inside = ~((batch.sentence_ids >= 0) & ~body).any(dim=1)
    one_document = ((batch.document_ids == batch.document_ids[:, :1]) | batch.is_padding).all(dim=1)
    bad = ~(right_padded & framed & sentences_inside & one_document)  # (B,)
    if bool(bad.any()):
        row = int(bad.nonzero()[0, 0])
        raise DataError(
            f"{owner} needs each row framed as [CLS] sentences [SEP] + padding, from one document; row {row} is "
            f"not (packed rows cannot be split into sentence pairs)"
        )
    return length


def split_pair(batch: TokenBatch, vocab: Vocabulary, generator: torch.Generator, owner: str) -> tuple[Segment, Segment]:
    """Each row's text cut at a sentence boundary chosen uniformly: ``(A, B)``, both of the row itself.

    Checks the rows first (:func:`check_rows`). Raises :class:`DataError` for a row with fewer than
    two sentences.
    """
    length = check_rows(batch, vocab, owner)
    B, T = batch.input_ids.shape
    j = torch.arange(T, device=length.device)[None, :]  # (1, T)
    body = (j >= 1) & (j <= (length - 2)[:, None])  # (B, T)
    # Sentence ids never decrease along a row, so a running maximum gives a special token (-1) the
    # sentence before it; the clamp gives leading special tokens the first sentence (module docstring).
    sentence = torch.where(body, batch.sentence_ids.cummax(dim=1).values.clamp(min=0), -1)  # (B, T)
    boundary = torch.zeros_like(batch.is_padding)  # (B, T): True at the first token of s_1 … s_{n-1}
    boundary[:, 1:] = (sentence[:, 1:] >= 0) & (sentence[:, :-1] >= 0) & (sentence[:, 1:] != sentence[:, :-1])
    num_boundaries = boundary.sum(dim=1)  # (B,) = sentences - 1
    num_sentences = num_boundaries + (length > 2).long()  # a row with text has one more sentence
    short = num_sentences < 2
    if bool(short.any()):
        row = int(short.nonzero()[0, 0])
        raise DataError(
            f"{owner} needs at least 2 sentences in each row; row {row} has {int(num_sentences[row])} "
            f"({int(short.sum())} of {B} rows are too short; sample rows with min_sentences=2)"
        )
    # The r-th boundary, r uniform in 0 … n-2 (the minimum guards a float rounding up to n-1).
    pick = (uniform((B,), generator, length.device) * num_boundaries).long()
    pick = torch.minimum(pick, num_boundaries - 1)  # (B,)
    rank = boundary.cumsum(dim=1)  # (B, T): boundaries up to and including t
    split = (boundary & (rank == (pick + 1)[:, None])).long().argmax(dim=1)  # (B,): exactly one True per row
    rows = torch.arange(B, device=length.device)
    return Segment(rows, torch.ones_like(split), split - 1), Segment(rows, split, length - 1 - split)


def choose(condition: torch.Tensor, if_true: Segment, if_false: Segment) -> Segment:
    """Row ``b`` of ``if_true`` where ``condition[b]``, else of ``if_false``."""
    return Segment(*(torch.where(condition, a, b) for a, b in zip(if_true, if_false)))


def join_pair(
    ids: torch.Tensor, first: Segment, second: Segment, vocab: Vocabulary, second_cls: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``[CLS] first [SEP] second [SEP]`` + padding (``[CLS] first [SEP] [CLS] second [SEP]`` with
    ``second_cls``), the segments gathered from the rows of ``ids`` ``[B, T]`` they name.

    Returns ``(tokens, is_padding, second_start)``: ``[B, W]``, ``[B, W]`` and ``[B]``, the position
    right after the middle ``[SEP]``. ``W = T + 1`` (``T + 2`` with ``second_cls``): the two segments
    together must hold at most ``T - 2`` tokens, as two parts of one framed row do.
    """
    B, T = ids.shape
    gap = 2 if second_cls else 1  # tokens between the segments
    j = torch.arange(T + gap, device=ids.device)[None, :]  # (1, W)
    middle = (1 + first.length)[:, None]  # (B, 1): the middle [SEP]
    begin = middle + gap  # (B, 1): the second segment's first token
    end = begin + second.length[:, None]  # (B, 1): the final [SEP]
    in_first = (j >= 1) & (j < middle)  # (B, W)
    in_second = (j >= begin) & (j < end)  # (B, W)
    row = torch.where(in_second, second.row[:, None], first.row[:, None])  # (B, W)
    column = torch.where(in_second, second.start[:, None] + j - begin, first.start[:, None] + j - 1)
    column = torch.where(in_first | in_second, column, 0)
    tokens = ids.flatten()[row * T + column]  # (B, W): one gather across rows
    out = torch.where(in_first | in_second, tokens, vocab.pad_id)
    cls = (j == 0) | (j == middle + 1) if second_cls else j == 0
    out = torch.where(cls, vocab.cls_id, out)
    out = torch.where((j == middle) | (j == end), vocab.sep_id, out)
    return out, j > end, middle[:, 0] + 1
