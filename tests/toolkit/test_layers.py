"""objreg.toolkit.layers: structured attention (fused kernels, no [B, T, T] tensor) against the
dense mask it describes, in values and gradients, and the dense fallback under transforms."""

from __future__ import annotations

import pytest
import torch
from torch.func import jvp

from objreg.core import masks
from objreg.plugins.models.transformer import build_backbone, build_config
from objreg.toolkit import layers
from objreg.toolkit.layers import StructuredAttention, block_mask, prepare_attention

B, T = 5, 40


def backbone(**overrides):
    config = build_config("default", 100, {"hidden_size": 32, "num_heads": 4, "intermediate_size": 64, **overrides})
    return build_backbone(config, torch.Generator().manual_seed(0))


def structures():
    g = torch.Generator().manual_seed(2)
    lengths = torch.tensor([40, 30, 1, 17, 39])
    padding = torch.arange(T)[None, :] >= lengths[:, None]
    one = torch.where(padding, -1, torch.arange(B)[:, None] + 3)
    packed = torch.where(padding, -1, torch.arange(T)[None, :] // 7 + 10 * torch.arange(B)[:, None])
    prefix = torch.tensor([10, 0, 1, 17, 5])
    inner = padding.roll(3, dims=1)  # padding inside the row
    return {
        "bidirectional": (masks.AttentionMask.bidirectional(padding, one), "keys"),
        "bidirectional, no documents": (masks.AttentionMask.bidirectional(padding), "keys"),
        "causal": (masks.AttentionMask.causal(padding, one), "causal"),
        "prefix": (masks.AttentionMask.prefix(padding, prefix, one), "prefix"),
        "bidirectional, packed": (masks.AttentionMask.bidirectional(padding, packed), "blocks"),
        "causal, packed": (masks.AttentionMask.causal(padding, packed), "blocks"),
        "prefix, packed": (masks.AttentionMask.prefix(padding, prefix, packed), "blocks"),
        "causal, inner padding": (masks.AttentionMask.causal(inner), "blocks"),
        "random prefix": (masks.AttentionMask.prefix(padding, torch.randint(0, 41, (B,), generator=g)), "prefix"),
    }


@pytest.mark.parametrize("name", list(structures()))
def test_structured_attention_equals_the_dense_mask_at_real_queries(name, monkeypatch):
    monkeypatch.setattr(layers, "QUERY_BLOCK", 16)  # several blocks, the last one short
    mask, kind = structures()[name]
    assert StructuredAttention(mask, torch.float32).kind == kind
    model = backbone()
    ids = torch.randint(5, 100, (B, T), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(T).expand(B, T)
    real = ~mask.is_padding
    dense = model.encode(ids, mask.dense(), positions)
    structured = model.encode(ids, mask, positions)
    assert torch.allclose(structured[real], dense[real], atol=1e-5)
    assert bool(torch.isfinite(structured).all())
    # Gradients of a loss on the real positions agree too (the backward of the fused kernels,
    # and of the checkpointed blocks).
    weight = model.token_embedding.weight
    g_dense = torch.autograd.grad(model.encode(ids, mask.dense(), positions)[real].square().sum(), weight)[0]
    g_structured = torch.autograd.grad(model.encode(ids, mask, positions)[real].square().sum(), weight)[0]
    assert torch.allclose(g_structured, g_dense, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", list(structures()))
def test_structured_attention_in_float64_equals_a_softmax_loop_over_the_dense_mask(name, monkeypatch):
    """Each path of StructuredAttention, in float64, against softmax(q·k/√d) over the keys the
    dense mask allows, one query at a time; padding queries get zero."""
    monkeypatch.setattr(layers, "QUERY_BLOCK", 16)
    mask, kind = structures()[name]
    heads, size = 2, 8
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(B, heads, T, size, generator=g, dtype=torch.float64) for _ in range(3))
    out = StructuredAttention(mask, torch.float64)(q, k, v, 0.0)
    assert out.dtype == torch.float64 and StructuredAttention(mask, torch.float64).kind == kind
    allowed = mask.dense()
    expected = torch.zeros_like(out)
    for b in range(B):
        for t in range(T):
            keys = allowed[b, t].nonzero().flatten()
            if bool(mask.is_padding[b, t]) or keys.numel() == 0:
                continue
            for h in range(heads):
                weights = torch.softmax(k[b, h, keys] @ q[b, h, t] / size**0.5, dim=0)
                expected[b, h, t] = weights @ v[b, h, keys]
    assert torch.allclose(out, expected, rtol=0, atol=1e-12), (out - expected).abs().max()


def test_block_mask_is_the_dense_mask_cut_to_the_block():
    for mask, _ in structures().values():
        full = mask.dense()
        for start, end, keys in ((0, 16, 40), (16, 32, 32), (32, 40, 40), (5, 6, 7)):
            assert torch.equal(block_mask(mask, start, end, keys), full[:, start:end, :keys])


def test_structured_paths_build_nothing_quadratic():
    """Every tensor the plan keeps is O(B·T)."""
    for mask, kind in structures().values():
        plan = StructuredAttention(mask, torch.float32)
        kept = [v for v in vars(plan).values() if isinstance(v, torch.Tensor)]
        assert all(t.numel() <= B * T for t in kept), kind


def test_forward_mode_densifies_the_structured_mask():
    """Under jvp (which fused kernels do not support) the structured mask runs the dense math path:
    the same tangent as with the dense mask."""
    mask = structures()["prefix, packed"][0]
    model = backbone()
    ids = torch.randint(5, 100, (B, T), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(T).expand(B, T)
    x = model.token_embedding.weight.detach()
    direction = torch.randn_like(x)
    params = dict(model.named_parameters())

    def run(m):
        def f(w):
            out = torch.func.functional_call(model, {**params, "token_embedding.weight": w}, (ids, m, positions))
            return out[~mask.is_padding].sum()
        return jvp(f, (x,), (direction,))

    assert layers.transforms_active() is False
    (value_s, tangent_s), (value_d, tangent_d) = run(mask), run(mask.dense())
    assert torch.equal(value_s, value_d) and torch.equal(tangent_s, tangent_d)
    assert isinstance(prepare_attention(mask, torch.float32), StructuredAttention)
    assert isinstance(prepare_attention(mask.dense(), torch.float32), layers.AttentionBias)


def test_a_long_causal_row_trains_without_a_quadratic_mask():
    """One SGD step of a causal row far longer than the default 512 positions: the structured mask
    is O(T), and the fused kernel keeps no [T, T] scores for the backward."""
    T_long = 4096
    model = backbone(max_positions=T_long)
    ids = torch.randint(5, 100, (1, T_long), generator=torch.Generator().manual_seed(0))
    mask = masks.AttentionMask.causal(torch.zeros(1, T_long, dtype=torch.bool))
    out = model.encode(ids, mask, torch.arange(T_long)[None, :])
    out.square().mean().backward()
    assert all(p.grad is not None and bool(torch.isfinite(p.grad).all()) for p in model.parameters())
