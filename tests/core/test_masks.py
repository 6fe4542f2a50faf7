"""The attention-mask helpers against explicit loops over (b, i, j) on random inputs."""

from __future__ import annotations

import pytest
import torch

import objreg
from objreg.core import masks

B, T = 7, 13


def random_inputs(seed: int):
    """Random right padding, contiguous document runs over the real tokens (-1 at padding), and
    random prefix lengths in [0, T]."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0] = T  # one row without padding
    is_padding = torch.arange(T)[None, :] >= lengths[:, None]
    document_ids = torch.full((B, T), -1, dtype=torch.long)
    for b in range(B):
        doc, start = int(torch.randint(0, 3, (1,), generator=g)), 0
        n = int(lengths[b])
        while start < n:
            run = int(torch.randint(1, 5, (1,), generator=g))
            document_ids[b, start : min(n, start + run)] = doc
            doc += int(torch.randint(1, 3, (1,), generator=g))
            start += run
    prefix_length = torch.randint(0, T + 1, (B,), generator=g)
    return is_padding, document_ids, prefix_length


SEEDS = [0, 1, 2, 3]


def loop_mask(rule) -> torch.Tensor:
    out = torch.zeros(B, T, T, dtype=torch.bool)
    for b in range(B):
        for i in range(T):
            for j in range(T):
                out[b, i, j] = bool(rule(b, i, j))
    return out


@pytest.mark.parametrize("seed", SEEDS)
def test_bidirectional(seed):
    pad, _, _ = random_inputs(seed)
    got = masks.bidirectional(pad)
    assert got.dtype == torch.bool and got.shape == (B, T, T)
    assert torch.equal(got, loop_mask(lambda b, i, j: not pad[b, j]))


@pytest.mark.parametrize("seed", SEEDS)
def test_causal(seed):
    pad, _, _ = random_inputs(seed)
    got = masks.causal(pad)
    assert got.dtype == torch.bool and got.shape == (B, T, T)
    assert torch.equal(got, loop_mask(lambda b, i, j: j <= i and not pad[b, j]))


@pytest.mark.parametrize("seed", SEEDS)
def test_prefix(seed):
    pad, _, prefix_length = random_inputs(seed)
    got = masks.prefix(pad, prefix_length)
    expected = loop_mask(lambda b, i, j: (j <= i or j < prefix_length[b]) and not pad[b, j])
    assert got.dtype == torch.bool
    assert torch.equal(got, expected)


def test_prefix_extremes_are_causal_and_bidirectional():
    pad, _, _ = random_inputs(5)
    assert torch.equal(masks.prefix(pad, torch.zeros(B, dtype=torch.long)), masks.causal(pad))
    assert torch.equal(masks.prefix(pad, torch.full((B,), T)), masks.bidirectional(pad))


@pytest.mark.parametrize("seed", SEEDS)
def test_same_document(seed):
    _, doc, _ = random_inputs(seed)
    got = masks.same_document(doc)
    expected = loop_mask(lambda b, i, j: doc[b, i] == doc[b, j] and doc[b, j] >= 0)
    assert got.dtype == torch.bool
    assert torch.equal(got, expected)
    # some row really packs two documents, so the block structure was exercised
    assert any(len(set(doc[b][doc[b] >= 0].tolist())) > 1 for b in range(B))


def loop_positions(doc: torch.Tensor) -> torch.Tensor:
    """Restart at 0 where a new document begins; padding (-1) continues the last count."""
    out = torch.zeros_like(doc)
    for b in range(doc.shape[0]):
        count = 0
        for t in range(doc.shape[1]):
            if t > 0 and doc[b, t] >= 0 and doc[b, t] != doc[b, t - 1]:
                count = 0
            elif t > 0:
                count += 1
            out[b, t] = count
    return out


@pytest.mark.parametrize("seed", SEEDS)
def test_positions_within_documents_at_real_tokens(seed):
    _, doc, _ = random_inputs(seed)
    got = masks.positions_within_documents(doc)
    assert got.dtype == torch.long and got.shape == (B, T)
    real = doc >= 0
    assert torch.equal(got[real], loop_positions(doc)[real])


def test_positions_within_documents_padding_continues_the_count():
    doc = torch.tensor([[0, 0, 0, -1, -1], [3, 3, 4, 4, -1]])
    assert masks.positions_within_documents(doc).tolist() == [[0, 1, 2, 3, 4], [0, 1, 0, 1, 2]]


@pytest.mark.parametrize("seed", SEEDS)
def test_allowed_connections_of_causal_is_triangular_number(seed):
    pad, _, _ = random_inputs(seed)
    n = [int(k) for k in (~pad).sum(dim=1)]
    causal = masks.causal(pad)
    # over the n real tokens alone: n(n+1)/2
    for b in range(B):
        alone = masks.allowed_connections(causal[b : b + 1, : n[b], : n[b]])
        assert alone.tolist() == [n[b] * (n[b] + 1) // 2]
    # the padded rows: padding query rows still see the n real keys (never padding keys)
    got = masks.allowed_connections(causal)
    assert got.dtype == torch.long
    assert got.tolist() == [k * (k + 1) // 2 + (T - k) * k for k in n]
    assert masks.allowed_connections(masks.bidirectional(pad)).tolist() == [T * k for k in n]


@pytest.mark.parametrize("seed", [0, 1])
def test_masks_are_pure_under_vmap(seed):
    pad, doc, prefix_length = random_inputs(seed)
    one = lambda f: (lambda *xs: f(*(x[None] for x in xs))[0])  # noqa: E731 - per-example view
    cases = [
        (masks.bidirectional, (pad,)),
        (masks.causal, (pad,)),
        (masks.prefix, (pad, prefix_length)),
        (masks.same_document, (doc,)),
        (masks.positions_within_documents, (doc,)),
    ]
    for fn, args in cases:
        batched = torch.vmap(one(fn))(*args)
        assert torch.equal(batched, fn(*args)), fn.__name__
    # no helper modified its inputs in place
    fresh = random_inputs(seed)
    assert all(torch.equal(a, b) for a, b in zip((pad, doc, prefix_length), fresh))


def test_padding_keys_never_attended_and_combination_with_and():
    pad, doc, _ = random_inputs(9)
    combined = masks.causal(pad) & masks.same_document(doc)
    assert not (combined & pad[:, None, :]).any()
    expected = loop_mask(lambda b, i, j: j <= i and doc[b, i] == doc[b, j] and doc[b, j] >= 0)
    assert torch.equal(combined, expected)


# -- the structured AttentionMask -------------------------------------------------------------------


def _structured_cases():
    g = torch.Generator().manual_seed(4)
    B, T = 5, 9
    lengths = torch.tensor([9, 7, 4, 1, 0])
    padding = torch.arange(T)[None, :] >= lengths[:, None]
    documents = torch.randint(0, 3, (B, T), generator=g).sort(dim=1).values.masked_fill(padding, -1)
    prefix_length = torch.tensor([3, 0, 4, 1, 2])
    for docs in (None, documents):
        yield objreg.AttentionMask.bidirectional(padding, docs)
        yield objreg.AttentionMask.causal(padding, docs)
        yield objreg.AttentionMask.prefix(padding, prefix_length, docs)


def _loop_mask(spec: objreg.AttentionMask) -> torch.Tensor:
    """The mask the structure describes, one (query, key) pair at a time."""
    B, T = spec.is_padding.shape
    out = torch.zeros(B, T, T, dtype=torch.bool)
    for b in range(B):
        for i in range(T):
            for j in range(T):
                ok = not bool(spec.is_padding[b, j])
                if spec.document_ids is not None:
                    ok = ok and int(spec.document_ids[b, i]) == int(spec.document_ids[b, j]) >= 0
                if spec.pattern == "causal":
                    ok = ok and j <= i
                if spec.pattern == "prefix":
                    ok = ok and (j <= i or j < int(spec.prefix_length[b]))
                out[b, i, j] = ok
    return out


@pytest.mark.parametrize("spec", list(_structured_cases()), ids=lambda s: s.pattern)
def test_structured_mask_dense_and_mask_mod_equal_a_loop(spec):
    expected = _loop_mask(spec)
    assert torch.equal(spec.dense(), expected)
    B, T = spec.is_padding.shape
    b, q, kv = torch.meshgrid(torch.arange(B), torch.arange(T), torch.arange(T), indexing="ij")
    assert torch.equal(spec.mask_mod()(b, torch.zeros_like(b), q, kv), expected)
    rows = torch.tensor([3, 0])
    assert torch.equal(spec.select(rows).dense(), expected[rows])
    assert spec.shape == (B, T, T) and torch.equal(masks.dense(spec), masks.dense(expected))


def test_structured_mask_rejects_an_unknown_pattern_or_a_stray_prefix():
    padding = torch.zeros(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="bidirectional, causal or prefix"):
        objreg.AttentionMask("anti-causal", padding)
    with pytest.raises(ValueError, match="prefix_length"):
        objreg.AttentionMask("causal", padding, None, torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="prefix_length"):
        objreg.AttentionMask("prefix", padding)


def test_padding_at_the_end_is_no_real_token_after_padding():
    g = torch.Generator().manual_seed(11)
    for trial in range(300):
        rows, width = int(torch.randint(1, 5, (1,), generator=g)), int(torch.randint(0, 9, (1,), generator=g))
        if trial % 2:
            is_padding = torch.rand(rows, width, generator=g) < 0.4
        else:
            is_padding = torch.arange(width)[None, :] >= torch.randint(0, width + 1, (rows,), generator=g)[:, None]
        expected = all(not (is_padding[b, t] and not is_padding[b, t + 1])
                       for b in range(rows) for t in range(width - 1))
        assert masks.padding_at_the_end(is_padding) == expected
