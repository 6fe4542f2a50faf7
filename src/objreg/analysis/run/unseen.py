"""Evaluation text must not be trained on: a task's evaluation rows checked against the
pre-training text before any training (:func:`check_unseen`), by the overlap test of
:mod:`objreg.toolkit.overlap` on the model's own tokens (specials and padding left out), so both
sides are normalised alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from objreg.core.errors import DataError
from objreg.core.types import CorruptedBatch, Vocabulary
from objreg.toolkit.overlap import contained_rows


def row_tokens(batch: CorruptedBatch, vocab: Vocabulary) -> list[list[int]]:
    """Each row's token ids without padding and special tokens."""
    special = vocab.special_id_tensor(batch.input_ids.device)
    keep = ~batch.is_padding & ~torch.isin(batch.input_ids, special)
    return [row[mask].tolist() for row, mask in zip(batch.input_ids, keep)]


def check_unseen(batch: CorruptedBatch, vocab: Vocabulary, sentences: Iterable[Sequence[int]], what: str,
                 corpus: str) -> None:
    """Refuse evaluation rows of ``batch`` that the pre-training ``sentences`` (token ids) contain.

    Raises:
        DataError: one line naming how many rows, the first of them, and both sources.
    """
    rows = row_tokens(batch, vocab)
    seen = contained_rows(rows, sentences)
    if seen:
        raise DataError(
            f"{len(seen)} of {len(rows)} evaluation rows of {what} are in the pre-training text {corpus!r} (the first: "
            f"row {seen[0]}): text used for evaluation must not be pre-trained on; pre-train on other text or "
            f"evaluate on rows it does not hold")


def corpus_sentences(tokenized) -> Iterable[list[int]]:
    """The token ids of every sentence of a :class:`~objreg.toolkit.tokenizer.TokenizedCorpus`."""
    return (ids for chunk in tokenized.chunks for ids, _ in chunk.sentences)
