"""The probe inside ``transformers.Trainer.train()``: a tiny BERT trained on masked-token and
next-sentence losses, its records checked against a per-example loop in float64 at the
parameters the trainer actually had, and its trajectory against an unprobed run."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

import objreg

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

VOCAB, LENGTH, BATCH, STEPS = 40, 8, 4, 4
WEIGHTS = {"mlm": 1.0, "nsp": 0.5}


def tiny_bert():
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=16, max_position_embeddings=16, hidden_dropout_prob=0.0,
                                     attention_probs_dropout_prob=0.0, attn_implementation="eager")
    return transformers.BertForPreTraining(config).double()


def examples(count, seed):
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(count):
        ids = torch.randint(5, VOCAB, (LENGTH,), generator=generator)
        labels = torch.full((LENGTH,), -100)
        masked = torch.randperm(LENGTH, generator=generator)[:2]
        labels[masked], ids[masked] = ids[masked], 4
        rows.append({"input_ids": ids, "attention_mask": torch.ones(LENGTH, dtype=torch.long), "labels": labels,
                     "next_sentence_label": torch.randint(2, (), generator=generator)})
    return rows


def mlm_loss(model, inputs):
    out = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
    token = F.cross_entropy(out.prediction_logits.transpose(1, 2), inputs["labels"], reduction="none")
    counted = (inputs["labels"] != -100).sum(1).clamp(min=1)
    return token.sum(1) / counted


def nsp_loss(model, inputs):
    out = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
    return F.cross_entropy(out.seq_relationship_logits, inputs["next_sentence_label"], reduction="none")


TASK_HEAD = torch.randn(8, 3, generator=torch.Generator().manual_seed(7), dtype=torch.float64)


def task_loss(model, batch):
    hidden = model.bert(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    return F.cross_entropy(hidden[:, 0] @ TASK_HEAD, batch["y"], reduction="none")


EVAL = {"input_ids": torch.randint(5, VOCAB, (6, LENGTH), generator=torch.Generator().manual_seed(3)),
        "attention_mask": torch.ones(6, LENGTH, dtype=torch.long), "y": torch.tensor([0, 1, 2, 0, 1, 2])}


class MultiObjectiveTrainer(transformers.Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, **kwargs):
        return WEIGHTS["mlm"] * mlm_loss(model, inputs).mean() + WEIGHTS["nsp"] * nsp_loss(model, inputs).mean()


class Snapshots(transformers.TrainerCallback):
    """The parameters before and after every optimizer step, and each step's batch."""

    def __init__(self):
        self.before, self.after = [], []

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.before.append({n: p.detach().clone() for n, p in model.named_parameters()})

    def on_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.after.append({n: p.detach().clone() for n, p in model.named_parameters()})


def run(tmp_path, probe_options=None, optim="sgd"):
    model = tiny_bert()
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "trainer"), per_device_train_batch_size=BATCH, max_steps=STEPS, learning_rate=0.05,
        lr_scheduler_type="constant", optim=optim, max_grad_norm=0.1, report_to="none", save_strategy="no",
        use_cpu=True, disable_tqdm=True, seed=0, dataloader_num_workers=0)
    trainer = MultiObjectiveTrainer(model=model, args=args, train_dataset=examples(BATCH * STEPS, 1))
    snapshots = Snapshots()
    trainer.add_callback(snapshots)
    seen = []
    original = trainer.compute_loss
    trainer.compute_loss = lambda m, inputs, *a, **k: (seen.append(inputs), original(m, inputs, *a, **k))[1]
    callback = None
    if probe_options is not None:
        callback = objreg.ProbeCallback(trainer, {"mlm": mlm_loss, "nsp": nsp_loss}, task_loss, EVAL,
                                        weights=WEIGHTS, downstream_name="toy", **probe_options)
    trainer.train()
    return model, callback, snapshots, seen


