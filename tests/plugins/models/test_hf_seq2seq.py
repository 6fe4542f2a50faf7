"""Encoder-decoders (T5, BART built from configs): ``t5``, ``bart``, ``ul2`` and ``prefix_lm``
rows run through the real encoder and decoder, checked against transformers' own forward on the
split source and shifted target; per-sample dots against a loop in float64; the encoder alone for
bidirectional rows; a clear refusal of causal objectives."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import objreg
from objreg.cli import make_cli
from objreg.core.registry import merge_heads

transformers = pytest.importorskip("transformers")


def load(registry, directory, names):
    tokenizer = registry.load_tokenizer(directory, objreg.Corpus("unused", ()), objreg.cache_dir())
    heads = merge_heads({n: registry.info(n).heads for n in names})
    model = registry.load_model(directory, tokenizer.vocab, heads, {}, torch.Generator().manual_seed(0))
    return tokenizer, model.double().eval()


@pytest.mark.parametrize(("family", "name"), [("t5", "t5"), ("t5", "ul2"), ("bart", "bart"), ("bart", "prefix_lm")])
def test_targets_are_predicted_by_the_real_decoder(registry, model_dir, family, name, texts):
    tokenizer, model = load(registry, model_dir(family), (name,))
    assert model.architecture == tokenizer.architecture == "encoder-decoder"
    objective = registry.get(name, vocab=tokenizer.vocab)
    batch = objective.corrupt(tokenizer.batch_from_texts(texts, 24), torch.Generator().manual_seed(0))
    with torch.no_grad():
        hidden = model.encode(batch.input_ids, objective.attention_mask(batch), batch.position_ids)
    hf = model.backbone.model
    start = hf.config.decoder_start_token_id
    for b in range(batch.batch_size):
        # Independently, per row: the source to the encoder, the target shifted right behind the
        # start token to the decoder, transformers' own padding-free forward.
        length = int(batch.extras["prefix_length"][b])
        total = int((~batch.is_padding[b]).sum())
        source = batch.input_ids[b, :length][None]
        target = batch.input_ids[b, length:total][None]
        shifted = torch.cat([torch.tensor([[start]]), target[:, :-1]], dim=1)
        with torch.no_grad():
            expected = hf(input_ids=source, decoder_input_ids=shifted).last_hidden_state[0]  # (target, H)
        positions = batch.extras["target_positions"][b][batch.extras["target_weights"][b] > 0]
        torch.testing.assert_close(hidden[b, positions], expected, rtol=1e-10, atol=1e-10)
        # The source positions before the last hold the encoder's states.
        with torch.no_grad():
            encoded = hf.get_encoder()(input_ids=source).last_hidden_state[0]
        torch.testing.assert_close(hidden[b, : length - 1], encoded[: length - 1], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize(("family", "name"), [("t5", "t5"), ("t5", "bart"), ("bart", "ul2")])
def test_per_sample_dots_equal_a_loop_in_float64(registry, model_dir, family, name, texts, dots_auto_and_loop):
    tokenizer, model = load(registry, model_dir(family), (name,))
    objective = registry.get(name, vocab=tokenizer.vocab)
    batch = objective.corrupt(tokenizer.batch_from_texts(texts, 24), torch.Generator().manual_seed(0))
    auto, _, loop = dots_auto_and_loop(model, objective, batch)
    assert auto.shape == (3,) and (loop.abs() > 0).all()
    # T5's LayerNorm takes its variance in float32 whatever the model's dtype, so two ways of
    # batching the same sums agree to float32 rounding there; BART is float64 throughout.
    tolerance = 1e-6 if family == "t5" else 1e-9
    torch.testing.assert_close(auto, loop, rtol=tolerance, atol=tolerance * float(loop.abs().max()))


def test_bidirectional_rows_run_on_the_encoder_alone(registry, model_dir, texts):
    tokenizer, model = load(registry, model_dir("t5"), ("mlm",))
    objective = registry.get("mlm", vocab=tokenizer.vocab)
    batch = objective.corrupt(tokenizer.batch_from_texts(texts, None), torch.Generator().manual_seed(0))
    with torch.no_grad():
        hidden = model.encode(batch.input_ids, objective.attention_mask(batch), batch.position_ids)
        encoder = model.backbone.model.get_encoder()
        expected = encoder(input_ids=batch.input_ids, attention_mask=(~batch.is_padding).long()).last_hidden_state
    real = ~batch.is_padding
    assert batch.is_padding.any()
    torch.testing.assert_close(hidden[real], expected[real], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", ["clm", "fim"])
def test_causal_objectives_are_refused_in_one_line(registry, model_dir, name, texts):
    tokenizer, model = load(registry, model_dir("t5"), (name,))
    objective = registry.get(name, vocab=tokenizer.vocab)
    batch = objective.corrupt(tokenizer.batch_from_texts(texts, 24), torch.Generator().manual_seed(0))
    with pytest.raises(objreg.InvalidParameterError, match="does not run on an encoder-decoder") as refused:
        objective.losses(model, batch)
    assert "\n" not in str(refused.value)


def test_analyze_refuses_clm_on_an_encoder_decoder_before_loading_it(model_dir, tmp_path):
    weightless = tmp_path / "t5"
    weightless.mkdir()
    for name in ("config.json", "tokenizer.json"):  # no weights: the refusal must not need them
        (weightless / name).write_bytes((Path(model_dir("t5")) / name).read_bytes())
    with pytest.raises(objreg.InvalidParameterError, match="'clm' \\(causal attention\\) does not run on an encoder-dec"):
        objreg.analyze(pretrain=["clm"], downstream="qa", model=str(weightless), steps=1, batch_size=2, eval_size=4,
                       seq_len=32)


def test_a_t5_style_tokenizer_plays_its_own_roles(registry, tmp_path, texts, tiny_model):
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = sorted({w for t in texts for w in t.replace(".", " .").split()})
    specials = ["<pad>", "</s>", "<unk>"]
    sentinels = [f"<extra_id_{i}>" for i in range(10)]
    vocab = {token: i for i, token in enumerate(specials + words + sentinels)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.add_special_tokens(specials + sentinels)
    backend.save(str(tmp_path / "tokenizer.json"))
    tiny_model(tmp_path, "t5", len(vocab))
    tokenizer = registry.load_tokenizer(str(tmp_path), objreg.Corpus("unused", ()), objreg.cache_dir())
    v = tokenizer.vocab
    assert (v.pad_id, v.unk_id, v.cls_id, v.sep_id) == (0, 2, 1, 1)  # <pad>, <unk>, </s> ends (and starts) rows
    assert tokenizer.tokens(list(v.sentinel_ids)) == sentinels and v.named_ids["[EOS]"] == 1
    with pytest.raises(objreg.DataError, match="^mlm needs a mask token"):
        registry.get("mlm", vocab=v)  # T5's vocabulary has none
    objective = registry.get("t5", vocab=v)
    heads = merge_heads({"t5": objective.info.heads})
    model = registry.load_model(str(tmp_path), v, heads, {}, torch.Generator().manual_seed(0))
    batch = objective.corrupt(tokenizer.batch_from_texts(texts, 24), torch.Generator().manual_seed(0))
    targets = batch.input_ids[batch.labels != objreg.IGNORE_INDEX]
    assert set(v.sentinel_ids) & set(batch.input_ids.flatten().tolist())  # T5's own sentinels mark the spans
    assert torch.isfinite(objective.losses(model, batch)).all() and targets.numel() > 0


@pytest.mark.e2e
def test_analyze_t5_and_bart_on_a_t5_directory(model_dir, tmp_path):
    args = ["analyze", "--pretrain", "t5,bart", "--downstream", "qa", "--model", model_dir("t5"), "--steps", "1",
            "--batch-size", "2", "--eval-size", "4", "--seq-len", "32",
            "--head-fit-size", "4", "--out", str(tmp_path / "run")]
    done = CliRunner().invoke(make_cli(), args)
    assert done.exit_code == 0, done.output[-2000:]
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert set(report["summary"]["alignment"]) == {"t5", "bart"}
