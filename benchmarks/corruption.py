"""Corruption throughput: objreg's ``mlm`` and ``t5`` vs the Hugging Face collators, same examples.

    python -m benchmarks.corruption --json

Both sides start from the same tokenised examples (token ids of the default corpus) and end with
padded, corrupted tensors; collation is timed on both sides. objreg: ``Tokenizer.assemble`` (the
library's own collation of tokenised rows) and ``objective.corrupt``. Hugging Face:

* ``mlm`` vs ``transformers.DataCollatorForLanguageModeling`` (mlm_probability 0.15, 80/10/10)
  on ``[{"input_ids": [CLS] … [SEP]}]``, the format it is fed in HF's ``run_mlm.py``; it pads with
  the tokenizer and builds its special-tokens mask per row. Needs ``transformers`` (the optional
  ``bench`` extra); the row is skipped with a message when it is missing.
* ``t5`` vs ``DataCollatorForT5MLM``, which is not in the transformers package: it lives in HF's
  example ``examples/flax/language-modeling/run_t5_mlm_flax.py`` (class
  ``FlaxDataCollatorForT5MLM``; the PyTorch twin in ``examples/pytorch/language-modeling`` has the
  same numpy logic). :class:`HFT5SpanCorruption` below replicates that numpy logic line for line
  (``random_spans_noise_mask``, ``create_sentinel_ids``, ``filter_input_ids``,
  ``shift_tokens_right``), with ``np.bincount`` in place of ``jax.ops.segment_sum`` (same result,
  no jax; if anything it flatters HF). Like the original it needs rows of exactly the
  "expanded" length from ``compute_input_and_target_lengths``, so both sides get the same
  fixed-length rows cut from the concatenated corpus (HF's ``group_texts``); objreg frames each as
  ``[CLS] … [SEP]``.

Throughput is examples per second over ``--batches`` batches of ``--batch-size``; each side is
timed ``--repeats`` times round-robin and the median kept. ``objreg_assemble_only`` and
``objreg_corrupt_only`` time the two halves of the objreg side on their own.

``--profile`` adds what bounds the objreg side at small batches: the ATen operations one
``assemble`` and one ``corrupt`` dispatch (torch.profiler, top-level operations only), the cost
of one trivial operation on this machine (``us_per_trivial_op``: an ``add`` on a ``[B, T]``
tensor, median of 2,000), and the ceiling that op count × that cost puts on the speedup over the
Hugging Face side (``speedup_ceiling_from_op_count``), as if Python cost nothing.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import torch

import objreg
from benchmarks.common import apply_threads, base_parser, emit, interleaved, machine, rounded

# -- the Hugging Face T5 span-corruption collator, replicated --------------------------------------


def compute_input_and_target_lengths(
    inputs_length: int, noise_density: float, mean_noise_span_length: float
) -> tuple[int, int]:
    """HF run_t5_mlm_flax.py ``compute_input_and_target_lengths`` (a copy of T5's
    ``random_spans_helper``): raw tokens per row such that the corrupted input is ``inputs_length``."""

    def _tokens_length_to_inputs_length_targets_length(tokens_length: int) -> tuple[int, int]:
        num_noise_tokens = int(round(tokens_length * noise_density))
        num_nonnoise_tokens = tokens_length - num_noise_tokens
        num_noise_spans = int(round(num_noise_tokens / mean_noise_span_length))
        return num_nonnoise_tokens + num_noise_spans + 1, num_noise_tokens + num_noise_spans + 1

    tokens_length = inputs_length
    while _tokens_length_to_inputs_length_targets_length(tokens_length + 1)[0] <= inputs_length:
        tokens_length += 1
    inputs_length, targets_length = _tokens_length_to_inputs_length_targets_length(tokens_length)
    if noise_density == 0.5 and targets_length > inputs_length:
        tokens_length -= 1
        targets_length -= 1
    return tokens_length, targets_length


def shift_tokens_right(input_ids: np.ndarray, pad_token_id: int, decoder_start_token_id: int) -> np.ndarray:
    """transformers' numpy ``shift_tokens_right`` (modeling_flax_t5.py)."""
    shifted_input_ids = np.zeros_like(input_ids)
    shifted_input_ids[:, 1:] = input_ids[:, :-1]
    shifted_input_ids[:, 0] = decoder_start_token_id
    return np.where(shifted_input_ids == -100, pad_token_id, shifted_input_ids)


