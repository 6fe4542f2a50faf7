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


class Prefixed:
    """A prefix objective without a mask hook: the host builds its mask from the declaration."""

    @objreg.hookimpl
    def objreg_objective_info(self):
        return objreg.ObjectiveInfo(name="prefixed", description="host-built prefix mask", attention="prefix")

    @objreg.hookimpl
    def objreg_corrupt(self, batch):
        extras = {"prefix_length": torch.tensor([2, 0])} if batch.input_ids.shape[1] == 4 else {}
        return objreg.CorruptedBatch(batch.input_ids, batch.input_ids, batch.is_padding, batch.word_ids,
                                     batch.document_ids, extras)

    @objreg.hookimpl
    def objreg_loss(self, outputs, batch):
        return outputs.hidden.sum(dim=(1, 2))


def test_the_host_builds_a_declared_prefix_mask_from_the_batch_s_prefix_lengths():
    pm = objreg.get_plugin_manager(load_entrypoints=False, builtins=False)
    pm.register(Prefixed(), name="prefixed")
    vocab = objreg.Vocabulary(size=10, pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4, special_ids=(0, 1, 2, 3, 4))
    objective = objreg.Registry(pm).get("prefixed", vocab=vocab)
    assert not objective.describes_attention

    def rows(T: int) -> objreg.TokenBatch:
        padding = torch.zeros(2, T, dtype=torch.bool)
        padding[1, -1] = True
        ids = torch.full((2, T), 5).masked_fill(padding, 0)
        documents = torch.zeros(2, T, dtype=torch.long).masked_fill(padding, -1)
        return objreg.TokenBatch(ids, padding, padding.clone(), documents, documents, documents)

    batch = objective.corrupt(rows(4), torch.Generator())
    described = objective.attention(batch)
    assert described.pattern == "prefix" and described.prefix_length.tolist() == [2, 0]
    # Row 0: keys 0 and 1 (the prefix) seen by every query, the rest causally; row 1: causal, and its
    # padding (document -1) neither seen nor seeing.
    expected = [[[1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]],
                [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0]]]
    assert objective.attention_mask(batch).int().tolist() == expected
    without = objective.corrupt(rows(5), torch.Generator())
    with pytest.raises(objreg.PluginError) as error:
        objective.attention(without)
    assert error.value.problems == [
        "pretrain 'prefixed' (registered at run time) declares prefix attention, but its batch has no "
        "extras['prefix_length'] (each row's prefix length, [B] long) to build the mask from: put it there, or "
        "implement objreg_attention_mask"
    ]
