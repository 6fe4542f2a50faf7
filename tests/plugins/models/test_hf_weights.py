"""A Hugging Face directory whose weights file is not what its config.json says is refused in one
line (missing tensors counted and named, other sizes, a truncated file), never analysed as a
randomly initialised model; ``random-init:DIR`` asks for random weights on purpose."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import objreg
from objreg.cli import make_cli
from objreg.core.registry import merge_heads

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

TEXT = "The committee met on Tuesday. It approved the budget for the new library. Members argued about the roof."


@pytest.fixture(scope="module")
def bert(tmp_path_factory) -> Path:
    """A tiny BERT directory (two layers) with its own tokenizer.json, saved as safetensors."""
    from objreg.toolkit.wordpiece import train_wordpiece

    path = tmp_path_factory.mktemp("bert")
    tokenizer = train_wordpiece([TEXT] * 20, vocab_size=200, name="tiny")
    config = transformers.BertConfig(vocab_size=tokenizer.vocab.size, hidden_size=16, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=32, max_position_embeddings=128)
    torch.manual_seed(0)
    transformers.BertModel(config, add_pooling_layer=False).save_pretrained(path)
    tokenizer.backend.save(str(path / "tokenizer.json"))
    return path


def variant(bert: Path, where: Path, change) -> Path:
    """A copy of ``bert`` whose model.safetensors ``change(tensors)`` rewrote."""
    shutil.copytree(bert, where)
    tensors = safetensors_torch.load_file(str(bert / "model.safetensors"))
    safetensors_torch.save_file(change(dict(tensors)), str(where / "model.safetensors"), metadata={"format": "pt"})
    return where


def load(path: Path | str, registry) -> objreg.ObjregModel:
    tokenizer = registry.load_tokenizer(str(path), None, Path("."))
    return registry.load_model(str(path), tokenizer.vocab, merge_heads({}), {}, torch.Generator().manual_seed(0))


def test_a_matching_directory_loads_its_own_weights(bert, registry):
    model = load(bert, registry)
    saved = safetensors_torch.load_file(str(bert / "model.safetensors"))
    own = model.backbone.model.state_dict()
    assert set(saved) <= set(own)
    for name, tensor in saved.items():
        assert torch.equal(own[name], tensor.float()), name


def test_missing_layers_are_counted_and_named(bert, registry, tmp_path):
    path = variant(bert, tmp_path / "missing", lambda t: {k: v for k, v in t.items() if ".layer.1." not in k})
    with pytest.raises(objreg.DataError) as caught:
        load(path, registry)
    text = str(caught.value)
    assert "16 of 37 backbone tensors are missing from its weights file model.safetensors" in text
    assert "encoder.layer.1." in text and "random-init:" in text and "\n" not in text


def test_the_weights_of_another_architecture_are_refused(bert, registry, tmp_path):
    path = tmp_path / "gpt2_weights"
    shutil.copytree(bert, path)
    (path / "model.safetensors").unlink()
    gpt2 = transformers.GPT2Model(transformers.GPT2Config(vocab_size=200, n_embd=16, n_layer=1, n_head=2,
                                                           n_positions=64))
    safetensors_torch.save_file({k: v.contiguous() for k, v in gpt2.state_dict().items()},
                                str(path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(objreg.DataError, match="37 of 37 backbone tensors are missing"):
        load(path, registry)


def test_other_sizes_are_refused_naming_the_tensor(bert, registry, tmp_path):
    def shrink(tensors):
        tensors["embeddings.word_embeddings.weight"] = tensors["embeddings.word_embeddings.weight"][:50].clone()
        return tensors

    path = variant(bert, tmp_path / "sizes", shrink)
    with pytest.raises(objreg.DataError) as caught:
        load(path, registry)
    assert "embeddings.word_embeddings.weight is [50, 16] in the file" in str(caught.value)
    assert "model.safetensors" in str(caught.value)


@pytest.mark.parametrize("cut", [0.5, 0.01])
def test_a_truncated_weights_file_is_one_line_naming_it(bert, registry, tmp_path, cut):
    path = tmp_path / "truncated"
    shutil.copytree(bert, path)
    data = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(data[: int(len(data) * cut)])
    with pytest.raises(objreg.DataError) as caught:
        load(path, registry)
    assert "its weights file model.safetensors cannot be read" in str(caught.value)
    assert "truncated or damaged" in str(caught.value) and "\n" not in str(caught.value)


def test_random_weights_only_when_asked_for_and_from_the_generator(bert, registry, tmp_path):
    path = variant(bert, tmp_path / "missing", lambda t: {k: v for k, v in t.items() if ".layer.1." not in k})
    asked = f"random-init:{path}"
    first, again = load(asked, registry), load(asked, registry)
    saved = safetensors_torch.load_file(str(bert / "model.safetensors"))
    weights = first.backbone.model.state_dict()
    # Random, not the file's; the same draw from the same generator seed.
    assert not torch.equal(weights["embeddings.word_embeddings.weight"], saved["embeddings.word_embeddings.weight"])
    for name, tensor in weights.items():
        assert torch.equal(tensor, again.backbone.model.state_dict()[name]), name
    state = torch.random.get_rng_state()
    load(asked, registry)
    assert torch.equal(state, torch.random.get_rng_state())  # the global generator is left as it was


def test_a_huge_tokenizer_json_is_refused_before_the_library_reads_it(bert, registry, tmp_path):
    path = tmp_path / "huge"
    shutil.copytree(bert, path)
    with open(path / "tokenizer.json", "r+b") as f:
        f.truncate(2**30)  # a sparse gigabyte: no disk used
    with pytest.raises(objreg.DataError, match="1,024 MiB is too large for a tokenizer.json"):
        registry.load_tokenizer(str(path), None, Path("."))


def test_analyze_with_a_weights_file_that_lacks_tensors_exits_in_one_line(bert, tmp_path):
    path = variant(bert, tmp_path / "missing", lambda t: {k: v for k, v in t.items() if ".layer.1." not in k})
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(f"{TEXT} Paragraph {i} ends here." for i in range(60)))
    cli = make_cli(lambda: objreg.get_plugin_manager(load_entrypoints=False))
    result = CliRunner().invoke(cli, ["analyze", "--pretrain", "mlm", "--model", str(path), "--corpus", str(corpus),
                                      "--steps", "1", "--batch-size", "2", "--seq-len", "32", "--eval-size", "4",
                                      "--head-fit-size", "8"])
    assert result.exit_code == 1, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "Traceback" not in result.output, result.stderr
    assert "16 of 37 backbone tensors are missing" in errors[0], errors[0]
