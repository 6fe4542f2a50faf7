"""Every registered objective, built-in or installed, keeps the plugin contract."""

from __future__ import annotations

import pytest
import torch

import objreg
import objreg.testing
from objreg.testing import ContractError, check_objective_contract

REGISTRY = objreg.Registry.load()


@pytest.mark.parametrize("name", REGISTRY.objectives())
def test_objective_keeps_the_contract(name):
    passed = check_objective_contract(name, registry=REGISTRY)
    # The paths objreg analyze runs are among the checks, not only the reference ones.
    assert "per-sample dots by jvp equal the per-example loop" in passed
    assert any(label.startswith("per-sample dots as objreg analyze takes them") for label in passed)
    assert "HVPs by the analyzer's auto path equal double backward" in passed
    if not REGISTRY.info(name).batch_coupled:
        assert "per-sample dots by ghost equal the per-example loop" in passed
        assert "a row's loss does not depend on the other rows of the batch" in passed


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


class Base:
    """A correct bidirectional objective to derive broken or v2 variants from."""

    name = "base"
    coupled = False

    @objreg.hookimpl
    def objreg_objective_info(self):
        return objreg.ObjectiveInfo(name=self.name, description="for the contract tests", heads=(objreg.HeadSpec("lm", "lm"),),
                                    params=(objreg.Param("scale", 1.0, "a loss hyper-parameter", float, 0.0, None),),
                                    batch_coupled=self.coupled)

    @objreg.hookimpl
    def objreg_corrupt(self, batch, generator):
        keep = torch.rand(batch.input_ids.shape, generator=generator) < 0.5
        labels = torch.where(keep & ~batch.is_special, batch.input_ids, objreg.IGNORE_INDEX)
        return objreg.CorruptedBatch(batch.input_ids.clone(), labels, batch.is_padding.clone(),
                                     objreg.masks.positions_within_documents(batch.document_ids),
                                     batch.document_ids.clone(), {})

    @objreg.hookimpl
    def objreg_attention_mask(self, batch):
        return objreg.AttentionMask.bidirectional(batch.is_padding, batch.document_ids)

    @objreg.hookimpl
    def objreg_loss(self, outputs, batch, params):
        logits = outputs.model.heads["lm"](outputs.hidden)
        nll, labelled = objreg.toolkit.losses.token_nll(logits, batch.labels)
        return params["scale"] * nll.sum(1) / labelled.sum(1).clamp(min=1)


class Coupled(Base):
    """Each row's loss also counts the batch mean: rows interact, and it does not say so."""

    name = "coupled"

    @objreg.hookimpl
    def objreg_loss(self, outputs, batch, params):
        own = Base.objreg_loss(self, outputs, batch, params)
        return own + own.mean()


class DeclaredCoupled(Coupled):
    name = "declared"
    coupled = True


class Raising(Base):
    name = "raising"

    @objreg.hookimpl
    def objreg_loss(self, outputs, batch):
        raise RuntimeError("this loss is broken")


def registry_with(*plugins):
    import objreg.toolkit.losses  # noqa: F401 - the stand-ins use it

    pm = objreg.get_plugin_manager(load_entrypoints=False)
    for plugin in plugins:
        pm.register(plugin, name=plugin.name)
    return objreg.Registry(pm)


def test_a_v2_plugin_reads_its_loss_hyper_parameter_from_params():
    registry = registry_with(Base())
    passed = check_objective_contract("base", registry=registry, params={"scale": 3.0})
    assert "a row's loss does not depend on the other rows of the batch" in passed
    tokenizer = objreg.testing.sample_tokenizer(objreg.testing.SAMPLE_TEXTS)
    batch = tokenizer.batch_from_texts(list(objreg.testing.SAMPLE_TEXTS), 32)
    model = registry.load_model("default", tokenizer.vocab, [objreg.HeadSpec("lm", "lm")],
                                dict(objreg.testing.TINY_MODEL), torch.Generator().manual_seed(0))
    losses = {}
    for scale in (1.0, 3.0):
        objective = registry.get("base", vocab=tokenizer.vocab, scale=scale)
        corrupted = objective.corrupt(batch, torch.Generator().manual_seed(0))
        losses[scale] = objective.losses(model, corrupted).detach()
    torch.testing.assert_close(losses[3.0], 3.0 * losses[1.0])


def test_rows_that_interact_without_saying_so_fail_with_a_message_that_says_so():
    with pytest.raises(ContractError) as error:
        check_objective_contract("coupled", registry=registry_with(Coupled()))
    message = str(error.value)
    assert "a row's loss does not depend on the other rows of the batch" in message
    assert "rows interact" in message and "batch_coupled=True" in message
    # Declared, the same loss passes: per-example quantities are then taken on the whole batch.
    passed = check_objective_contract("declared", registry=registry_with(DeclaredCoupled()))
    assert "per-sample dots by jvp equal the per-example loop" in passed


def test_a_hook_that_raises_is_reported_as_a_failed_check():
    with pytest.raises(ContractError) as error:
        check_objective_contract("raising", registry=registry_with(Raising()))
    assert "raised RuntimeError: this loss is broken" in str(error.value)


class HostMasked(Base):
    """Base without a mask hook: the host builds the bidirectional mask it declares."""

    name = "host_masked"
    objreg_attention_mask = None


class WrongPrefix(Base):
    """Declares prefix attention, and its own hook returns a bidirectional mask."""

    name = "wrong_prefix"

    @objreg.hookimpl
    def objreg_objective_info(self):
        return objreg.ObjectiveInfo(name=self.name, description="broken on purpose", attention="prefix",
                                    heads=(objreg.HeadSpec("lm", "lm"),), params=Base().objreg_objective_info().params)


def test_the_host_s_mask_passes_and_a_hook_that_contradicts_the_declaration_fails():
    registry = registry_with(HostMasked(), WrongPrefix())
    assert not registry.get("host_masked").describes_attention
    passed = check_objective_contract("host_masked", registry=registry, quick=True)
    assert {"a structured mask has the pattern the objective declares", "the mask never attends to padding"} <= set(passed)
    with pytest.raises(ContractError) as error:
        check_objective_contract("wrong_prefix", registry=registry, quick=True)
    assert error.value.problems == [
        "objective 'wrong_prefix' (registered at run time) failed: a structured mask has the pattern the objective "
        "declares: ObjectiveInfo.attention is 'prefix', the mask is 'bidirectional'"
    ]
