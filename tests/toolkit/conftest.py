"""Stand-ins shared by the toolkit's tests."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import objreg

SPECIAL = 5  # ids 0..4: [PAD] [UNK] [CLS] [SEP] [MASK]
RANKS = 20  # ordinary ids 5..24, id 5 the most frequent
VOCAB = objreg.Vocabulary(size=SPECIAL + RANKS, pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4,
                          special_ids=tuple(range(SPECIAL)))


def zipf_batch(B: int, T: int, seed: int = 0) -> objreg.TokenBatch:
    """``[CLS] ... [SEP]`` rows of one-token words drawn from a Zipf law over the ordinary ids, with a
    surprisal per token drawn from U(0.5, 4.5)."""
    g = torch.Generator().manual_seed(seed)
    zipf = 1 / torch.arange(1, RANKS + 1).double()
    ids = SPECIAL + torch.multinomial(zipf / zipf.sum(), B * T, replacement=True, generator=g).view(B, T)
    ids[:, 0], ids[:, -1] = VOCAB.cls_id, VOCAB.sep_id
    special = torch.isin(ids, torch.arange(SPECIAL))
    words = torch.where(special, -1, torch.arange(T).expand(B, T))
    surprisal = 0.5 + 4 * torch.rand(B, T, generator=g, dtype=torch.float64)
    return objreg.TokenBatch(ids, torch.zeros(B, T, dtype=torch.bool), special, words,
                             torch.where(special, -1, 0), torch.zeros(B, T, dtype=torch.long), surprisal.float())


@pytest.fixture(scope="session")
def zipf():
    """A 25-token vocabulary (5 specials, 20 ordinary ids in Zipf order) and ``zipf.batch(B, T, seed)``."""
    return SimpleNamespace(vocab=VOCAB, ranks=RANKS, special=SPECIAL, batch=zipf_batch)
