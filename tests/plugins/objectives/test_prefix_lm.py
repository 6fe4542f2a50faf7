"""Prefix LM: uniform split inside each row, tokens unchanged, loss on the continuation only, and
the mask against a brute-force loop."""

from __future__ import annotations

import math
import types

import torch
from torch import nn

import objreg
from objreg import IGNORE_INDEX

VOCAB = objreg.Vocabulary(size=120, pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4, special_ids=tuple(range(20)))


def corrupt(registry, batch, seed=0, **params):
    return registry.get("prefix_lm", vocab=VOCAB, **params).corrupt(batch, torch.Generator().manual_seed(seed))


def within_4_sigma(count: float, n: float, p: float) -> bool:
    return abs(count - n * p) <= 4 * math.sqrt(n * p * (1 - p)) + 1e-9


def test_default_is_t5s_density(registry):
    assert registry.info("prefix_lm").defaults() == {"noise_density": 0.5}
    assert registry.info("prefix_lm").attention == "prefix"


def test_the_split_is_uniform_inside_each_row(registry, synthetic_batch):
    N = 3800
    batch = synthetic_batch(VOCAB, [20] * N, seed=1)
    cb = corrupt(registry, batch)
    k = cb.extras["prefix_length"] - 1  # text tokens in the prefix ([CLS] excluded)
    assert int(k.min()) == 1 and int(k.max()) == 19
    counts = torch.bincount(k, minlength=20)[1:]
    assert all(within_4_sigma(int(c), N, 1 / 19) for c in counts), counts.tolist()


def test_lower_density_gives_shorter_continuations(registry, synthetic_batch):
    batch = synthetic_batch(VOCAB, [40] * 2000, seed=2)
    cb = corrupt(registry, batch, noise_density=0.25)
    k = cb.extras["prefix_length"] - 1
    # k uniform in [round(0.5 * 39), 39] = [20, 39] (half to even): the continuation holds 1..20 of
    # the 40 text tokens, 10.5 on average, a share of 0.2625 (T5's formula gives about d + 1/(2n)).
    assert int(k.min()) == 20 and int(k.max()) == 39
    continuation = (40 - k).double()
    assert abs(float(continuation.mean()) - 10.5) <= 4 * math.sqrt((20**2 - 1) / 12 / 2000)


def test_tokens_stay_and_only_the_continuation_is_labelled(registry, synthetic_batch):
    lengths = [0, 1, 2, 9, 30, 17]
    batch = synthetic_batch(VOCAB, lengths, T=34, seed=3)
    cb = corrupt(registry, batch)
    assert cb.input_ids.shape == (6, 32)  # width of the longest row
    T = cb.input_ids.shape[1]
    for b, n in enumerate(lengths):
        p = int(cb.extras["prefix_length"][b])
        assert 1 + min(1, max(n - 1, 0)) <= p <= max(n, 1)  # [CLS] + k text tokens, k in [1, n-1] when n >= 2
        assert torch.equal(cb.input_ids[b], batch.input_ids[b, :T])
        assert torch.equal(cb.is_padding[b], batch.is_padding[b, :T])
        expected = [int(batch.input_ids[b, t + 1]) if p - 1 <= t <= n else IGNORE_INDEX for t in range(T)]
        assert cb.labels[b].tolist() == expected, b


def test_mask_matches_a_brute_force_loop(registry, synthetic_batch):
    batch = synthetic_batch(VOCAB, [12, 5, 9], seed=4)
    objective = registry.get("prefix_lm", vocab=VOCAB)
    cb = objective.corrupt(batch, torch.Generator().manual_seed(5))
    described = objective.attention(cb)
    assert isinstance(described, objreg.AttentionMask) and described.pattern == "prefix"
    assert torch.equal(described.prefix_length, cb.extras["prefix_length"])
    mask = objective.attention_mask(cb)
    B, T = cb.input_ids.shape
    for b in range(B):
        p, n = int(cb.extras["prefix_length"][b]), int((~cb.is_padding[b]).sum())
        for i in range(T):
            for j in range(T):
                bidirectional_prefix = j < p
                causal = j <= i
                assert bool(mask[b, i, j]) == (i < n and j < n and (bidirectional_prefix or causal)), (b, i, j)


def test_loss_is_the_continuation_nll(registry, synthetic_batch):
    batch = synthetic_batch(VOCAB, [10, 6], seed=6)
    objective = registry.get("prefix_lm", vocab=VOCAB)
    cb = objective.corrupt(batch, torch.Generator().manual_seed(7))
    torch.manual_seed(0)
    head = nn.Linear(4, VOCAB.size).double()
    hidden = torch.randn(2, cb.input_ids.shape[1], 4, dtype=torch.float64)
    loss = objective.loss(objreg.ModelOutputs(hidden, types.SimpleNamespace(heads={"lm": head})), cb)
    for b in range(2):
        p, n = int(cb.extras["prefix_length"][b]), int((~cb.is_padding[b]).sum())
        nll = [-torch.log_softmax(head(hidden[b, t]), -1)[cb.input_ids[b, t + 1]] for t in range(p - 1, n - 1)]
        assert torch.allclose(loss[b], torch.stack(nll).mean())
