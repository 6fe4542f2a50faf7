"""Your Hugging Face ``Trainer``, objreg's probe: a small BERT pre-trained on masked-token and
next-sentence losses by ``transformers.Trainer``, probed by ``objreg.ProbeCallback`` against a
downstream task (the order of two sentences) at every ``--every``-th optimizer step.

    python examples/hf_trainer.py --out DIR [--steps 6] [--every 2] [--tensorboard]

writes DIR/steps.jsonl (one record per probed step, as it goes) and, at the end, DIR/report.json
and DIR/report.csv, in the schema of ``objreg analyze``; with ``--tensorboard`` also TensorBoard
scalars under DIR/tensorboard (``pip install 'objreg[tensorboard]'``). Needs ``pip install
'objreg[hf]'`` (transformers, accelerate, datasets). The text is objreg's default corpus,
tokenised with objreg's default tokenizer; the model is built from a ``BertConfig``. What the
callback needs from your setup is marked "the probe needs".
"""

from __future__ import annotations

import argparse
from pathlib import Path

import datasets
import torch
import torch.nn.functional as F
import transformers

import objreg

LENGTH = 32  # tokens per row: [CLS] sentence A [SEP] sentence B [SEP], padded
WEIGHTS = {"mlm": 1.0, "nsp": 0.5}  # the objectives' weights in the trainer's loss
MASKED = 4  # masked tokens per row: every row the same, so the mean over rows is the mean over tokens


def sentence_pairs(count: int, seed: int) -> list[tuple[str, str, str]]:
    """``(a, b, random)``: two consecutive sentences of a document of objreg's default corpus and a
    sentence of another document."""
    registry = objreg.Registry.load()
    documents = [d for d in registry.load_corpus("default", objreg.cache_dir()).documents if len(d) >= 2]
    generator = torch.Generator().manual_seed(seed)
    pairs = []
    for d in torch.randperm(len(documents), generator=generator)[:count].tolist():
        other = documents[(d + 1 + int(torch.randint(len(documents) - 1, (), generator=generator))) % len(documents)]
        pairs.append((documents[d][0], documents[d][1], other[0]))
    return pairs


def encode(tokenizer: objreg.Tokenizer, a: str, b: str) -> dict[str, list[int]]:
    """``[CLS] a [SEP] b [SEP]`` cut and padded to ``LENGTH``, with BERT's segment ids."""
    v = tokenizer.vocab
    ids_a, ids_b = (tokenizer.backend.encode(text, add_special_tokens=False).ids for text in (a, b))
    half = (LENGTH - 3) // 2
    ids_a, ids_b = ids_a[:half], ids_b[: LENGTH - 3 - min(len(ids_a), half)]
    ids = [v.cls_id, *ids_a, v.sep_id, *ids_b, v.sep_id]
    segments = [0] * (len(ids_a) + 2) + [1] * (len(ids_b) + 1)
    pad = LENGTH - len(ids)
    return {"input_ids": ids + [v.pad_id] * pad, "token_type_ids": segments + [0] * pad,
            "attention_mask": [1] * len(ids) + [0] * pad}


def pretraining_rows(tokenizer: objreg.Tokenizer, count: int, seed: int) -> datasets.Dataset:
    """Next-sentence pairs (half of them with a sentence of another document) with ``MASKED`` tokens
    of each row masked: the columns BERT's pre-training losses read."""
    generator = torch.Generator().manual_seed(seed + 1)
    rows = []
    for k, (a, b, other) in enumerate(sentence_pairs(count, seed)):
        row = encode(tokenizer, a, b if k % 2 == 0 else other)
        ids = torch.tensor(row["input_ids"])
        candidates = torch.nonzero(~torch.isin(ids, tokenizer.vocab.special_id_tensor())).flatten()
        masked = candidates[torch.randperm(len(candidates), generator=generator)[:MASKED]]
        labels = torch.full((LENGTH,), -100)
        labels[masked], ids[masked] = ids[masked], tokenizer.vocab.mask_id
        rows.append({**row, "input_ids": ids.tolist(), "labels": labels.tolist(), "next_sentence_label": k % 2})
    return datasets.Dataset.from_list(rows).with_format("torch")


def order_rows(tokenizer: objreg.Tokenizer, count: int, seed: int) -> dict[str, torch.Tensor]:
    """The downstream task: are two consecutive sentences in their order (0) or swapped (1)?"""
    rows = [encode(tokenizer, *((a, b) if k % 2 == 0 else (b, a))) for k, (a, b, _) in
            enumerate(sentence_pairs(count, seed))]
    batch = {key: torch.tensor([row[key] for row in rows]) for key in rows[0]}
    return {**batch, "order": torch.arange(count) % 2}


# -- the losses: per example, as the probe needs -------------------------------------------------------