def per_example_dots(model, params, losses, inputs, grad_d, shared):
    model.load_state_dict(params, strict=False)
    dots = []
    for i in range(inputs["input_ids"].shape[0]):
        row = {k: v[i:i + 1] for k, v in inputs.items()}
        grads = torch.autograd.grad(losses(model, row)[0], [dict(model.named_parameters())[n] for n in shared],
                                    allow_unused=True)
        dots.append(sum((g * grad_d[n]).sum() for g, n in zip(grads, shared) if g is not None))
    return torch.stack(dots)


def downstream_at(model, params, shared):
    model.load_state_dict(params, strict=False)
    loss = task_loss(model, EVAL).mean()
    grads = torch.autograd.grad(loss, [dict(model.named_parameters())[n] for n in shared], allow_unused=True)
    return float(loss.detach()), {n: torch.zeros_like(params[n]) if g is None else g for n, g in zip(shared, grads)}


@pytest.mark.e2e
def test_trainer_records_match_a_float64_per_example_loop(tmp_path):
    model, callback, snapshots, seen = run(tmp_path, {"every": 2, "out_dir": tmp_path / "probe"})
    assert [r["step"] for r in callback.records] == [0, 2]
    shared = list(callback.probe.shared_parameters)
    # D reaches the encoder only; the pre-training heads (the tied decoder is the embedding) are out.
    assert shared and all(n.startswith("bert.") and "pooler" not in n for n in shared)
    checker = tiny_bert()
    for record in callback.records:
        t = record["step"]
        d_before, grad_d = downstream_at(checker, snapshots.before[t], shared)
        d_after, _ = downstream_at(checker, snapshots.after[t], shared)
        assert record["downstream_loss"] == pytest.approx(d_before, rel=1e-12)
        assert record["actual_delta"] == pytest.approx(d_after - d_before, rel=1e-8)
        delta = {n: snapshots.after[t][n] - snapshots.before[t][n] for n in shared}
        assert record["predicted_delta"]["first_order"] == pytest.approx(
            float(sum((grad_d[n] * delta[n]).sum() for n in shared)), rel=1e-8)
        for name, losses in (("mlm", mlm_loss), ("nsp", nsp_loss)):
            dots = per_example_dots(checker, snapshots.before[t], losses, seen[t], grad_d, shared)
            assert record["alignment"][name]["dot"] == pytest.approx(float(dots.mean()), rel=1e-8)
            assert record["alignment"][name]["conflict_fraction"] == pytest.approx(float((dots < 0).double().mean()))
        # The parts of the clipped SGD step (max_grad_norm=0.1 clips every step here) add up to the
        # step read off the parameters.
        assert record["update"]["decomposition_residual"] < 1e-9
        assert record["weights"] == WEIGHTS
    written = json.loads((tmp_path / "probe" / "report.json").read_text())
    assert written["downstream"] == "toy" and len(written["steps"]) == 2
    assert len((tmp_path / "probe" / "steps.jsonl").read_text().splitlines()) == 2
    assert (tmp_path / "probe" / "report.csv").exists()


@pytest.mark.e2e
def test_probing_leaves_the_trainer_trajectory_bit_identical(tmp_path):
    plain, _, plain_snapshots, _ = run(tmp_path / "plain", None, optim="adamw_torch")
    probed, callback, snapshots, _ = run(tmp_path / "probed", {"every": 3}, optim="adamw_torch")
    assert [r["step"] for r in callback.records] == [0, 3]
    assert all(r["update"]["attribution"] == "shapley" for r in callback.records)
    for a, b in zip(plain_snapshots.after, snapshots.after):
        assert all(torch.equal(a[n], b[n]) for n in a)


def test_gradient_accumulation_is_refused(tmp_path):
    args = transformers.TrainingArguments(output_dir=str(tmp_path), gradient_accumulation_steps=2, use_cpu=True,
                                          report_to="none")
    trainer = MultiObjectiveTrainer(model=tiny_bert(), args=args, train_dataset=examples(4, 1))
    with pytest.raises(objreg.InvalidParameterError, match="gradient_accumulation_steps=1"):
        objreg.ProbeCallback(trainer, {"mlm": mlm_loss}, task_loss, EVAL)
