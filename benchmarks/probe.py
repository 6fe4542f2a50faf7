"""The probe's cost against one training step of the same model and batch.

    python -m benchmarks.probe [--quick] [--json] [--threads 1] [--device cuda]

For each model (random weights from its ``transformers`` config: ``bert-base`` as
``BertForMaskedLM`` with a masked-token loss, ``gpt2-small`` as ``GPT2LMHeadModel`` with a causal
LM loss written here), round-robin in one process:

* ``step_s``: one training step: forward and backward of the batch's mean loss, ``SGD.step()``.
* ``dots_s``: every example's ``⟨∇ℓ_i, ∇D⟩`` on that batch for a given ``∇D``
  (``per_sample_dots_many``, method ``auto`` as the probe picks it).
* ``grad_d_s``: ``∇D``, the downstream gradient, on an evaluation batch of the same shape.
* ``second_order_s``: ``∇D`` and ``H_D Δθ`` in one pass (``Curvature``, method ``auto``): the
  first- and second-order Taylor prediction along the update ``Δθ``.
* ``probed_step_s``: the whole probed step of a user's loop: the step plus
  ``TransferProbe.measure`` and ``finish`` (its own ``g``, the dots with ``∇D`` and ``g``,
  ``∇D``, ``H_D g``, ``D`` before and after), ``D`` evaluated in the model's dtype.
* ``in_run_ride_s``: a training step with ``InRunAlignment``'s dots riding its backward, ``∇D``
  not refreshed on it (the steps between two refreshes).
* ``in_run_refresh_s``: a training step on which ``InRunAlignment`` refreshes ``∇D`` (one gradient
  of ``D``) and rides both the fresh and the replaced one (for the staleness): every step at
  ``refresh_every = 1``.
* ``in_run_per_example_ride_s``, ``in_run_per_example_refresh_s``: the same with
  ``per_example=True`` (linear layers form their weight gradients example by example and the dots
  come out of those).

Ratios to ``step_s``: ``alignment`` = (``dots_s`` + ``grad_d_s``) / ``step_s`` (the first-order
probe), ``second_order_along_update`` = ``second_order_s`` / ``step_s``, ``probed_step`` =
``probed_step_s`` / ``step_s``; ``in_run_alignment_k1`` = ``in_run_refresh_s`` / ``step_s`` and
``in_run_alignment_k{K}`` = ((K − 1) ``in_run_ride_s`` + ``in_run_refresh_s``) / (K ``step_s``),
the in-run mode's cost per step at ``refresh_every = K`` (the default), and likewise
``in_run_per_example_k1`` and ``in_run_per_example_k{K}``. ``D`` here is the same loss on a fixed evaluation batch of the
training batch's shape (its cost is what matters; a task head would add little). Models run
with eager attention and ``position_ids`` of shape ``[B, T]``, so ghost dots apply.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.common import apply_threads, base_parser, emit, interleaved, machine, rounded
from objreg.analysis.math.curvature import Curvature
from objreg.analysis.math.functional import CallableLoss, ObjectiveFunction, requiring_grad
from objreg.analysis.math.per_sample import per_sample_dots_many
from objreg.analysis.parallel.devices import resolve_device
from objreg.analysis.probe.in_run import DEFAULT_REFRESH_EVERY, InRunAlignment
from objreg.analysis.probe.transfer_probe import TransferProbe

MODELS = ("bert-base", "gpt2-small")
PATHS = ("dots", "grad_d", "second_order", "probed_step", "in_run_ride", "in_run_refresh", "in_run_per_example_ride",
         "in_run_per_example_refresh")
#: --quick: the same architectures at a toy size.
QUICK = {"hidden_size": 64, "layers": 2, "heads": 2}


def masked_lm_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits
    token = F.cross_entropy(logits.transpose(1, 2), batch["labels"], reduction="none")
    return token.sum(1) / (batch["labels"] != -100).sum(1).clamp(min=1)


def causal_lm_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Per-example mean next-token cross-entropy."""
    logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits
    return F.cross_entropy(logits[:, :-1].transpose(1, 2), batch["input_ids"][:, 1:], reduction="none").mean(1)


def build(name: str, quick: bool) -> tuple[torch.nn.Module, Callable[..., torch.Tensor], int]:
    import transformers

    torch.manual_seed(0)
    if name == "bert-base":
        size = {"hidden_size": QUICK["hidden_size"], "num_hidden_layers": QUICK["layers"],
                "num_attention_heads": QUICK["heads"], "intermediate_size": 4 * QUICK["hidden_size"]} if quick else {}
        config = transformers.BertConfig(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                         attn_implementation="eager", **size)
        return transformers.BertForMaskedLM(config), masked_lm_loss, config.vocab_size
    size = {"n_embd": QUICK["hidden_size"], "n_layer": QUICK["layers"], "n_head": QUICK["heads"]} if quick else {}
    config = transformers.GPT2Config(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, attn_implementation="eager",
                                     **size)
    return transformers.GPT2LMHeadModel(config), causal_lm_loss, config.vocab_size


def make_batch(vocab: int, batch_size: int, seq_len: int, seed: int, device: torch.device) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, vocab, (batch_size, seq_len), generator=generator)
    labels = torch.where(torch.rand(batch_size, seq_len, generator=generator) < 0.15, ids, -100)
    labels[:, 0] = ids[:, 0]  # every row has a target
    return {"input_ids": ids.to(device), "labels": labels.to(device),
            "position_ids": torch.arange(seq_len).expand(batch_size, seq_len).contiguous().to(device)}


