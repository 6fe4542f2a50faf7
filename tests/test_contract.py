"""Every registered objective, built-in or installed, keeps the plugin contract."""

from __future__ import annotations

import pytest
import torch

import objreg
from objreg.testing import ContractError, check_objective_contract

REGISTRY = objreg.Registry.load()


@pytest.mark.parametrize("name", REGISTRY.objectives())
def test_objective_keeps_the_contract(name):
    passed = check_objective_contract(name, registry=REGISTRY)
    assert "per-sample dots from jvp equal the per-example loop" in passed


class LeakyCausal:
    """A broken objective: claims to be causal but attends to the future, and corrupts with the
    global RNG instead of the generator it is given."""

    @objreg.hookimpl
    def objreg_objective_info(self):
        return objreg.ObjectiveInfo(name="leaky", description="broken on purpose", attention="causal",
                                    heads=(objreg.HeadSpec("lm", "lm"),))

    @objreg.hookimpl
    def objreg_corrupt(self, batch):
        noise = torch.randint(0, 2, batch.input_ids.shape)  # global RNG: not reproducible
        return objreg.CorruptedBatch(batch.input_ids, torch.where(noise.bool(), batch.input_ids, -100),
                                     batch.is_padding, torch.arange(batch.input_ids.shape[1]).expand_as(batch.input_ids),
                                     batch.document_ids, {})

    @objreg.hookimpl
    def objreg_attention_mask(self, batch):
        return objreg.masks.bidirectional(batch.is_padding)

    @objreg.hookimpl
    def objreg_loss(self, outputs, batch):
        logits = outputs.model.heads["lm"](outputs.hidden)
        losses = torch.nn.functional.cross_entropy(logits.transpose(1, 2), batch.labels, reduction="none")
        return losses.sum(1)


def test_the_suite_catches_a_broken_objective():
    pm = objreg.get_plugin_manager(load_entrypoints=False)
    pm.register(LeakyCausal(), name="leaky")
    with pytest.raises(ContractError) as error:
        check_objective_contract("leaky", registry=objreg.Registry(pm))
    message = str(error.value)
    assert "deterministic for a generator seed" in message
    assert "causal mask never attends to the future" in message
    assert isinstance(error.value, AssertionError) and isinstance(error.value, objreg.ObjregError)
