"""Every built-in downstream task keeps the task contract (objreg.testing.check_task_contract), and
a task broken on purpose, one per check, fails it with a message naming the task, the check and
what was found."""

from __future__ import annotations

import pytest
import torch

import objreg
from objreg.testing import ContractError, check_task_contract
from objreg.toolkit import losses

REGISTRY = objreg.Registry.load()


def test_the_four_built_in_tasks_are_checked():
    assert {"classification", "ordering", "qa", "token_classification"} <= set(REGISTRY.tasks())


@pytest.mark.parametrize("name", REGISTRY.tasks())
def test_task_keeps_the_contract(name):
    passed = check_task_contract(name, registry=REGISTRY)
    for label in (
        "task_data is deterministic: the same inputs give the same TaskData, whatever the global RNG",
        "the heads are the declared ones, sized from the data where their kind needs a size",
        "the loss reads only heads ObjectiveInfo.heads declares",
        "per-sample losses are finite and [B]",
        "per-example losses under vmap equal the plain call",
        "per-sample dots by jvp equal the per-example loop",
        "HVPs by the analyzer's auto path equal double backward",
        "the mask never attends to padding",
        "changing the padded tokens does not change the loss",  # run only where the data has padding
    ):
        assert label in passed, label


class Parity:
    """A correct task, the tutorial's: is a sentence's word count even or odd? Its classifier is
    sized from the data; the host builds its bidirectional mask."""

    name = "parity"

    @objreg.hookimpl
    def objreg_objective_info(self):
        return objreg.ObjectiveInfo(name=self.name, description="broken on purpose", kind="downstream",
                                    heads=(objreg.HeadSpec("parity", "classifier"),))

    @objreg.hookimpl
    def objreg_task_data(self, documents, tokenizer, seq_len, limit):
        sentences = [s for document in documents for s in document][:limit]
        tokens = tokenizer.batch_from_texts(sentences, seq_len)
        batch = objreg.CorruptedBatch(
            tokens.input_ids, torch.full_like(tokens.input_ids, objreg.IGNORE_INDEX), tokens.is_padding,
            objreg.masks.positions_within_documents(tokens.document_ids), tokens.document_ids,
            {"label": self.labels(sentences)},
        )
        return self.task_data(batch)

    def labels(self, sentences):
        return torch.tensor([len(s.split()) % 2 for s in sentences])

    def task_data(self, batch):
        return objreg.TaskData(batch, (objreg.HeadSpec("parity", "classifier", 2),))

    @objreg.hookimpl
    def objreg_loss(self, outputs, batch):
        return losses.class_nll(outputs.model.heads["parity"](outputs.hidden), batch.extras["label"])  # (B,)


class GlobalRandom(Parity):
    name = "global_random"

    def labels(self, sentences):
        return torch.randint(0, 2, (len(sentences),))  # the global RNG: another set on every call


class Unsized(Parity):
    name = "unsized"

    def task_data(self, batch):
        return batch  # a plain batch keeps the declared head, which has no size


class UndeclaredHead(Parity):
    name = "undeclared_head"

    @objreg.hookimpl
    def objreg_loss(self, outputs, batch):
        return losses.class_nll(outputs.model.heads["lm"](outputs.hidden)[:, 0], batch.extras["label"])


class DividesByTheBatch(Parity):
    name = "divides_by_the_batch"

    @objreg.hookimpl
    def objreg_loss(self, outputs, batch):
        own = losses.class_nll(outputs.model.heads["parity"](outputs.hidden), batch.extras["label"])
        return own / batch.input_ids.shape[0]  # a mean's 1/B inside each row's loss


class CallsItem(Parity):
    name = "calls_item"

    @objreg.hookimpl
    def objreg_loss(self, outputs, batch):
        own = losses.class_nll(outputs.model.heads["parity"](outputs.hidden), batch.extras["label"])
        return own * (2.0 if own.sum().item() > 0 else 1.0)  # Python branching on a tensor's value


class AttendsPadding(Parity):
    name = "attends_padding"

    @objreg.hookimpl
    def objreg_attention_mask(self, batch):
        B, T = batch.input_ids.shape
        return torch.ones(B, T, T, dtype=torch.bool)  # padding keys too

    @objreg.hookimpl
    def objreg_loss(self, outputs, batch):
        return outputs.hidden[:, 0].square().mean(dim=1)  # [CLS]'s state, which sees the padding