def mlm_loss(model: transformers.BertForPreTraining, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """Each row's masked-token cross-entropy, averaged over its masked tokens: shape [B]."""
    out = model(input_ids=inputs["input_ids"], token_type_ids=inputs["token_type_ids"],
                attention_mask=inputs["attention_mask"])
    tokens = F.cross_entropy(out.prediction_logits.transpose(1, 2), inputs["labels"], reduction="none")
    return tokens.sum(1) / (inputs["labels"] != -100).sum(1).clamp(min=1)


def nsp_loss(model: transformers.BertForPreTraining, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    out = model(input_ids=inputs["input_ids"], token_type_ids=inputs["token_type_ids"],
                attention_mask=inputs["attention_mask"])
    return F.cross_entropy(out.seq_relationship_logits, inputs["next_sentence_label"], reduction="none")


class OrderTask:
    """The downstream loss ``D``: a linear head on the [CLS] state, fitted once before training (a
    linear probe: the head is no parameter of the model, so the probe measures on the encoder)."""

    def __init__(self, hidden: int, seed: int):
        self.head = torch.nn.Linear(hidden, 2)
        torch.nn.init.normal_(self.head.weight, std=0.02, generator=torch.Generator().manual_seed(seed))
        torch.nn.init.zeros_(self.head.bias)

    def states(self, model: transformers.BertForPreTraining, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return model.bert(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"],
                          attention_mask=batch["attention_mask"]).last_hidden_state[:, 0]

    def fit(self, model: transformers.BertForPreTraining, batch: dict[str, torch.Tensor], steps: int = 100) -> None:
        with torch.no_grad():
            states = self.states(model.eval(), batch)
        optimizer = torch.optim.Adam(self.head.parameters(), lr=0.05)
        for _ in range(steps):
            optimizer.zero_grad()
            F.cross_entropy(self.head(states), batch["order"]).backward()
            optimizer.step()
        self.head.requires_grad_(False)

    def __call__(self, model: transformers.BertForPreTraining, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Per example, shape [B] (the probe evaluates it on a float64 copy of the model)."""
        states = self.states(model, batch)
        logits = F.linear(states, self.head.weight.to(states.dtype), self.head.bias.to(states.dtype))
        return F.cross_entropy(logits, batch["order"], reduction="none")


class MultiObjectiveTrainer(transformers.Trainer):
    """The trainer's loss is Σ_k α_k mean(ℓ_k), with the per-example losses the probe is given
    (the probe needs the objectives to be the whole loss: it splits the step among them)."""

    def compute_loss(self, model, inputs, return_outputs=False, **kwargs):
        return sum(WEIGHTS[name] * fn(model, inputs).mean() for name, fn in (("mlm", mlm_loss), ("nsp", nsp_loss)))


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--every", type=int, default=2, help="probe every this many optimizer steps (and the first)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tensorboard", action="store_true", help="also write TensorBoard scalars")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> tuple[objreg.ProbeCallback, MultiObjectiveTrainer, OrderTask]:
    args = parse(argv)
    tokenizer = objreg.default_tokenizer()
    torch.manual_seed(args.seed)
    config = transformers.BertConfig(vocab_size=tokenizer.vocab.size, hidden_size=64, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=128, max_position_embeddings=LENGTH)
    model = transformers.BertForPreTraining(config)  # transformers' default attention (SDPA) is fine
    task = OrderTask(config.hidden_size, args.seed)
    task.fit(model, order_rows(tokenizer, 128, args.seed + 100))  # pairs of other documents than D's below
    training = transformers.TrainingArguments(
        output_dir=str(args.out / "trainer"), per_device_train_batch_size=args.batch_size, max_steps=args.steps,
        learning_rate=0.01, lr_scheduler_type="constant", optim="adamw_torch", weight_decay=0.0,
        report_to="none", save_strategy="no", use_cpu=True, disable_tqdm=True, seed=args.seed,
        dataloader_num_workers=0,
        # The probe needs: one compute_loss call per optimizer step, and every column the loss
        # functions read (Trainer drops the columns the model's forward() does not name otherwise).
        gradient_accumulation_steps=1, remove_unused_columns=False,
    )
    trainer = MultiObjectiveTrainer(model=model, args=training,
                                    train_dataset=pretraining_rows(tokenizer, args.batch_size * args.steps, args.seed))
    callback = objreg.ProbeCallback(
        trainer, {"mlm": mlm_loss, "nsp": nsp_loss}, task, order_rows(tokenizer, 32, args.seed + 200),
        every=args.every, weights=WEIGHTS, out_dir=args.out, tensorboard=args.tensorboard,
        downstream_name="sentence order",
    )
    trainer.train()
    summary = callback.probe.report("sentence order").summary
    for name, a in summary["alignment"].items():
        print(f"{name}: dot {a['dot']:+.4g} (95% CI {a['ci95'][0]:+.3g} to {a['ci95'][1]:+.3g}), "
              f"cosine {a['cosine']:+.4f}, update cosine {a['update_cosine']:+.4f}")
    print(f"D {summary['initial_downstream_loss']:.4f} -> {summary['final_downstream_loss']:.4f} over "
          f"{len(callback.records)} probed steps; improvement (+: D fell): predicted "
          f"{summary['predicted_improvement']:+.4g}, actual {summary['actual_improvement']:+.4g}; wrote "
          f"{args.out}/report.json")
    return callback, trainer, task


if __name__ == "__main__":
    main()
