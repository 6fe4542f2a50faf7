"""The training loop on a tiny model and an in-memory corpus: probes leave the trajectory alone,
and a trainer's state continues a run exactly."""

from __future__ import annotations

import copy

import pytest
import torch


def parameters(trainer):
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters()}


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_a_probed_and_an_unprobed_run_end_bit_identical(tiny_trainer, optimizer):
    every, sparse = tiny_trainer(optimizer, lr=1e-2, probe_every=1), tiny_trainer(optimizer, lr=1e-2, probe_every=100)
    every_records, sparse_records = every.run(), sparse.run()
    assert [r["step"] for r in every_records] == [0, 1, 2] and [r["step"] for r in sparse_records] == [0, 2]
    assert sparse_records == [every_records[0], every_records[-1]]
    after_every, after_sparse = parameters(every), parameters(sparse)
    assert all(torch.equal(after_every[n], after_sparse[n]) for n in after_every)
    assert not torch.equal(after_every["backbone.token_embedding.weight"],
                           parameters(tiny_trainer(optimizer))["backbone.token_embedding.weight"])  # it trained


def test_with_dropout_probes_are_deterministic_and_leave_the_trajectory_alone(tiny_trainer):
    # Dropout draws from the global generator during training steps only: probes run in eval mode
    # and draw nothing, so D after one step is D before the next, and the trajectory is the same.
    def trained(probe_every):
        trainer = tiny_trainer("adamw", lr=1e-2, probe_every=probe_every, model={"dropout": 0.3})
        torch.manual_seed(0)
        return trainer.run(), parameters(trainer)

    (every, every_params), (sparse, sparse_params) = trained(1), trained(100)
    assert all(torch.equal(every_params[n], sparse_params[n]) for n in every_params)
    assert sparse == [every[0], every[-1]]
    for before, after in zip(every, every[1:]):
        assert after["downstream_loss"] == before["downstream_loss_after"]
    without = tiny_trainer("adamw", lr=1e-2)
    without.run()
    assert not torch.equal(parameters(without)["backbone.token_embedding.weight"],
                           every_params["backbone.token_embedding.weight"])  # dropout did act


def test_the_state_dict_continues_a_run_exactly(tiny_trainer):
    whole = tiny_trainer("adamw", lr=1e-2)
    whole_records = whole.run()

    first = tiny_trainer("adamw", lr=1e-2)
    seen = []
    for step in range(2):
        seen.append(first.step(step, first.is_probed(step)))
        first.next_step = step + 1
    state = copy.deepcopy(first.state_dict())
    resumed = tiny_trainer("adamw", lr=1e-2, seed=0)
    resumed.load_state_dict(state)
    rest = resumed.run()
    assert seen + rest == whole_records
    after_whole, after_resumed = parameters(whole), parameters(resumed)
    assert all(torch.equal(after_whole[n], after_resumed[n]) for n in after_whole)
    assert resumed.probe.engine.attribution.state_dict() == whole.probe.engine.attribution.state_dict()


def test_only_the_backbone_and_the_pretraining_heads_train(tiny_trainer):
    trainer = tiny_trainer()
    names = set(trainer.trainable)
    assert any(n.startswith("backbone.") for n in names)
    assert not any(n.startswith("heads.qa.") for n in names)  # the downstream head defines D
    before = parameters(trainer)
    trainer.run()
    after = parameters(trainer)
    assert all(torch.equal(before[n], after[n]) for n in before if n.startswith("heads.qa."))


def test_an_objective_that_reads_the_model_gets_its_batch_prepared(tiny_trainer):
    # The entropy masking policy needs each token's surprisal under the current model.
    trainer = tiny_trainer(objectives=("mlm",), steps=1, mlm={"masking_policy": "entropy"})
    tokens, _ = trainer.next_batches()
    assert tokens["mlm"].surprisal is not None and torch.isfinite(tokens["mlm"].surprisal).all()
    assert trainer.run()[0]["alignment"]["mlm"]["grad_norm"] > 0
