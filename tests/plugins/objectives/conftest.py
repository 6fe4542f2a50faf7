"""Stand-ins shared by the objectives' tests."""

from __future__ import annotations

import pytest
import torch

import objreg


@pytest.fixture(scope="session")
def synthetic_batch():
    """``synthetic_batch(vocab, lengths, T=None, seed=0)``: rows ``[CLS] x_1 … x_n [SEP]`` +
    padding to ``T`` (default: the longest row), ``n = lengths[b]`` ordinary tokens drawn uniformly
    from the ids above ``vocab``'s last special id."""

    def batch(vocab: objreg.Vocabulary, lengths: list[int], T: int | None = None, seed: int = 0) -> objreg.TokenBatch:
        g = torch.Generator().manual_seed(seed)
        B, T = len(lengths), T or max(lengths) + 2
        n = torch.tensor(lengths)[:, None]
        index = torch.arange(T)[None, :]
        ids = torch.randint(max(vocab.special_ids) + 1, vocab.size, (B, T), generator=g)
        ids = torch.where(index == 0, vocab.cls_id, torch.where(index == n + 1, vocab.sep_id, ids))
        is_padding = index > n + 1
        ids = torch.where(is_padding, vocab.pad_id, ids)
        is_special = (index == 0) | (index == n + 1) | is_padding
        rows = torch.arange(B)[:, None].expand(B, T)
        return objreg.TokenBatch(ids, is_padding, is_special, torch.where(is_special, -1, index),
                                 torch.where(is_special, -1, 0), torch.where(is_padding, -1, rows))

    return batch
