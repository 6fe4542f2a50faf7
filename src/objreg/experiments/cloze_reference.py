"""A count-based cloze model: which ordinary token fills a position, given its left and right
neighbours, from the counts of a training split. The reference that defines "plausible"
replacements in the hard-negatives experiment.

A position with left neighbour ``a`` and right neighbour ``b`` is filled from the tokens seen
between ``a`` and ``b`` in the training split (in proportion to their counts); where that context
was never seen, from the tokens seen after ``a``; where ``a`` was never seen either, from the
unigram counts. Its top-1 prediction is the most counted token at the first level that has one.
A replacement is drawn the same way without the original token (at the first level that has
another token), so it is never the original.

Counts over the same split an MLM would be trained on, but no training: on the 2-core CPU a
small MLM trained for thousands of steps stays near the unigram baseline (about 10% top-1 on
held-out docstrings), while these counts reach about three times that.
"""

from __future__ import annotations

import numpy as np
import torch

from objreg import TokenizedCorpus, Vocabulary


class ClozeCounts:
    """Counts of (left, token, right), (left, token) and token over every row of ``corpus``
    (rows as the experiments assemble them: ``[CLS]`` sentences ``[SEP]``), ordinary tokens only
    in the middle; neighbours may be special tokens."""

    def __init__(self, corpus: TokenizedCorpus):
        vocab = corpus.vocab
        self.size = vocab.size
        self.ordinary = (vocab.normal_token_weights() > 0).numpy()
        rows = corpus.tokenizer.assemble(corpus.chunks, corpus.seq_len)
        ids = rows.input_ids.long().numpy()
        real = ~rows.is_padding.numpy()
        middle = self.ordinary[ids[:, 1:-1]] & real[:, 1:-1]
        both = middle & real[:, 2:]  # a right neighbour that is a real token (the row's [SEP] included)
        V = self.size
        self.context_keys, self.context_counts = np.unique(
            ((ids[:, :-2] * V + ids[:, 2:]) * V + ids[:, 1:-1])[both], return_counts=True)
        self.left_keys, self.left_counts = np.unique((ids[:, :-2] * V + ids[:, 1:-1])[middle], return_counts=True)
        unigram = np.bincount(ids[:, 1:-1][middle], minlength=V)
        self.unigram_tokens = np.nonzero(unigram)[0]
        self.unigram_counts = unigram[self.unigram_tokens]

    def candidates(self, left: int, right: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """The backoff levels for a position between ``left`` and ``right``: ``(tokens, counts)``
        seen in that context, then after ``left``, then anywhere (empty levels included)."""
        V = self.size
        context = (left * V + right) * V
        lo, hi = np.searchsorted(self.context_keys, [context, context + V])
        first = (self.context_keys[lo:hi] - context, self.context_counts[lo:hi])
        prefix = left * V
        lo, hi = np.searchsorted(self.left_keys, [prefix, prefix + V])
        second = (self.left_keys[lo:hi] - prefix, self.left_counts[lo:hi])
        return [first, second, (self.unigram_tokens, self.unigram_counts)]

    def top1(self, left: int, right: int) -> int:
        """The most counted token at the first level that has any (ties: the smallest id)."""
        for tokens, counts in self.candidates(left, right):
            if len(tokens):
                return int(tokens[np.argmax(counts)])
        raise ValueError("the corpus has no ordinary token")

    def sample(self, left: int, right: int, original: int, generator: torch.Generator) -> int:
        """A token other than ``original`` drawn in proportion to its count at the first level
        that has one."""
        for tokens, counts in self.candidates(left, right):
            keep = tokens != original
            if keep.any():
                weights = torch.from_numpy(counts[keep].astype(np.float64))
                return int(tokens[keep][int(torch.multinomial(weights, 1, generator=generator))])
        raise ValueError("the corpus has no ordinary token other than the original")

    def unigram_top1(self) -> int:
        """The most frequent ordinary token: the baseline a context-blind guess reaches."""
        return int(self.unigram_tokens[np.argmax(self.unigram_counts)])


def neighbours(clean: torch.Tensor, vocab: Vocabulary, row: int, position: int) -> tuple[int, int]:
    """The tokens left and right of ``position`` in row ``row`` of ``clean`` (``[PAD]`` past the end)."""
    right = int(clean[row, position + 1]) if position + 1 < clean.shape[1] else vocab.pad_id
    return int(clean[row, position - 1]), right
