"""The default backbone plugin, built through the registry with the built-in head kinds: shapes,
seeding, weight tying, masks, and torch.func derivatives checked against independent computations
(autograd loops, double backward, finite differences)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, jvp, vmap

import objreg
from objreg.plugins.models import transformer
from objreg.plugins.models.transformer import build_config

REGISTRY = objreg.Registry.load(load_entrypoints=False)

VOCAB = objreg.Vocabulary(size=40, pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4, special_ids=(0, 1, 2, 3, 4))
TINY = {"hidden_size": 16, "num_layers": 2, "num_heads": 2, "intermediate_size": 32, "max_positions": 32}
HEADS = (
    objreg.HeadSpec("mlm", "lm"),
    objreg.HeadSpec("sop", "classifier", 2),
    objreg.HeadSpec("qa", "span"),
    objreg.HeadSpec("rtd", "token_classifier", 1),
    objreg.HeadSpec("emb", "projection", 8),
)


def make_model(seed: int = 0, heads=HEADS, name: str = "default", **overrides) -> nn.Module:
    generator = torch.Generator().manual_seed(seed)
    return REGISTRY.load_model(name, VOCAB, heads, {**TINY, **overrides}, generator)


def make_inputs(B: int = 3, T: int = 8, num_padding: int = 3):
    """Random ids; the last example ends in ``num_padding`` padding positions."""
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(5, VOCAB.size, (B, T), generator=generator)  # (B, T)
    is_padding = torch.zeros(B, T, dtype=torch.bool)
    is_padding[-1, T - num_padding :] = True
    input_ids = input_ids.masked_fill(is_padding, VOCAB.pad_id)
    position_ids = torch.arange(T).expand(B, T)  # (B, T)
    return input_ids, is_padding, position_ids


def backbone_params(model: nn.Module, prefix: str = "") -> dict[str, torch.Tensor]:
    return {f"{prefix}backbone.{n}": p.detach() for n, p in model.backbone.named_parameters()}


def random_like(params: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {k: torch.randn(p.shape, generator=generator, dtype=p.dtype) for k, p in params.items()}


def dot(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> torch.Tensor:
    return sum((a[k] * b[k]).sum() for k in a)


class LMLoss(nn.Module):
    """Backbone + tied LM head + per-sample cross-entropy, so functional_call swaps every
    parameter (the tied decoder weight included) around the whole computation."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, mask, position_ids, labels):
        hidden = self.model.encode(input_ids, mask, position_ids)  # (B, T, H)
        logits = self.model.heads["mlm"](hidden)  # (B, T, V)
        losses = F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=objreg.IGNORE_INDEX, reduction="none")
        return losses.sum(dim=1)  # (B,)


def lm_batch():
    input_ids, is_padding, position_ids = make_inputs()
    labels = input_ids.roll(-1, dims=1).masked_fill(is_padding, objreg.IGNORE_INDEX)  # (B, T)
    return input_ids, objreg.masks.bidirectional(is_padding), position_ids, labels


# -- shapes and construction ------------------------------------------------------------------------


def test_encode_and_heads_have_the_documented_shapes():
    model = make_model()
    input_ids, is_padding, position_ids = make_inputs(B=3, T=8)
    hidden = model(input_ids, objreg.masks.bidirectional(is_padding), position_ids)
    assert hidden.shape == (3, 8, 16) and model.hidden_size == 16
    assert model.heads["mlm"](hidden).shape == (3, 8, VOCAB.size)
    assert model.heads["mlm"](hidden[:, :2]).shape == (3, 2, VOCAB.size)  # gathered positions [B, K, H]
    assert model.heads["sop"](hidden).shape == (3, 2)
    assert model.heads["qa"](hidden).shape == (3, 8, 2)
    assert model.heads["rtd"](hidden).shape == (3, 8, 1)
    assert model.heads["emb"](hidden).shape == (3, 8)
    assert all(p.dtype == torch.float32 and p.device.type == "cpu" for p in model.parameters())


def test_same_seed_gives_identical_weights_and_a_different_seed_does_not():
    first, second, other = make_model(seed=0), make_model(seed=0), make_model(seed=1)
    assert first.state_dict().keys() == other.state_dict().keys()
    assert all(torch.equal(v, second.state_dict()[k]) for k, v in first.state_dict().items())
    weights = [k for k in first.state_dict() if k.endswith("weight") and "norm" not in k]
    assert all(not torch.equal(first.state_dict()[k], other.state_dict()[k]) for k in weights)


def test_construction_leaves_the_global_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    make_model()
    assert torch.equal(torch.rand(3), expected)


