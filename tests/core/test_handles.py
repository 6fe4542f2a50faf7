"""How a task's rows follow the model's architecture: built with a decoder-only model's tokenizer
they carry the causal flag and the task's attention is made causal; a backbone's declared
architecture reaches the model the losses see."""

from __future__ import annotations

import copy

import pytest
import torch

import objreg
from objreg.core import handles
from objreg.core.model import ObjregModel, architecture_of


def test_a_decoder_tokenizer_makes_the_task_causal(registry, tokenizer):
    documents = [objreg.toolkit.tokenizer.split_sentences(
        "The committee met on Tuesday in Paris. It approved the budget for 2024. Rivers carry sediment to the sea.")] * 4
    task = registry.get_task("qa")
    encoder_rows = task.task_data(None, documents, tokenizer, 40, 4).batch
    decoder = copy.copy(tokenizer)
    decoder.architecture = "decoder"
    decoder_rows = task.task_data(None, documents, decoder, 40, 4).batch
    assert handles.CAUSAL not in encoder_rows.extras and decoder_rows.extras[handles.CAUSAL].all()
    assert torch.equal(decoder_rows.input_ids, encoder_rows.input_ids)  # the same rows, read causally
    assert task.attention(encoder_rows).pattern == "bidirectional"
    causal = task.attention(decoder_rows)
    assert causal.pattern == "causal"  # still structured
    assert torch.equal(causal.dense(), objreg.masks.causal(decoder_rows.is_padding))


def test_a_dense_mask_is_intersected_with_the_lower_triangle():
    mask = torch.ones(2, 4, 4, dtype=torch.bool)
    mask[1, :, 3] = False
    expected = mask & torch.ones(4, 4, dtype=torch.bool).tril()
    assert torch.equal(handles._causal(mask), expected)


def test_the_backbone_architecture_reaches_the_model():
    backbone = torch.nn.Linear(2, 2)
    backbone.hidden_size = 2
    assert ObjregModel(backbone, torch.nn.ModuleDict()).architecture == "encoder"  # none declared
    backbone.architecture = "decoder"
    assert ObjregModel(backbone, torch.nn.ModuleDict()).architecture == "decoder"
    backbone.architecture = "decoder-only"
    with pytest.raises(ValueError, match="encoder, decoder, encoder-decoder"):
        architecture_of(backbone)
