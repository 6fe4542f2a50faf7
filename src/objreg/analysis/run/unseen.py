"""Evaluation text must not be pre-trained on: a check of a task's evaluation rows against the
pre-training text, before any training.

A row counts as seen when at least half of its ``WINDOW``-token windows (its token ids less
specials and padding) occur inside one pre-training sentence: the n-gram overlap test of
contamination studies (GPT-3 used 13-grams over words; objreg's windows are tokens of the model's
own tokenizer, so both sides are normalised alike). A row shorter than ``WINDOW`` tokens is seen
when it occurs whole inside a sentence; rows under ``SHORTEST`` tokens ("a masterpiece .") are
too common to tell reuse from chance and are not checked.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from objreg.core.errors import DataError
from objreg.core.types import CorruptedBatch, Vocabulary

WINDOW = 8
SHORTEST = 4


def _windows(ids: Sequence[int], size: int) -> Iterable[tuple[int, ...]]:
    return (tuple(ids[i:i + size]) for i in range(len(ids) - size + 1))


def row_tokens(batch: CorruptedBatch, vocab: Vocabulary) -> list[list[int]]:
    """Each row's token ids without padding and special tokens."""
    special = vocab.special_id_tensor(batch.input_ids.device)
    keep = ~batch.is_padding & ~torch.isin(batch.input_ids, special)
    return [row[mask].tolist() for row, mask in zip(batch.input_ids, keep)]


def seen_rows(rows: Sequence[Sequence[int]], sentences: Iterable[Sequence[int]]) -> list[int]:
    """Indices of ``rows`` (token ids) that the pre-training ``sentences`` (token ids) contain
    (module docstring)."""
    windows_of = [set(_windows(r, WINDOW)) if len(r) >= WINDOW else ({tuple(r)} if len(r) >= SHORTEST else set())
                  for r in rows]
    wanted = set().union(*windows_of) if windows_of else set()
    sizes = sorted({len(w) for w in wanted})
    found: set[tuple[int, ...]] = set()
    for sentence in sentences:
        for size in sizes:
            found.update(w for w in _windows(sentence, size) if w in wanted)
    return [i for i, windows in enumerate(windows_of) if windows and 2 * len(windows & found) >= len(windows)]


def check_unseen(batch: CorruptedBatch, vocab: Vocabulary, sentences: Iterable[Sequence[int]], what: str,
                 corpus: str) -> None:
    """Refuse evaluation rows of ``batch`` that the pre-training ``sentences`` contain.

    Raises:
        DataError: one line naming how many rows, the first of them, and both sources.
    """
    rows = row_tokens(batch, vocab)
    seen = seen_rows(rows, sentences)
    if seen:
        raise DataError(
            f"{len(seen)} of {len(rows)} evaluation rows of {what} are in the pre-training text {corpus!r} (the first: "
            f"row {seen[0]}): text used for evaluation must not be pre-trained on; pre-train on other text or "
            f"evaluate on rows it does not hold")


def corpus_sentences(tokenized) -> Iterable[list[int]]:
    """The token ids of every sentence of a :class:`~objreg.toolkit.tokenizer.TokenizedCorpus`."""
    return (ids for chunk in tokenized.chunks for ids, _ in chunk.sentences)