def test_init_follows_bert():
    model = make_model(heads=(), hidden_size=64, num_heads=4)
    for name, param in model.named_parameters():
        if "norm" in name:
            assert torch.all(param == (1.0 if name.endswith("weight") else 0.0)), name
        elif name.endswith("bias"):
            assert torch.all(param == 0.0), name
    std = model.backbone.blocks[0].mlp.up.weight.std().item()  # 2048 draws: about 1.6% sampling error
    assert 0.018 < std < 0.022


def test_lm_head_decoder_weight_is_the_token_embedding_parameter():
    model = make_model()
    embedding = model.backbone.token_embedding.weight
    assert model.heads["mlm"].decoder.weight is embedding
    names = [name for name, p in model.named_parameters() if p is embedding]
    assert names == ["backbone.token_embedding.weight"]
    head_names = [n for n, _ in model.named_parameters() if n.startswith("heads.mlm.")]
    own = ("decoder.bias", "dense.bias", "dense.weight", "norm.bias", "norm.weight")  # the tied weight is not here
    assert sorted(head_names) == [f"heads.mlm.{n}" for n in own]
    counted = sum(p.numel() for p in model.parameters())
    assert counted == sum(p.numel() for p in model.backbone.parameters()) + sum(
        p.numel() for n, p in model.heads.named_parameters() if n != "mlm.decoder.weight"
    )
    # the host's dtype conversion keeps the tie
    model.double()
    assert model.heads["mlm"].decoder.weight is model.backbone.token_embedding.weight


# -- masks and positions ------------------------------------------------------------------------------


def test_causal_mask_blocks_the_future_and_bidirectional_does_not():
    model = make_model()
    input_ids, is_padding, position_ids = make_inputs(num_padding=0)
    changed = input_ids.clone()
    changed[:, 5] = (changed[:, 5] + 1 - 5) % (VOCAB.size - 5) + 5  # another ordinary token
    with torch.no_grad():
        causal = objreg.masks.causal(is_padding)
        before, after = model(input_ids, causal, position_ids), model(changed, causal, position_ids)
        torch.testing.assert_close(after[:, :5], before[:, :5], rtol=0, atol=1e-6)
        assert (after[:, 5:] - before[:, 5:]).abs().max() > 1e-3
        full = objreg.masks.bidirectional(is_padding)
        before, after = model(input_ids, full, position_ids), model(changed, full, position_ids)
        assert (after[:, :5] - before[:, :5]).abs().amax(dim=(1, 2)).min() > 1e-3


def test_padding_query_rows_are_finite_and_padding_keys_are_ignored():
    model = make_model()
    input_ids, is_padding, position_ids = make_inputs(num_padding=3)
    mask = objreg.masks.causal(is_padding) & ~is_padding[:, :, None]  # padding queries see nothing
    assert not mask[-1, -1].any()
    hidden = model(input_ids, mask, position_ids)
    hidden.sum().backward()
    assert torch.isfinite(hidden).all()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    # the value of a padding token never reaches a real position
    changed = input_ids.masked_fill(is_padding, 7)
    with torch.no_grad():
        torch.testing.assert_close(model(changed, mask, position_ids)[~is_padding], hidden.detach()[~is_padding])
        all_false = torch.zeros_like(mask)
        assert torch.isfinite(model(input_ids, all_false, position_ids)).all()


def test_positions_come_from_position_ids():
    """Two packed documents with restarting positions and a block-diagonal mask give the second
    document the hidden states it has on its own."""
    model = make_model()
    ids = torch.tensor([[2, 10, 11, 3, 2, 20, 21, 22, 3]])  # (1, 9): documents of 4 and 5 tokens
    document_ids = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 1, 1]])
    packed_positions = objreg.masks.positions_within_documents(document_ids)
    assert packed_positions.tolist() == [[0, 1, 2, 3, 0, 1, 2, 3, 4]]
    no_padding = torch.zeros(1, 5, dtype=torch.bool)
    with torch.no_grad():
        packed = model(ids, objreg.masks.same_document(document_ids), packed_positions)
        alone = model(ids[:, 4:], objreg.masks.bidirectional(no_padding), torch.arange(5)[None])
        shifted = model(ids, objreg.masks.same_document(document_ids), torch.arange(9)[None])
    torch.testing.assert_close(packed[:, 4:], alone)
    assert (shifted[:, 4:] - alone).abs().max() > 1e-3


def test_math_and_sdpa_attention_agree():
    math_model, sdpa_model = make_model(seed=3), make_model(seed=3, attention="sdpa")
    input_ids, is_padding, position_ids = make_inputs()
    for mask in (objreg.masks.bidirectional(is_padding), objreg.masks.causal(is_padding) & ~is_padding[:, :, None]):
        outputs = [m(input_ids, mask, position_ids) for m in (math_model, sdpa_model)]
        torch.testing.assert_close(outputs[1], outputs[0], rtol=1e-5, atol=1e-5)
        for output in outputs:
            output.pow(2).sum().backward()
    for (name, p), q in zip(math_model.named_parameters(), sdpa_model.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-4, msg=name)  # fp32, |grad| up to ~10