class HFT5SpanCorruption:
    """``FlaxDataCollatorForT5MLM.__call__`` and helpers from HF's run_t5_mlm_flax.py, same numpy
    logic (global ``np.random`` included); ``vocab_size``/``eos_token_id`` stand for its tokenizer."""

    def __init__(
        self,
        vocab_size: int,
        eos_token_id: int,
        pad_token_id: int,
        noise_density: float,
        mean_noise_span_length: float,
        input_length: int,
        target_length: int,
    ):
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        self.decoder_start_token_id = pad_token_id
        self.noise_density = noise_density
        self.mean_noise_span_length = mean_noise_span_length
        self.input_length = input_length
        self.target_length = target_length

    def __call__(self, examples: list[dict[str, list[int]]]) -> dict[str, np.ndarray]:
        batch = {k: np.array([examples[i][k] for i in range(len(examples))]) for k, v in examples[0].items()}
        input_ids = batch["input_ids"]
        batch_size, expandend_input_length = input_ids.shape
        mask_indices = np.asarray([self.random_spans_noise_mask(expandend_input_length) for i in range(batch_size)])
        labels_mask = ~mask_indices
        input_ids_sentinel = self.create_sentinel_ids(mask_indices.astype(np.int8))
        labels_sentinel = self.create_sentinel_ids(labels_mask.astype(np.int8))
        batch["input_ids"] = self.filter_input_ids(input_ids, input_ids_sentinel)
        batch["labels"] = self.filter_input_ids(input_ids, labels_sentinel)
        if batch["input_ids"].shape[-1] != self.input_length:
            raise ValueError(f"input length {batch['input_ids'].shape[-1]}, expected {self.input_length}")
        if batch["labels"].shape[-1] != self.target_length:
            raise ValueError(f"target length {batch['labels'].shape[-1]}, expected {self.target_length}")
        batch["decoder_input_ids"] = shift_tokens_right(batch["labels"], self.pad_token_id, self.decoder_start_token_id)
        return batch

    def create_sentinel_ids(self, mask_indices: np.ndarray) -> np.ndarray:
        start_indices = mask_indices - np.roll(mask_indices, 1, axis=-1) * mask_indices
        start_indices[:, 0] = mask_indices[:, 0]
        sentinel_ids = np.where(start_indices != 0, np.cumsum(start_indices, axis=-1), start_indices)
        sentinel_ids = np.where(sentinel_ids != 0, (sentinel_ids + self.vocab_size - 1), 0)
        sentinel_ids -= mask_indices - start_indices
        return sentinel_ids

    def filter_input_ids(self, input_ids: np.ndarray, sentinel_ids: np.ndarray) -> np.ndarray:
        batch_size = input_ids.shape[0]
        input_ids_full = np.where(sentinel_ids != 0, sentinel_ids, input_ids)
        input_ids = input_ids_full[input_ids_full > 0].reshape((batch_size, -1))
        return np.concatenate([input_ids, np.full((batch_size, 1), self.eos_token_id, dtype=np.int32)], axis=-1)

    def random_spans_noise_mask(self, length: int) -> np.ndarray:
        orig_length = length
        num_noise_tokens = int(np.round(length * self.noise_density))
        num_noise_tokens = min(max(num_noise_tokens, 1), length - 1)
        num_noise_spans = int(np.round(num_noise_tokens / self.mean_noise_span_length))
        num_noise_spans = max(num_noise_spans, 1)
        num_nonnoise_tokens = length - num_noise_tokens

        def _random_segmentation(num_items: int, num_segments: int) -> np.ndarray:
            mask_indices = np.arange(num_items - 1) < (num_segments - 1)
            np.random.shuffle(mask_indices)
            first_in_segment = np.pad(mask_indices, [[1, 0]])
            segment_id = np.cumsum(first_in_segment)
            return np.bincount(segment_id)  # jax.ops.segment_sum(np.ones_like(segment_id), segment_id)

        noise_span_lengths = _random_segmentation(num_noise_tokens, num_noise_spans)
        nonnoise_span_lengths = _random_segmentation(num_nonnoise_tokens, num_noise_spans)
        interleaved_span_lengths = np.reshape(
            np.stack([nonnoise_span_lengths, noise_span_lengths], axis=1), [num_noise_spans * 2]
        )
        span_starts = np.cumsum(interleaved_span_lengths)[:-1]
        span_start_indicator = np.zeros((length,), dtype=np.int8)
        span_start_indicator[span_starts] = True
        span_num = np.cumsum(span_start_indicator)
        is_noise = np.equal(span_num % 2, 1)
        return is_noise[:orig_length]


# -- the examples -----------------------------------------------------------------------------------


class Row(NamedTuple):
    """One tokenised example in the shape ``Tokenizer.assemble`` reads: a document index and its
    sentences as ``(token ids, word ids)``."""

    document: int
    sentences: tuple[tuple[list[int], list[int]], ...]


