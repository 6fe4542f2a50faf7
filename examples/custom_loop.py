"""Your training loop, objreg's probe: a Hugging Face encoder (built from a config) trained on two
objectives, ``mlm`` and ``sop``, in a plain PyTorch loop, probed at every step against ``qa``.

    python examples/custom_loop.py --steps 3 --out DIR [--model MODEL_DIR] [--optimizer adam]

writes DIR/steps.jsonl (one record per step, as it goes) and, at the end, DIR/report.json,
DIR/report.csv and the plots, in the schema of ``objreg analyze``; with ``--tensorboard`` also
TensorBoard scalars under DIR/tensorboard. Without ``--model`` a small BERT is built from a
``BertConfig`` and saved to DIR/model.

The data, the objectives' corruption and the downstream head are objreg's (the same setup as
``objreg analyze --model MODEL_DIR``, so the two runs can be compared record for record); the
loop and the probe are the part you would write around your own model: the probe is attached to
the optimizer (it measures as the optimizer steps), and the loop hands it each step's batches
with ``probe.observe`` between the backward and ``optimizer.step()``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import objreg

#: Small enough for seconds on a CPU. The downstream head is re-fitted at every probe, as
#: ``objreg analyze`` does by default: the probe is given the head's parameters and the fit set.
SMALL = {"batch_size": 4, "seq_len": 32, "eval_size": 16, "head_fit_size": 64}


def build_model_dir(path: Path) -> Path:
    """A small BERT with random weights, saved with objreg's default tokenizer."""
    import transformers

    tokenizer = objreg.default_tokenizer()
    config = transformers.BertConfig(vocab_size=tokenizer.vocab.size, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)
    path.mkdir(parents=True, exist_ok=True)
    transformers.BertModel(config).save_pretrained(path)
    tokenizer.backend.save(str(path / "tokenizer.json"))
    return path


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model", type=Path, default=None, help="a Hugging Face model directory")
    parser.add_argument("--optimizer", choices=("sgd", "adam", "adamw"), default="sgd")
    parser.add_argument("--lr", type=float, default=0.005)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--tensorboard", action="store_true", help="also write TensorBoard scalars")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> objreg.AlignmentReport:
    args = parse(argv)
    model_dir = args.model or build_model_dir(args.out / "model")
    config = objreg.AnalysisConfig(pretrain=("mlm", "sop"), downstream="qa", model=str(model_dir), steps=args.steps,
                                   optimizer=args.optimizer, lr=args.lr, seed=args.seed, dtype=args.dtype,
                                   device="cpu", **SMALL)
    # objreg's setup: the model (the Hugging Face encoder plus the objectives' heads and the fitted
    # downstream head), the objectives, the data streams and the optimizer.
    setup, report_config = objreg.prepare(config, objreg.Registry.load(), objreg.cache_dir())
    model, objectives, optimizer = setup.model, setup.objectives, setup.optimizer
    weights = {name: 1.0 for name in objectives}
    evaluation = setup.probe.downstream  # D: the evaluation set, and the fit set the head is re-fitted on
    probe = objreg.make_probe(model, evaluation.task, objectives=objectives, optimizer=optimizer,
                              eval_batches=evaluation.batch, refit_head=list(evaluation.head),
                              fit_batches=evaluation.fit_set.batch, weights=weights, shared=list(setup.shared),
                              settings=objreg.ProbeSettings(seed=args.seed), steps=args.steps)
    writer = objreg.RunWriter(args.out)
    writer.start_steps()
    scalars = objreg.TensorBoardScalars(args.out / "tensorboard") if args.tensorboard else None

    def keep(record: dict) -> None:  # each finished record, as it comes
        writer.append_step(record)
        if scalars is not None:
            scalars.add(record)

    probe.attach(optimizer, every=1, on_record=keep)

    for step in range(args.steps):
        _, batches = setup.next_batches()  # one corrupted batch per objective
        model.train()
        optimizer.zero_grad(set_to_none=True)
        loss = sum(weights[name] * objective.losses(model, batches[name],
                                                     objective.attention_mask(batches[name])).mean()
                   for name, objective in objectives.items())
        loss.backward()
        probe.observe(batches)  # after the backward, before the step
        optimizer.step()  # the probe measures before it and reads Δθ and D again after it
        record = probe.records[-1]
        # Improvements, as the report gives them: positive where D fell.
        print(f"step {step}: loss {loss.item():.4f}, improvement of D: predicted "
              f"{-record['predicted_delta']['first_order']:+.3e} (first order), actual {-record['actual_delta']:+.3e}")

    report = probe.report("qa", report_config)
    writer.write_report(report)
    if scalars is not None:
        scalars.close()
    return report


if __name__ == "__main__":
    main()