def test_bad_inputs_are_named():
    model = make_model()
    input_ids, is_padding, position_ids = make_inputs(T=8)
    with pytest.raises(objreg.InvalidParameterError, match="bool"):
        model(input_ids, objreg.masks.bidirectional(is_padding).float(), position_ids)
    long_ids = torch.full((1, 40), 5)
    with pytest.raises(objreg.InvalidParameterError, match="max_positions=32"):
        model(long_ids, torch.ones(1, 40, 40, dtype=torch.bool), torch.arange(40)[None])


# -- torch.func derivatives (float64) ---------------------------------------------------------------


def test_jvp_equals_reverse_mode_dot_and_finite_difference():
    model = make_model().double()
    input_ids, is_padding, position_ids = make_inputs()
    mask = objreg.masks.bidirectional(is_padding)
    weights = torch.randn(3, 8, 16, generator=torch.Generator().manual_seed(2), dtype=torch.float64)

    def f(params):
        hidden = functional_call(model, params, (input_ids, mask, position_ids))  # (B, T, H)
        return (hidden * weights).sum()

    params = backbone_params(model)
    direction = random_like(params, seed=4)
    _, forward = jvp(f, (params,), (direction,))
    reverse = dot(grad(f)(params), direction)
    eps = 1e-5
    plus = f({k: p + eps * direction[k] for k, p in params.items()})
    minus = f({k: p - eps * direction[k] for k, p in params.items()})
    torch.testing.assert_close(forward, reverse, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(forward, (plus - minus) / (2 * eps), rtol=1e-6, atol=1e-8)


def test_vmap_per_example_grads_equal_a_loop_over_examples():
    model = make_model().double()
    wrapper = LMLoss(model)
    input_ids, mask, position_ids, labels = lm_batch()
    params = backbone_params(model, prefix="model.")

    def loss_one(params, ids, m, pos, lab):  # one example, run as a batch of one
        batch = (ids[None], m[None], pos[None], lab[None])
        return functional_call(wrapper, params, batch)[0]

    per_example = vmap(grad(loss_one), in_dims=(None, 0, 0, 0, 0))(params, input_ids, mask, position_ids, labels)

    embedding = model.backbone.token_embedding.weight
    for i in range(input_ids.shape[0]):
        loss = wrapper(input_ids[i : i + 1], mask[i : i + 1], position_ids[i : i + 1], labels[i : i + 1])[0]
        expected = torch.autograd.grad(loss, list(model.backbone.parameters()))
        for (name, _), g in zip(model.backbone.named_parameters(), expected):
            torch.testing.assert_close(per_example[f"model.backbone.{name}"][i], g, rtol=1e-9, atol=1e-10)
    # the tied decoder feeds the embedding's gradient: rows of tokens absent from the input still move
    absent = torch.ones(VOCAB.size, dtype=torch.bool)
    absent[input_ids[0]] = False
    assert per_example["model.backbone.token_embedding.weight"][0][absent].abs().sum() > 0
    assert embedding.grad is None  # the loop used autograd.grad, nothing was accumulated


def test_forward_over_reverse_hvp_equals_double_backward():
    model = make_model().double()
    wrapper = LMLoss(model)
    batch = lm_batch()
    params = backbone_params(model, prefix="model.")
    direction = random_like(params, seed=5)

    def mean_loss(params):
        return functional_call(wrapper, params, batch).mean()

    _, hvp = jvp(grad(mean_loss), (params,), (direction,))

    names = [f"model.backbone.{n}" for n, _ in model.backbone.named_parameters()]
    leaves = list(model.backbone.parameters())
    gradients = torch.autograd.grad(wrapper(*batch).mean(), leaves, create_graph=True)
    expected = torch.autograd.grad(sum((g * direction[n]).sum() for g, n in zip(gradients, names)), leaves)
    for name, e in zip(names, expected):
        torch.testing.assert_close(hvp[name], e, rtol=1e-8, atol=1e-10, msg=name)
    assert sum(e.abs().sum() for e in expected) > 0


# -- config and heads ----------------------------------------------------------------------------------


def test_default_and_bert_base_presets():
    default = build_config("default", 8000, {})
    assert (default.hidden_size, default.num_layers, default.num_heads, default.intermediate_size) == (128, 2, 4, 512)
    assert (default.max_positions, default.dropout, default.attention) == (512, 0.0, "math")
    bert = build_config("bert-base", 30522, {})
    assert (bert.hidden_size, bert.num_layers, bert.num_heads, bert.intermediate_size) == (768, 12, 12, 3072)
    model = REGISTRY.load_model(
        "bert-base", VOCAB, (objreg.HeadSpec("mlm", "lm"),), {"num_layers": 1}, torch.Generator().manual_seed(0)
    )
    config = model.backbone.config
    assert config.num_layers == 1 and config.num_heads == 12 and model.hidden_size == 768
    assert model.backbone.blocks[0].mlp.up.weight.shape == (3072, 768)
    assert model.backbone.blocks[0].attention.qkv.weight.shape == (3 * 768, 768)
    hidden = model(torch.tensor([[2, 9, 3]]), torch.ones(1, 3, 3, dtype=torch.bool), torch.arange(3)[None])
    assert hidden.shape == (1, 3, 768)


def test_overrides_accept_cli_strings():
    config = build_config("default", 100, {"hidden_size": "64", "num_heads": "8", "dropout": "0.1"})
    assert (config.hidden_size, config.num_heads, config.dropout) == (64, 8, 0.1)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"hiden_size": 64}, "unknown model config key.*'hiden_size'.*allowed: hidden_size, num_layers"),
        ({"vocab_size": 64}, "unknown model config key.*'vocab_size'"),
        ({"hidden_size": 30, "num_heads": 4}, "hidden_size=30 must be divisible by num_heads=4"),
        ({"num_layers": 0}, "'num_layers' must be a positive integer"),
        ({"intermediate_size": -8}, "'intermediate_size' must be a positive integer"),
        ({"num_heads": 2.5}, "'num_heads' must be a positive integer"),
        ({"hidden_size": "big"}, "'hidden_size' must be int"),
        ({"dropout": 1.0}, r"'dropout' must lie in \[0, 1\)"),
        ({"layer_norm_eps": 0}, "'layer_norm_eps' must be positive"),
        ({"attention": "flash"}, "'attention' must be one of math, sdpa"),
    ],
)
def test_bad_config_is_rejected_with_what_is_allowed(overrides, message):
    with pytest.raises(objreg.InvalidParameterError, match=message):
        make_model(**overrides)