class ReadsPadding(Parity):
    name = "reads_padding"

    @objreg.hookimpl
    def objreg_loss(self, outputs, batch):
        return outputs.hidden.square().mean(dim=(1, 2))  # every position, padded ones too


def failures(plugin) -> list[str]:
    pm = objreg.get_plugin_manager(load_entrypoints=False)
    pm.register(plugin, name=plugin.name)
    with pytest.raises(ContractError) as error:
        check_task_contract(plugin.name, registry=objreg.Registry(pm))
    assert isinstance(error.value, AssertionError)
    where = f"task {plugin.name!r} (registered at run time) failed: "
    assert all(problem.startswith(where) for problem in error.value.problems)
    return [problem.removeprefix(where) for problem in error.value.problems]


def test_the_correct_task_passes():
    pm = objreg.get_plugin_manager(load_entrypoints=False)
    pm.register(Parity(), name="parity")
    passed = check_task_contract("parity", registry=objreg.Registry(pm))
    assert "changing the padded tokens does not change the loss" in passed


def test_task_data_that_follows_the_global_rng_fails():
    (problem,) = failures(GlobalRandom())
    assert problem.startswith("task_data is deterministic: the same inputs give the same TaskData, whatever the "
                              "global RNG: two calls with the same inputs differ: extras['label']")


def test_a_head_without_a_size_fails():
    (problem,) = failures(Unsized())
    assert problem == ("the heads are the declared ones, sized from the data where their kind needs a size: head "
                       "'parity' (classifier) has no size: return it sized from the data in TaskData.heads, e.g. "
                       "HeadSpec('parity', 'classifier', number_of_classes)")


def test_a_loss_that_reads_an_undeclared_head_fails():
    (problem,) = failures(UndeclaredHead())
    assert problem.startswith("the loss reads only heads ObjectiveInfo.heads declares: it reads model.heads['lm'], "
                              "which is not declared (declared: 'parity')")


def test_a_loss_that_changes_with_the_batch_size_fails():
    problems = failures(DividesByTheBatch())
    assert [p.split(":")[0] for p in problems] == [
        "a row's loss does not depend on the other rows of the batch",
        "per-example losses under vmap equal the plain call",
        "per-sample dots by vmap equal the per-example loop",  # vmap(grad) takes each row alone too
    ]
    assert "a row's loss changes when it is the only one" in problems[1]


def test_a_loss_that_is_not_transform_safe_fails_with_what_to_change():
    problems = failures(CallsItem())
    (vmapped,) = [p for p in problems if p.startswith("per-example losses under vmap: raised")]
    assert "no .item(), no Python branching on tensor values" in vmapped


def test_a_mask_that_attends_padding_fails():
    problems = failures(AttendsPadding())
    (masked,) = [p for p in problems if p.startswith("the mask never attends to padding: ")]
    assert "the first in row 0: query 0 attends padded key" in masked
    (changed,) = [p for p in problems if p.startswith("changing the padded tokens does not change the loss: ")]
    assert "the mask lets a real token attend padding, or the loss reads padded positions" in changed


def test_a_loss_that_reads_padded_positions_fails():
    (problem,) = failures(ReadsPadding())  # its mask, the host's, is right
    assert problem.startswith("changing the padded tokens does not change the loss: max abs difference")


class TooLong(Parity):
    name = "too_long"

    @objreg.hookimpl
    def objreg_task_data(self, documents, tokenizer, seq_len, limit):
        return Parity.objreg_task_data(self, documents * 2, tokenizer, seq_len, 2 * limit)  # twice the rows it may


class SizesAnUndeclaredHead(Parity):
    name = "sizes_an_undeclared_head"

    def task_data(self, batch):
        return objreg.TaskData(batch, (objreg.HeadSpec("parity", "classifier", 2), objreg.HeadSpec("extra", "span")))


def test_task_data_beyond_limit_or_seq_len_fails():
    (problem,) = failures(TooLong())
    assert problem.startswith("task_data gives at most limit rows of at most seq_len tokens, fields [B, T] and extras "
                              "with B first: 16 rows of")
    assert "tokens for limit 8 and seq_len 48; fields [(16, " in problem and "extras {'label': (16,)}" in problem


def test_task_data_that_sizes_an_undeclared_head_fails():
    (problem,) = failures(SizesAnUndeclaredHead())
    assert problem.startswith("task_data: raised PluginError")
    assert "sized heads ['extra'] its ObjectiveInfo does not declare from objreg_task_data" in problem