def corpus_rows(tokens: objreg.TokenizedCorpus, count: int) -> list[Row]:
    """``count`` corpus chunks (sentences of one document that fit the row), cycling if needed."""
    chunks = tokens.chunks
    return [Row(c.document, c.sentences) for c in (chunks[i % len(chunks)] for i in range(count))]


def fixed_rows(tokens: objreg.TokenizedCorpus, count: int, length: int) -> list[list[int]]:
    """HF's ``group_texts``: the corpus' token ids concatenated and cut into rows of ``length``."""
    stream = [i for c in tokens.chunks for ids, _ in c.sentences for i in ids]
    needed = count * length
    stream = (stream * (needed // max(len(stream), 1) + 1))[:needed]
    return [stream[r * length : (r + 1) * length] for r in range(count)]


def hf_tokenizer(tokenizer: objreg.Tokenizer) -> Any:
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer.backend,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )


# -- the benchmark ----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> dict[str, Any]:
    # One thread, as in a DataLoader worker (which is where corruption runs in training).
    parser = base_parser(__doc__.splitlines()[0], threads_default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batches", type=int, default=20, help="batches per timed run")
    parser.add_argument("--profile", action="store_true", help="count the ATen operations of each objreg call")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    apply_threads(args.threads)
    torch.manual_seed(0)
    np.random.seed(0)
    registry = objreg.Registry.load()
    corpus = registry.load_corpus("default", objreg.cache_dir())
    tokenizer = registry.load_tokenizer("default", corpus, objreg.cache_dir())
    tokens = objreg.TokenizedCorpus(tokenizer, corpus, args.seq_len)
    repeats = args.repeats or 5
    B, T, N = args.batch_size, args.seq_len, args.batches
    cpu = torch.device("cpu")
    result: dict[str, Any] = {
        "benchmark": "corruption",
        "machine": machine(cpu),
        "config": {"batch_size": B, "seq_len": T, "batches": N, "repeats": repeats, "vocab_size": tokenizer.vocab.size},
    }
    result["mlm"] = mlm_rows(registry, tokenizer, tokens, B, T, N, repeats, args.profile)
    result["t5"] = t5_rows(registry, tokenizer, tokens, B, T, N, repeats, args.profile)
    rows = [(f"{name}.{k}", v) for name in ("mlm", "t5") for k, v in result[name].items() if not isinstance(v, dict)]
    rows += [(f"{name}.profile.{k}", v) for name in ("mlm", "t5") for k, v in result[name].get("profile", {}).items()]
    emit(result, args.json, rows)
    return result


def mlm_rows(
    registry: objreg.Registry,
    tokenizer: objreg.Tokenizer,
    tokens: objreg.TokenizedCorpus,
    B: int,
    T: int,
    N: int,
    repeats: int,
    profile: bool = False,
) -> dict[str, Any]:
    try:
        from transformers import DataCollatorForLanguageModeling
    except ImportError:
        return {"skipped": "transformers is not installed: pip install 'objreg[bench]' (or transformers) for this row"}
    rows = corpus_rows(tokens, B * N)
    batches = [rows[i * B : (i + 1) * B] for i in range(N)]
    v = tokenizer.vocab
    hf_examples = [
        [{"input_ids": [v.cls_id] + [i for ids, _ in r.sentences for i in ids][: T - 2] + [v.sep_id]} for r in batch]
        for batch in batches
    ]
    collator = DataCollatorForLanguageModeling(hf_tokenizer(tokenizer), mlm_probability=0.15, return_tensors="pt")
    mlm = registry.get("mlm", vocab=v)
    generator = torch.Generator().manual_seed(0)

    def objreg_run() -> None:
        for batch in batches:
            mlm.corrupt(tokenizer.assemble(batch, T), generator)

    def hf_run() -> None:
        for examples in hf_examples:
            collator(examples)

    result = compare(
        objreg_run, hf_run, lambda batch: tokenizer.assemble(batch, T), mlm, batches, generator, B, repeats
    )
    if profile:
        result["profile"] = op_profile(lambda: tokenizer.assemble(batches[0], T), mlm, generator, B, result)
    return result | {"reference": "transformers.DataCollatorForLanguageModeling (mlm_probability=0.15)"}


def t5_rows(
    registry: objreg.Registry,
    tokenizer: objreg.Tokenizer,
    tokens: objreg.TokenizedCorpus,
    B: int,
    T: int,
    N: int,
    repeats: int,
    profile: bool = False,
) -> dict[str, Any]:
    if "t5" not in registry.objectives():
        return {"skipped": "no 't5' objective is registered (objreg list does not show it)"}
    v = tokenizer.vocab
    expanded, target_length = compute_input_and_target_lengths(T, 0.15, 3.0)
    rows = fixed_rows(tokens, B * N, expanded)
    batches = [rows[i * B : (i + 1) * B] for i in range(N)]
    hf_examples = [[{"input_ids": r} for r in batch] for batch in batches]
    objreg_batches = [[Row(0, ((r, None),)) for r in batch] for batch in batches]  # token ids only, as HF gets
    eos = v.named_ids.get("[EOS]", v.sep_id)
    hf = HFT5SpanCorruption(v.size, eos, v.pad_id, 0.15, 3.0, T, target_length)
    t5 = registry.get("t5", vocab=v)
    generator = torch.Generator().manual_seed(0)

    def objreg_run() -> None:
        for batch in objreg_batches:
            t5.corrupt(tokenizer.assemble(batch, expanded + 2), generator)

    def hf_run() -> None:
        for examples in hf_examples:
            hf(examples)

    def assemble(batch: list[Row]) -> objreg.TokenBatch:
        return tokenizer.assemble(batch, expanded + 2)

    result = compare(objreg_run, hf_run, assemble, t5, objreg_batches, generator, B, repeats)
    if profile:
        result["profile"] = op_profile(lambda: assemble(objreg_batches[0]), t5, generator, B, result)
    return result | {
        "raw_tokens_per_row": expanded,
        "reference": "DataCollatorForT5MLM numpy logic of HF examples/flax/language-modeling/run_t5_mlm_flax.py, "
        "replicated in benchmarks/corruption.py",
    }


def compare(
    objreg_run: Callable[[], None],
    hf_run: Callable[[], None],
    assemble: Callable[[list[Row]], objreg.TokenBatch],
    objective: objreg.Objective,
    batches: list[list[Row]],
    generator: torch.Generator,
    B: int,
    repeats: int,
) -> dict[str, Any]:
    """Both sides end to end, and objreg's two halves on their own, timed round-robin."""
    prepared = [assemble(batch) for batch in batches]

    def assemble_only() -> None:
        for batch in batches:
            assemble(batch)

    def corrupt_only() -> None:
        for batch in prepared:
            objective.corrupt(batch, generator)

    paths = {
        "objreg": objreg_run,
        "hf": hf_run,
        "objreg_assemble_only": assemble_only,
        "objreg_corrupt_only": corrupt_only,
    }
    times = interleaved(paths, repeats, torch.device("cpu"))
    examples = B * len(batches)
    return {
        "objreg_examples_per_s": rounded(examples / times["objreg"]),
        "hf_examples_per_s": rounded(examples / times["hf"]),
        "speedup": rounded(times["hf"] / times["objreg"]),
        "objreg_assemble_only_examples_per_s": rounded(examples / times["objreg_assemble_only"]),
        "objreg_corrupt_only_examples_per_s": rounded(examples / times["objreg_corrupt_only"]),
        "corrupt_only_speedup": rounded(times["hf"] / times["objreg_corrupt_only"]),
    }


def top_level_ops(run: Callable[[], Any]) -> int:
    """ATen operations ``run`` dispatches, not counting those called inside other operations."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run()
    aten = [e for e in prof.events() if e.name.startswith("aten::")]
    return sum(1 for e in aten if e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))


def trivial_op_us(B: int, T: int, count: int = 2000) -> float:
    """Median microseconds of one ``add`` on a ``[B, T]`` long tensor: the dispatch cost every
    operation pays, however small its tensors."""
    x = torch.zeros(B, T, dtype=torch.long)
    times = []
    for _ in range(count):
        start = time.perf_counter()
        x.add(1)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def op_profile(
    assemble: Callable[[], objreg.TokenBatch],
    objective: objreg.Objective,
    generator: torch.Generator,
    B: int,
    measured: dict[str, Any],
) -> dict[str, Any]:
    """Operation counts of one batch and the speedup ceiling they imply at this batch size."""
    batch = assemble()
    assemble_ops = top_level_ops(assemble)
    corrupt_ops = top_level_ops(lambda: objective.corrupt(batch, generator))
    per_op = trivial_op_us(*batch.input_ids.shape)
    hf_batch_us = B / measured["hf_examples_per_s"] * 1e6
    objreg_batch_us = B / measured["objreg_examples_per_s"] * 1e6
    return {
        "assemble_ops": assemble_ops,
        "corrupt_ops": corrupt_ops,
        "us_per_trivial_op": rounded(per_op),
        "objreg_us_per_batch": rounded(objreg_batch_us),
        "us_per_op_measured": rounded(objreg_batch_us / (assemble_ops + corrupt_ops)),
        "hf_us_per_batch": rounded(hf_batch_us),
        "speedup_ceiling_from_op_count": rounded(hf_batch_us / ((assemble_ops + corrupt_ops) * per_op)),
    }


if __name__ == "__main__":
    main()