def measure(name: str, args: Any, device: torch.device) -> dict[str, Any]:
    model, loss_fn, vocab = build(name, args.quick)
    model.to(device).train()
    batch = make_batch(vocab, args.batch_size, args.seq_len, 1, device)
    evaluation = make_batch(vocab, args.batch_size, args.seq_len, 2, device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-6)
    shared = {n: p for n, p in model.named_parameters()}
    names = list(shared)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model, batch).mean().backward()
        optimizer.step()

    def values() -> dict[str, torch.Tensor]:
        return {n: p.detach() for n, p in shared.items()}

    objective = ObjectiveFunction(model, CallableLoss("train", loss_fn), batch, shared=names)
    downstream = ObjectiveFunction(model, CallableLoss("downstream", loss_fn), evaluation, shared=names)
    leaves = requiring_grad(values())
    direction = dict(zip(leaves, torch.autograd.grad(downstream(leaves).mean(), list(leaves.values()))))
    update = {n: -1e-6 * t for n, t in direction.items()}
    used: dict[str, str] = {}

    def dots() -> None:
        used["per_sample_method"] = per_sample_dots_many(objective, values(), [direction])[1]

    def grad_d() -> None:
        params = requiring_grad(values())
        torch.autograd.grad(downstream(params).mean(), list(params.values()))

    def second_order() -> None:
        curvature = Curvature([downstream], values())
        curvature.gradient_and_products([update])
        used["hvp_method"] = curvature.method

    probe = TransferProbe(model, {"train": loss_fn}, loss_fn, optimizer, eval_batches=[evaluation], shared=names,
                          eval_dtype=None)

    def probed_step() -> None:
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model, batch).mean().backward()
        measured = probe.measure({"train": batch})
        optimizer.step()
        probe.finish(measured)

    # In-run alignment: one that never refreshes after its first step (the steps in between), one
    # that refreshes on every step (refresh_every = 1).
    alignments = {f"in_run{infix}_{kind}": InRunAlignment(model, loss_fn, eval_batches=[evaluation],
                                                          refresh_every=every, per_example=per_example)
                  for infix, per_example in (("", False), ("_per_example", True))
                  for kind, every in (("ride", 2**62), ("refresh", 1))}

    def in_run(alignment: InRunAlignment) -> Callable[[], None]:
        def run() -> None:
            optimizer.zero_grad(set_to_none=True)
            with alignment.step():
                alignment.losses("train", loss_fn(model, batch)).mean().backward()
            optimizer.step()
            alignment.records.clear()

        return run

    paths = {"step": step, "dots": dots, "grad_d": grad_d, "second_order": second_order, "probed_step": probed_step,
             **{name: in_run(alignment) for name, alignment in alignments.items()}}
    chosen = [p for p in paths if p == "step" or p in args.paths]
    seconds = interleaved({p: paths[p] for p in chosen}, args.repeats, device)
    every = args.refresh_every
    ratio = {
        "alignment": (seconds["dots"] + seconds["grad_d"]) / seconds["step"] if "dots" in seconds else None,
        "dots_only": seconds["dots"] / seconds["step"] if "dots" in seconds else None,
        "second_order_along_update": seconds["second_order"] / seconds["step"] if "second_order" in seconds else None,
        "probed_step": seconds["probed_step"] / seconds["step"] if "probed_step" in seconds else None,
    }
    for prefix, label in (("in_run", "in_run_alignment"), ("in_run_per_example", "in_run_per_example")):
        ride, refresh = seconds.get(f"{prefix}_ride"), seconds.get(f"{prefix}_refresh")
        if ride is not None and refresh is not None:
            ratio[f"{label}_k1"] = refresh / seconds["step"]
            ratio[f"{label}_k{every}"] = ((every - 1) * ride + refresh) / (every * seconds["step"])
    ratio = {k: v for k, v in ratio.items() if v is not None}
    return {
        "model": name, "parameters": sum(p.numel() for p in shared.values()),
        "batch_size": args.batch_size, "seq_len": args.seq_len, "refresh_every": every, **used,
        "probe_per_sample_method": ",".join(sorted(probe.engine.methods_used)), "probe_hvp_method": probe.engine.hvp_method,
        "seconds": {k: rounded(v) for k, v in seconds.items()}, "ratio_to_step": {k: rounded(v, 3) for k, v in ratio.items()},
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = base_parser(__doc__.splitlines()[0], threads_default=None)
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--batch-size", type=int, default=None, help="default 4 (--quick: 8)")
    parser.add_argument("--seq-len", type=int, default=None, help="default 128 (--quick: 32)")
    parser.add_argument("--paths", default=",".join(PATHS),
                        help=f"comma-separated, of {', '.join(PATHS)} (step is always timed)")
    parser.add_argument("--refresh-every", type=int, default=DEFAULT_REFRESH_EVERY,
                        help=f"K of the in-run ratio at refresh_every = K (default {DEFAULT_REFRESH_EVERY}, the class's)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    args.batch_size = args.batch_size or (8 if args.quick else 4)
    args.seq_len = args.seq_len or (32 if args.quick else 128)
    args.repeats = args.repeats or 3
    args.paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    if set(args.paths) - set(PATHS) or args.refresh_every < 1:
        parser.error(f"--paths takes {', '.join(PATHS)}; --refresh-every a positive integer")
    apply_threads(args.threads)
    device = resolve_device(args.device)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(MODELS)}")
    start = machine(device)
    results = [measure(name, args, device) for name in models]
    result = {"machine": start, "load_average_1min_end": machine(device)["load_average_1min"],
              "repeats": args.repeats, "quick": args.quick, "models": results}
    rows = [(f"{r['model']} {k}", v) for r in results for k, v in r["ratio_to_step"].items()]
    rows += [(f"{r['model']} step_s", r["seconds"]["step"]) for r in results]
    emit(result, args.json, rows)
    return result


if __name__ == "__main__":
    main()
