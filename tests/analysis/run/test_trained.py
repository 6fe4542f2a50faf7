"""The trained backbone a run leaves in RUN/model: a transformers directory with the weights the
run trained, the source's tokenizer and its config as it was; objreg finetune reads it and checks
its evaluation rows against the run's pre-training text."""

from __future__ import annotations

import json

import pytest
import torch

import objreg
from objreg.analysis.run.prepare import build_model
from objreg.analysis.run.trained import resolve, save_backbone

transformers = pytest.importorskip("transformers")


def test_saved_backbone_reloads_with_the_same_weights(tiny_bert, tmp_path, registry):
    tokenizer = registry.load_tokenizer(str(tiny_bert), None, objreg.cache_dir())
    mlm = registry.get("mlm", vocab=tokenizer.vocab)
    model = build_model(registry, str(tiny_bert), tokenizer.vocab, {"mlm": mlm.info.heads}, 0)
    with torch.no_grad():
        for p in model.backbone.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))  # "trained"
    saved = save_backbone(model, tmp_path)
    reloaded = transformers.AutoModel.from_pretrained(saved, add_pooling_layer=False)  # objreg saves no pooler
    ours = dict(model.backbone.model.named_parameters())
    for name, value in reloaded.named_parameters():
        assert torch.equal(value, ours[name]), name
    assert reloaded.config.hidden_dropout_prob == pytest.approx(0.1)  # as the source had it, not the analysis' 0
    assert json.loads((saved / "tokenizer.json").read_text()) == json.loads((tiny_bert / "tokenizer.json").read_text())
    # objreg's own --model reads it too, to the same weights.
    again = build_model(registry, str(saved), tokenizer.vocab, {"mlm": mlm.info.heads}, 0)
    for name, value in again.backbone.model.named_parameters():
        assert torch.equal(value, ours[name]), name


def test_continued_pre_training_then_finetune(tiny_bert, sentiment_tsv, tmp_path, registry):
    corpus = tmp_path / "domain.txt"
    corpus.write_text("Rivers carry sediment to the sea. Deltas form where the current slows down.\n\n"
                      "Bees collect nectar from flowers and store honey in wax cells.\n\n"
                      "The orchestra played a symphony and the audience applauded for minutes.\n")
    run = tmp_path / "run"
    objreg.analyze(["mlm"], "classification", model=str(tiny_bert), corpus=str(corpus),
                   downstream_data=str(sentiment_tsv), steps=2, batch_size=2, seq_len=32, eval_size=8, head_fit_size=8,
                   optimizer="adamw", lr=1e-3, out_dir=str(run), registry=registry)
    assert (run / "model" / "config.json").is_file() and (run / "model" / "model.safetensors").is_file()
    trained = transformers.AutoModel.from_pretrained(run / "model")
    start = transformers.AutoModel.from_pretrained(tiny_bert)
    moved = [name for (name, a), (_, b) in zip(trained.named_parameters(), start.named_parameters())
             if not torch.equal(a, b)]
    assert moved, "the saved backbone is the untrained one"
    source = resolve(str(run))
    assert source.model == str(run / "model") and source.run["pretrain"] == ["mlm"]
    report = objreg.finetune(str(run), "classification", str(sentiment_tsv), folds=2, seq_len=32, registry=registry,
                             schedule=objreg.FineTuneSchedule(epochs=1, batch_size=8))
    assert report.pretraining["pretrain"] == ["mlm"] and report.model == str(run / "model")

    # Evaluation rows inside the run's pre-training text: refused before any fine-tuning.
    leaky = tmp_path / "leaky.txt"
    leaky.write_text("\n\n".join(line.split("\t")[0] for line in sentiment_tsv.read_text().splitlines()[1:]) + "\n")
    other = tmp_path / "other.tsv"
    other.write_text("sentence\tlabel\nrivers carry sediment to the sea far away from here\t1\n"
                     "bees collect nectar from flowers in the warm morning\t0\n" * 3)
    leaky_run = tmp_path / "leaky-run"
    objreg.analyze(["mlm"], "classification", model=str(tiny_bert), corpus=str(leaky), downstream_data=str(other),
                   steps=1, batch_size=2, seq_len=32, eval_size=2, head_fit_size=2, out_dir=str(leaky_run),
                   registry=registry)
    with pytest.raises(objreg.DataError, match="evaluation rows of .* are in the pre-training text"):
        objreg.finetune(str(leaky_run), "classification", str(sentiment_tsv), folds=2, seq_len=32, registry=registry)


def test_a_model_directory_is_not_mistaken_for_a_run(tiny_bert):
    assert resolve(str(tiny_bert)).run is None and resolve("default").model == "default"


def test_the_command_line_says_where_the_model_is(tiny_bert, sentiment_tsv, tmp_path):
    from click.testing import CliRunner

    from objreg.cli import make_cli

    corpus = tmp_path / "domain.txt"
    corpus.write_text("Rivers carry sediment to the sea. Deltas form where the current slows down.\n")
    run = tmp_path / "run"
    result = CliRunner().invoke(make_cli(lambda: objreg.get_plugin_manager(load_entrypoints=False)), [
        "analyze", "--pretrain", "mlm", "--downstream", "classification", "--model", str(tiny_bert), "--corpus",
        str(corpus), "--downstream-data", str(sentiment_tsv), "--steps", "1", "--batch-size", "2", "--seq-len", "32",
        "--eval-size", "8", "--head-fit-size", "8", "--out", str(run)])
    assert result.exit_code == 0, result.output
    assert "and the trained model in model/" in result.stdout and (run / "model" / "config.json").is_file()
