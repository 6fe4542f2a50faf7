"""Decoder-only causal LMs (GPT-2, Llama built from configs): the architecture read from the
directory, the causal stack against transformers' own forward, objectives and tasks on it, per-sample
dots against a loop in float64, and the GPT-2-style byte-level BPE tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import objreg
from objreg.analysis.math.functional import ObjectiveFunction, detached, shared_parameters
from objreg.analysis.math.per_sample import dots_loop, per_sample_dots
from objreg.cli import make_cli
from objreg.core.registry import merge_heads
from objreg.toolkit import hf_directory

transformers = pytest.importorskip("transformers")


def tokenizer_of(registry, directory):
    return registry.load_tokenizer(directory, objreg.Corpus("unused", ()), objreg.cache_dir())


def load(registry, directory, names):
    tokenizer = tokenizer_of(registry, directory)
    heads = merge_heads({n: registry.info(n).heads for n in names})
    model = registry.load_model(directory, tokenizer.vocab, heads, {}, torch.Generator().manual_seed(0))
    return tokenizer, model


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_causal_mask_equals_the_model_own_causal_forward(registry, model_dir, family, texts):
    tokenizer, model = load(registry, model_dir(family), ("clm",))
    assert model.architecture == model.backbone.architecture == tokenizer.architecture == "decoder"
    assert model.backbone.model.config._attn_implementation == "eager"
    objective = registry.get("clm", vocab=tokenizer.vocab)
    batch = objective.corrupt(tokenizer.batch_from_texts(texts, None), torch.Generator().manual_seed(0))
    model.eval()
    with torch.no_grad():
        ours = model.encode(batch.input_ids, objective.attention(batch), batch.position_ids)
        theirs = model.backbone.model(input_ids=batch.input_ids,
                                      attention_mask=(~batch.is_padding).long()).last_hidden_state
        bidirectional = model.encode(batch.input_ids, objreg.masks.bidirectional(batch.is_padding), batch.position_ids)
    real = ~batch.is_padding
    assert batch.is_padding.any()
    torch.testing.assert_close(ours[real], theirs[real], rtol=1e-5, atol=1e-5)
    # The model runs the mask it is given: a bidirectional one changes every state but the last.
    assert not torch.allclose(bidirectional[real], theirs[real], atol=1e-3)


@pytest.mark.parametrize(("family", "name"), [("gpt2", "clm"), ("gpt2", "fim"), ("gpt2", "ul2"), ("llama", "clm"),
                                              ("llama", "prefix_lm")])
def test_per_sample_dots_equal_a_loop_in_float64(registry, model_dir, family, name, texts, dots_auto_and_loop):
    tokenizer, model = load(registry, model_dir(family), (name,))
    model = model.double()
    objective = registry.get(name, vocab=tokenizer.vocab)
    batch = objective.corrupt(tokenizer.batch_from_texts(texts, 24), torch.Generator().manual_seed(0))
    auto, _, loop = dots_auto_and_loop(model, objective, batch)
    assert auto.shape == (3,) and (loop.abs() > 0).all()
    torch.testing.assert_close(auto, loop, rtol=1e-9, atol=1e-9 * float(loop.abs().max()))


@pytest.mark.parametrize("task", ["qa", "classification", "token_classification"])
def test_tasks_run_causally_on_a_decoder(registry, model_dir, task, texts):
    tokenizer = tokenizer_of(registry, model_dir("gpt2"))
    documents = [objreg.toolkit.tokenizer.split_sentences(t) for t in texts * 3]
    handle = registry.get_task(task)
    data = handle.task_data(None, documents, tokenizer, 48, 6)
    batch = data.batch
    assert batch.extras["causal"].all()
    mask = handle.attention_mask(batch)
    T = batch.input_ids.shape[1]
    assert not (mask & ~torch.ones(T, T, dtype=torch.bool).tril()).any()  # no query sees a later key
    assert torch.equal(mask, objreg.masks.causal(batch.is_padding) & handle.attention_mask(
        batch._replace(extras={k: v for k, v in batch.extras.items() if k != "causal"})))
    # The same rows built with an encoder's tokenizer run bidirectionally.
    tokenizer.architecture = "encoder"
    assert "causal" not in handle.task_data(None, documents, tokenizer, 48, 6).batch.extras


def test_classification_reads_the_last_real_token_on_a_decoder(registry, model_dir, texts):
    tokenizer = tokenizer_of(registry, model_dir("gpt2"))
    documents = [objreg.toolkit.tokenizer.split_sentences(t) for t in texts * 3]
    task = registry.get_task("classification")
    data = task.task_data(None, documents, tokenizer, 48, 6)
    model = registry.load_model(model_dir("gpt2"), tokenizer.vocab, list(data.heads), {},
                                torch.Generator().manual_seed(0)).double()
    batch = data.batch
    losses = task.losses(model, batch)
    # Independently: the classifier on the causal hidden state of each row's last real token.
    hidden = model.encode(batch.input_ids, objreg.masks.causal(batch.is_padding), batch.position_ids)
    last = (~batch.is_padding).sum(1) - 1
    logits = model.heads["classification"](hidden[torch.arange(batch.batch_size), last][:, None])
    expected = torch.nn.functional.cross_entropy(logits, batch.extras["label"], reduction="none")
    assert batch.is_padding.any()  # rows differ in length, so "last" is not one column
    torch.testing.assert_close(losses, expected, rtol=1e-12, atol=1e-12)


def test_byte_level_bpe_tokenizer_plays_every_role_with_endoftext(registry, gpt2_bpe_dir, texts):
    tokenizer = tokenizer_of(registry, gpt2_bpe_dir)
    vocab = tokenizer.vocab
    eot = tokenizer.backend.token_to_id("<|endoftext|>")
    assert (vocab.cls_id, vocab.sep_id, vocab.pad_id, vocab.unk_id) == (eot, eot, eot, eot)
    assert vocab.named_ids == {"[EOS]": eot} and vocab.sentinel_ids == ()
    assert tokenizer.architecture == "decoder"
    # No mask token of its own: objectives that insert one are refused, with the fix.
    for name in ("mlm", "bart"):
        with pytest.raises(objreg.DataError, match=f"^{name} needs a mask token.*add_tokens"):
            registry.get(name, vocab=vocab)
    batch = tokenizer.batch_from_texts(texts, None)
    assert tokenizer.decode(batch.input_ids[0]).startswith("The committee met")


def test_byte_level_bpe_clm_and_causal_qa_dots_equal_a_loop_in_float64(registry, gpt2_bpe_dir, texts):
    tokenizer = tokenizer_of(registry, gpt2_bpe_dir)
    documents = [objreg.toolkit.tokenizer.split_sentences(t) for t in texts * 3]
    task = registry.get_task("qa")
    data = task.task_data(None, documents, tokenizer, 48, 4)
    objective = registry.get("clm", vocab=tokenizer.vocab)
    heads = merge_heads({"clm": objective.info.heads, "qa": data.heads})
    model = registry.load_model(gpt2_bpe_dir, tokenizer.vocab, heads, {}, torch.Generator().manual_seed(0)).double()
    shared = detached(shared_parameters(model))
    g = torch.Generator().manual_seed(1)
    direction = {n: torch.randn(t.shape, generator=g, dtype=t.dtype) for n, t in shared.items()}
    batch = objective.corrupt(tokenizer.batch_from_texts(texts, 24), torch.Generator().manual_seed(0))
    assert data.batch.extras["causal"].all()
    for function in (ObjectiveFunction(model, objective, batch), ObjectiveFunction(model, task, data.batch)):
        auto, _ = per_sample_dots(function, shared, direction, "auto")
        loop = dots_loop(function, shared, direction)
        assert (loop.abs() > 0).all()
        torch.testing.assert_close(auto, loop, rtol=1e-9, atol=1e-9 * float(loop.abs().max()))


def test_fim_is_refused_before_the_model_loads_and_the_fix_works(registry, gpt2_bpe_dir, tmp_path, texts):
    # A directory whose weights cannot load: the refusal comes from the vocabulary alone.
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in ("config.json", "tokenizer.json"):
        (broken / name).write_bytes((Path(gpt2_bpe_dir) / name).read_bytes())
    tokenizer = tokenizer_of(registry, str(broken))
    with pytest.raises(objreg.DataError) as refused:
        registry.get("fim", vocab=tokenizer.vocab)
    message = str(refused.value)
    assert "\n" not in message and "[FIM_PREFIX]" in message and "resize_token_embeddings" in message
    # The fix the message gives: add the markers, resize, save; then fim runs.
    fixed = tmp_path / "fixed"
    backend = tokenizer.backend
    markers = ["[FIM_PREFIX]", "[FIM_MIDDLE]", "[FIM_SUFFIX]"]
    backend.add_special_tokens(markers)
    fixed.mkdir()
    backend.save(str(fixed / "tokenizer.json"))
    model = transformers.AutoModel.from_pretrained(gpt2_bpe_dir)
    model.resize_token_embeddings(backend.get_vocab_size())
    model.save_pretrained(fixed)
    tokenizer, model = load(registry, str(fixed), ("fim",))
    objective = registry.get("fim", vocab=tokenizer.vocab)
    assert [tokenizer.vocab.named_ids[m] for m in markers] == [backend.token_to_id(m) for m in markers]
    batch = objective.corrupt(tokenizer.batch_from_texts(texts, 24), torch.Generator().manual_seed(0))
    assert torch.isfinite(objective.losses(model, batch)).all()


def test_architecture_is_read_from_the_config(model_dir, tmp_path):
    assert hf_directory.architecture(Path(model_dir("gpt2"))) == "decoder"
    assert hf_directory.architecture(Path(model_dir("t5"))) == "encoder-decoder"
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    assert hf_directory.architecture(tmp_path) == "encoder"


def analyze(directory: str, pretrain: str, out: Path):
    """``objreg analyze`` in this process, tiny: one step, two rows a batch, four evaluation rows."""
    args = ["analyze", "--pretrain", pretrain, "--downstream", "qa", "--model", directory, "--steps", "1",
            "--batch-size", "2", "--eval-size", "4", "--seq-len", "32",
            "--head-fit-size", "4", "--out", str(out)]
    return CliRunner().invoke(make_cli(), args)


@pytest.mark.e2e
def test_analyze_clm_fim_qa_on_gpt2_with_a_bert_tokenizer(model_dir, tmp_path):
    done = analyze(model_dir("gpt2"), "clm,fim", tmp_path / "run")
    assert done.exit_code == 0, done.output[-2000:]
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert set(report["summary"]["alignment"]) == {"clm", "fim"}


@pytest.mark.e2e
def test_analyze_on_gpt2_with_a_byte_level_bpe_tokenizer(gpt2_bpe_dir, tmp_path):
    done = analyze(gpt2_bpe_dir, "clm", tmp_path / "run")
    assert done.exit_code == 0, done.output[-2000:]
    assert set(json.loads((tmp_path / "run" / "report.json").read_text())["summary"]["alignment"]) == {"clm"}
    refused = analyze(gpt2_bpe_dir, "clm,fim", tmp_path / "refused")
    errors = [line for line in refused.stderr.splitlines() if line.startswith("Error")]
    assert refused.exit_code == 1 and "Traceback" not in refused.output
    assert len(errors) == 1 and "fim needs [FIM_PREFIX]" in errors[0] and "add_tokens" in errors[0]
    assert "building model" not in refused.stderr  # refused before the model is loaded