@pytest.mark.parametrize(
    ("heads", "message"),
    [
        ((objreg.HeadSpec("x", "decoder"),), "unknown kind 'decoder'; registered kinds: classifier, generator, lm, "),
        ((objreg.HeadSpec("x", "classifier"),), "needs num_outputs >= 1, got 0"),
        ((objreg.HeadSpec("x", "projection", -1),), "needs num_outputs >= 1"),
        ((objreg.HeadSpec("x", "span", 3),), "2 outputs"),
        ((objreg.HeadSpec("x", "lm"), objreg.HeadSpec("x", "span")), "more than once: x"),
        ((objreg.HeadSpec("a.b", "lm"),), "contain no '.'"),
    ],
)
def test_bad_heads_are_rejected(heads, message):
    with pytest.raises(objreg.InvalidParameterError, match=message):
        make_model(heads=heads)


# -- hooks through the registry -----------------------------------------------------------------------


def test_registers_its_two_models_and_builds_only_the_backbone():
    provided = []
    transformer.objreg_register_models(provided.append)
    assert {(p.kind, p.name, p.accepts) for p in provided} == {("model", "default", None), ("model", "bert-base", None)}
    backbone = provided[0].load("default", VOCAB, TINY, torch.Generator().manual_seed(0))
    assert isinstance(backbone, objreg.Backbone) and isinstance(backbone, transformer.Backbone)
    assert (backbone.hidden_size, backbone.vocab_size, backbone.num_layers, backbone.max_positions) == (16, 40, 2, 32)
    assert backbone.input_embeddings() is backbone.token_embedding.weight
    assert backbone.position_embeddings() is backbone.position_embedding.weight
    # the same draws as the backbone of a model the host builds from the same seed
    built = make_model(heads=())
    assert all(torch.equal(p, q) for p, q in zip(backbone.parameters(), built.backbone.parameters()))


def test_registry_loads_the_default_model_and_rejects_unknown_names():
    registry = objreg.Registry.load(load_entrypoints=False)
    heads = [objreg.HeadSpec("mlm", "lm")]
    model = registry.load_model("default", VOCAB, heads, TINY, torch.Generator().manual_seed(0))
    assert isinstance(model.backbone, transformer.Backbone) and set(model.heads) == {"mlm"}
    assert {"default", "bert-base"} <= {p.name for p in registry.providers() if p.kind == "model"}
    with pytest.raises(objreg.UnknownNameError, match="unknown model 'nosuch'.*bert-base, default"):
        registry.load_model("nosuch", VOCAB, heads, {}, torch.Generator())
