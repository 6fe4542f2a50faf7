"""What a plugin author sees: a loss that calls ``.item()`` fails the contract suite as a listed
check, ``objreg analyze`` warns in one line before training a third-party objective that fails
the cheap checks, and ``objreg corrupt`` shows class targets as numbers, token ids as tokens."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

import objreg
from objreg.cli import make_cli
from objreg.cli.corrupt import label_kind
from objreg.testing import ContractError, check_objective_contract, contract_problems, is_third_party
from objreg.toolkit import losses

SMALL = ["--steps", "1", "--batch-size", "4", "--seq-len", "48", "--eval-size", "8",
         "--json"]


class ItemLoss:
    """A masked LM whose loss calls ``.item()``: fine in eager mode, not under ``vmap``."""

    @objreg.hookimpl
    def objreg_objective_info(self):
        return objreg.ObjectiveInfo(name="itemloss", description="calls .item() in its loss",
                                    heads=(objreg.HeadSpec("lm", "lm"),))

    @objreg.hookimpl
    def objreg_corrupt(self, batch, generator, vocab):
        chosen = (torch.rand(batch.input_ids.shape, generator=generator) < 0.3) & ~batch.is_special
        return objreg.CorruptedBatch(torch.where(chosen, vocab.mask_id, batch.input_ids),
                                     torch.where(chosen, batch.input_ids, objreg.IGNORE_INDEX),
                                     batch.is_padding.clone(), objreg.masks.positions_within_documents(batch.document_ids),
                                     batch.document_ids.clone(), {})

    @objreg.hookimpl
    def objreg_attention_mask(self, batch):
        return objreg.AttentionMask.bidirectional(batch.is_padding, batch.document_ids)

    @objreg.hookimpl
    def objreg_loss(self, outputs, batch):
        nll, labelled = losses.token_nll(outputs.model.heads["lm"](outputs.hidden), batch.labels)
        scale = 1.0 if nll.sum().item() >= 0 else -1.0  # the bug
        return scale * nll.sum(1) / labelled.sum(1).clamp(min=1)


class Replaced(ItemLoss):
    """Per-token class targets (1: replaced, 0: kept), as an ELECTRA-style discriminator has."""

    label_kind = "auto"

    @objreg.hookimpl
    def objreg_objective_info(self):
        return objreg.ObjectiveInfo(name="replaced", description="which tokens were replaced",
                                    heads=(objreg.HeadSpec("lm", "lm"),), label_kind=self.label_kind)

    @objreg.hookimpl
    def objreg_corrupt(self, batch, generator, vocab):
        chosen = (torch.rand(batch.input_ids.shape, generator=generator) < 0.3) & ~batch.is_special
        return objreg.CorruptedBatch(torch.where(chosen, vocab.unk_id, batch.input_ids),
                                     torch.where(batch.is_padding, objreg.IGNORE_INDEX, chosen.long()),
                                     batch.is_padding.clone(), objreg.masks.positions_within_documents(batch.document_ids),
                                     batch.document_ids.clone(), {})


class DeclaredClasses(Replaced):
    label_kind = "classes"


def manager_with(*plugins):
    def manager():
        pm = objreg.get_plugin_manager(load_entrypoints=False)
        for name, plugin in plugins:
            pm.register(plugin, name=name)
        return pm

    return manager


def test_item_in_a_loss_is_a_listed_failed_check_with_what_to_change():
    registry = objreg.Registry(manager_with(("itemloss", ItemLoss()))())
    with pytest.raises(ContractError) as error:
        check_objective_contract("itemloss", registry=registry)
    message = str(error.value)
    assert "objective 'itemloss' (registered at run time) failed: per-sample dots by vmap: raised RuntimeError" in message
    assert "no .item()" in message and "docs/hooks.md" in message
    passed, problems = contract_problems("itemloss", registry, quick=True)
    assert problems and passed  # the other checks still ran
    assert is_third_party(registry, "itemloss") and not is_third_party(registry, "mlm")


def test_analyze_warns_in_one_line_before_training_a_third_party_objective_that_breaks_the_contract():
    cli = make_cli(manager_with(("itemloss", ItemLoss())))
    result = CliRunner().invoke(cli, ["analyze", "--pretrain", "itemloss", *SMALL], catch_exceptions=False)
    assert result.exit_code == 0, result.output  # it still runs: ghost dots do not go through vmap
    (warning,) = [line for line in result.stderr.splitlines() if line.startswith("Warning:")]
    assert warning.startswith("Warning: objective 'itemloss' (registered at run time) fails")
    assert "check(s) of the plugin contract" in warning and "per-sample dots by vmap" in warning
    assert "check_objective_contract('itemloss')" in warning
    json.loads(result.stdout)


def test_analyze_does_not_check_built_ins():
    cli = make_cli(manager_with())
    result = CliRunner().invoke(cli, ["analyze", "--pretrain", "mlm", *SMALL[:-1]], catch_exceptions=False)
    assert result.exit_code == 0
    assert "plugin contract" not in result.stderr


@pytest.mark.parametrize("plugin", [Replaced(), DeclaredClasses()], ids=["inferred", "declared"])
def test_corrupt_shows_class_targets_as_numbers(plugin):
    cli = make_cli(manager_with(("replaced", plugin)))
    text = "The committee approved the budget for the new library."
    shown = CliRunner().invoke(cli, ["corrupt", "replaced", "--text", text, "--seed", "1"])
    assert shown.exit_code == 0, shown.output
    assert "label (class)" in shown.stdout
    cells = [line.split("│") for line in shown.stdout.splitlines() if line.startswith("│")]
    labels = {row[4].strip() for row in cells}
    assert labels <= {"0", "1", "·"} and {"0", "1"} <= labels  # not [PAD] / [UNK], the tokens of ids 0 and 1
    data = json.loads(CliRunner().invoke(cli, ["corrupt", "replaced", "--text", text, "--json"]).stdout)
    assert data["label_kind"] == "classes"
    assert {label for label in data["rows"][0]["labels"] if label is not None} <= {0, 1}


def test_token_labels_stay_tokens():
    cli = make_cli(manager_with())
    data = json.loads(CliRunner().invoke(cli, ["corrupt", "mlm", "--text", "The fox saw the grapes.",
                                               "--param", "mask_prob=0.5", "--json"]).stdout)
    assert data["label_kind"] == "tokens"
    assert all(isinstance(label, str) for label in data["rows"][0]["labels"] if label is not None)


def test_label_kind_from_the_values():
    vocab = objreg.default_tokenizer().vocab
    ignore = objreg.IGNORE_INDEX
    assert label_kind("auto", torch.tensor([[ignore, 0, 1, 0]]), vocab) == "classes"
    assert label_kind("auto", torch.tensor([[ignore, 0, 1, 2000]]), vocab) == "tokens"
    assert label_kind("auto", torch.tensor([[ignore, ignore]]), vocab) == "tokens"
    assert label_kind("tokens", torch.tensor([[0, 1]]), vocab) == "tokens"
    with pytest.raises(objreg.InvalidParameterError, match="label_kind must be one of"):
        objreg.ObjectiveInfo(name="x", description="x", label_kind="words")
