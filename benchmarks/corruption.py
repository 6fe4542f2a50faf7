"""Corruption throughput: every objreg objective that has a reference, against it, on the same examples.

    python -m benchmarks.corruption --json --batch-size 256 --seq-len 512

Both sides start from the same tokenised examples of the default corpus and end with padded,
corrupted tensors; collation is timed on both sides. objreg: ``Tokenizer.assemble`` (its collation
of tokenised rows) and ``objective.corrupt``. The references (``benchmarks/references.py`` for
those that are not an installable package):

* ``mlm`` vs ``transformers.DataCollatorForLanguageModeling`` (mlm_probability 0.15, 80/10/10) on
  ``[{"input_ids": [CLS] … [SEP]}]``, the format ``run_mlm.py`` feeds it;
* ``clm`` vs the same collator with ``mlm=False`` (labels = the ids, padding -100);
* ``wwm`` vs the same collator with ``whole_word_mask=True``, on examples carrying
  ``offset_mapping`` and ``special_tokens_mask`` (pre-padded to the batch's length, as the collator
  cannot pad offsets); objreg gets the same examples' word ids;
* ``t5`` vs Hugging Face's T5 span-corruption collator (``FlaxDataCollatorForT5MLM``'s numpy
  logic), on fixed-length rows cut from the concatenated corpus (HF's ``group_texts``);
* ``bart`` vs fairseq's ``DenoisingDataset`` noise, row by row, then padded (BART-large recipe:
  mask 0.3 Poisson(3) whole-word spans, 10% random, replace_length 1, sentence permutation 1.0);
* ``rtd`` vs ELECTRA's ``mask`` and ``sample_from_softmax``: selection and ``[MASK]`` on both sides,
  then one sample per masked position from the same random generator logits ``[B, K, V]``
  (objreg: ``rtd.sample_replacements``, inverse CDF; ELECTRA: Gumbel-max).

objreg gets exactly the information the reference gets: token ids only (word ids as ``None``)
for ``mlm``, ``clm``, ``t5`` and ``rtd``, word ids for ``wwm``, sentences and word ids for ``bart``
(fairseq finds sentences at full stops and words from the vocabulary). Throughput is examples per
second over ``--batches`` batches of ``--batch-size``; the paths run round-robin, ``--repeats``
rounds, medians kept. ``objreg_assemble_only`` and ``objreg_corrupt_only`` time the two halves of
the objreg side on their own.

``--profile`` adds, per objective, the ATen operations one ``assemble`` and one ``corrupt``
dispatch (torch.profiler, top-level operations only), the cost of one trivial operation
(``us_per_trivial_op``: an ``add`` on a ``[B, T]`` tensor), and the speedup ceiling that op count
times that cost puts on the objreg side.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

import objreg
from benchmarks.common import apply_threads, base_parser, emit, interleaved, machine, rounded
from benchmarks.references import (
    ElectraMasking,
    FairseqDenoising,
    HFT5SpanCorruption,
    compute_input_and_target_lengths,
)

#: The objectives with a reference, in the order of the report.
OBJECTIVES = ("mlm", "clm", "wwm", "t5", "bart", "rtd")


# -- the examples -----------------------------------------------------------------------------------


class Row(NamedTuple):
    """One tokenised example in the shape ``Tokenizer.assemble`` reads: a document index and its
    sentences as ``(token ids, word ids or None)``."""

    document: int
    sentences: tuple[tuple[list[int], list[int] | None], ...]


def corpus_rows(tokens: objreg.TokenizedCorpus, count: int) -> list[Row]:
    """``count`` corpus chunks (sentences of one document that fit the row), cycling if needed."""
    chunks = tokens.chunks
    return [Row(c.document, c.sentences) for c in (chunks[i % len(chunks)] for i in range(count))]


#: Give objreg one word per token explicitly instead of ``None`` (``--word-ids``): the same batch,
#: for code that predates id-only rows (to measure a base commit with this harness).
EXPLICIT_WORD_IDS = False


def id_only(ids: list[int]) -> tuple[list[int], list[int] | None]:
    return ids, (list(range(len(ids))) if EXPLICIT_WORD_IDS else None)


def id_rows(rows: list[Row], length: int | None = None) -> list[Row]:
    """The same examples as token ids only (one run of ids per row, word ids ``None``), cut to
    ``length`` content tokens when given: what a reference collator gets."""
    out = []
    for r in rows:
        ids = [i for s, _ in r.sentences for i in s]
        out.append(Row(r.document, (id_only(ids if length is None else ids[:length]),)))
    return out


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


def framed(tokenizer: objreg.Tokenizer, row: Row, T: int) -> list[int]:
    """``[CLS] ids [SEP]`` of a row, truncated to ``T`` as ``Tokenizer.assemble`` truncates."""
    v = tokenizer.vocab
    return [v.cls_id] + [i for ids, _ in row.sentences for i in ids][: T - 2] + [v.sep_id]


# -- one comparison ---------------------------------------------------------------------------------


@dataclass
class Case:
    """One objective against its reference on ``batches`` of examples.

    Attributes:
        objective: The objreg objective.
        reference: What the reference is.
        batches: objreg's examples, batch by batch.
        seq_len: The ``seq_len`` objreg's ``assemble`` frames them to.
        inputs: The reference's examples, batch by batch, in its own format.
        reference_run: One reference batch.
        after: What objreg does after ``corrupt`` to match the reference's output (rtd's sampling).
    """

    objective: objreg.Objective
    reference: str
    batches: list[list[Row]]
    seq_len: int
    inputs: list[Any]
    reference_run: Callable[[Any], Any]
    after: Callable[[objreg.CorruptedBatch, int], Any] | None = None


def run_case(case: Case, generator: torch.Generator, B: int, repeats: int, tokenizer: objreg.Tokenizer,
             profile: bool = False) -> dict[str, Any]:
    """Both sides end to end, and objreg's two halves on their own, timed round-robin."""
    T = case.seq_len
    prepared = [tokenizer.assemble(batch, T) for batch in case.batches]
    after = case.after or (lambda corrupted, i: corrupted)

    def objreg_run() -> None:
        for i, batch in enumerate(case.batches):
            after(case.objective.corrupt(tokenizer.assemble(batch, T), generator), i)

    def reference_run() -> None:
        for example in case.inputs:
            case.reference_run(example)

    def assemble_only() -> None:
        for batch in case.batches:
            tokenizer.assemble(batch, T)

    def corrupt_only() -> None:
        for i, batch in enumerate(prepared):
            after(case.objective.corrupt(batch, generator), i)

    paths = {"objreg": objreg_run, "reference": reference_run, "objreg_assemble_only": assemble_only,
             "objreg_corrupt_only": corrupt_only}
    times = interleaved(paths, repeats, torch.device("cpu"))
    examples = B * len(case.batches)
    result: dict[str, Any] = {
        "objreg_examples_per_s": rounded(examples / times["objreg"]),
        "reference_examples_per_s": rounded(examples / times["reference"]),
        "speedup": rounded(times["reference"] / times["objreg"]),
        "objreg_assemble_only_examples_per_s": rounded(examples / times["objreg_assemble_only"]),
        "objreg_corrupt_only_examples_per_s": rounded(examples / times["objreg_corrupt_only"]),
        "corrupt_only_speedup": rounded(times["reference"] / times["objreg_corrupt_only"]),
        "padded_shape": list(prepared[0].input_ids.shape),
        "reference": case.reference,
    }
    if profile:
        result["profile"] = op_profile(lambda: tokenizer.assemble(case.batches[0], T), case.objective, generator,
                                       B, result)
    return result


# -- the cases --------------------------------------------------------------------------------------


def build_case(name: str, registry: objreg.Registry, tokenizer: objreg.Tokenizer, tokens: objreg.TokenizedCorpus,
               B: int, T: int, N: int) -> Case:
    v = tokenizer.vocab
    objective = registry.get(name, vocab=v)
    if name == "t5":
        expanded, target_length = compute_input_and_target_lengths(T, 0.15, 3.0)
        rows = fixed_rows(tokens, B * N, expanded)
        batches = [[Row(0, (id_only(r),)) for r in rows[i * B : (i + 1) * B]] for i in range(N)]
        inputs = [[{"input_ids": r} for r in rows[i * B : (i + 1) * B]] for i in range(N)]
        eos = v.named_ids.get("[EOS]", v.sep_id)
        hf = HFT5SpanCorruption(v.size, eos, v.pad_id, 0.15, 3.0, T, target_length)
        return Case(objective, "Hugging Face's T5 span-corruption collator (FlaxDataCollatorForT5MLM numpy logic, "
                    "benchmarks/references.py), on group_texts rows of the same ids", batches, expanded + 2, inputs, hf)
    rows = corpus_rows(tokens, B * N)
    chunks = [rows[i * B : (i + 1) * B] for i in range(N)]
    if name in ("mlm", "clm"):
        from transformers import DataCollatorForLanguageModeling

        batches = [id_rows(chunk) for chunk in chunks]
        inputs = [[{"input_ids": framed(tokenizer, r, T)} for r in chunk] for chunk in chunks]
        if name == "mlm":
            collator = DataCollatorForLanguageModeling(hf_tokenizer(tokenizer), mlm_probability=0.15)
            what = "transformers.DataCollatorForLanguageModeling (mlm_probability 0.15, 80/10/10)"
        else:
            collator = DataCollatorForLanguageModeling(hf_tokenizer(tokenizer), mlm=False)
            what = "transformers.DataCollatorForLanguageModeling (mlm=False)"
        return Case(objective, what, batches, T, inputs, collator)
    if name == "wwm":
        from transformers import DataCollatorForLanguageModeling

        collator = DataCollatorForLanguageModeling(hf_tokenizer(tokenizer), whole_word_mask=True, mlm_probability=0.15,
                                                   mask_replace_prob=1.0, random_replace_prob=0.0)  # all it supports
        inputs = [whole_word_examples(tokenizer, chunk, T) for chunk in chunks]
        return Case(objective, "transformers.DataCollatorForLanguageModeling (whole_word_mask=True, "
                    "mlm_probability 0.15)", chunks, T, inputs, collator)
    if name == "bart":
        word_start = np.array([not (tokenizer.backend.id_to_token(i) or "").startswith("##") for i in range(v.size)])
        fairseq = FairseqDenoising(v.size, v.mask_id, v.pad_id, tokenizer.backend.token_to_id("."), word_start)
        inputs = [[np.array(framed(tokenizer, r, T), dtype=np.int64) for r in chunk] for chunk in chunks]
        return Case(objective, "fairseq DenoisingDataset noise per row + collate (benchmarks/references.py): "
                    "BART-large recipe", chunks, T, inputs, fairseq)
    if name == "rtd":
        return rtd_case(objective, tokenizer, chunks, T)
    raise ValueError(f"no reference for {name!r}; objectives with one: {', '.join(OBJECTIVES)}")


def whole_word_examples(tokenizer: objreg.Tokenizer, chunk: list[Row], T: int) -> list[dict[str, list]]:
    """HF whole-word examples of the rows: ids, special-tokens mask, and offsets that touch within
    a word and leave a gap between words (the collator's word test), padded to the batch length."""
    examples = []
    for r in chunk:
        ids, offsets, word, place = [tokenizer.vocab.cls_id], [(0, 0)], None, 0
        for s, (token_ids, word_ids) in enumerate(r.sentences):
            for t, w in zip(token_ids, word_ids):
                place += 0 if (s, w) == word else 1  # a gap before every new word
                offsets.append((place, place + 1))
                ids.append(t)
                place += 1
                word = (s, w)
        ids, offsets = ids[: T - 1] + [tokenizer.vocab.sep_id], offsets[: T - 1] + [(0, 0)]
        examples.append({"input_ids": ids, "offset_mapping": offsets,
                         "special_tokens_mask": [1] + [0] * (len(ids) - 2) + [1], "attention_mask": [1] * len(ids)})
    width = max(len(e["input_ids"]) for e in examples)
    for e in examples:
        pad = width - len(e["input_ids"])
        e["input_ids"] += [tokenizer.vocab.pad_id] * pad
        e["offset_mapping"] += [(0, 0)] * pad
        e["special_tokens_mask"] += [1] * pad
        e["attention_mask"] += [0] * pad
    return examples


def rtd_case(objective: objreg.Objective, tokenizer: objreg.Tokenizer, chunks: list[list[Row]], T: int) -> Case:
    """rtd's selection and masking, then one generator sample per masked position from the same
    logits on both sides (random, drawn once per batch outside the timing)."""
    from objreg.plugins.objectives import rtd

    v = tokenizer.vocab
    B = len(chunks[0])
    max_predictions = int((0.15 + 0.005) * T)  # ELECTRA's configure_pretraining default
    batches = [id_rows(chunk) for chunk in chunks]
    generator = torch.Generator().manual_seed(1)
    widths = [max(max_predictions, int(rtd_count(tokenizer, b, T))) for b in batches]
    logits = [torch.randn(B, k, v.size, generator=generator) for k in widths]
    electra = ElectraMasking(v.mask_id, v.special_ids, v.size, max_predictions)
    inputs = []
    for chunk, batch_logits in zip(chunks, logits):
        ids = [framed(tokenizer, r, T) for r in chunk]
        width = max(len(r) for r in ids)
        padded = torch.tensor([r + [v.pad_id] * (width - len(r)) for r in ids])
        inputs.append((padded, (padded != v.pad_id).long(), batch_logits[:, :max_predictions]))

    def reference(example: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> torch.Tensor:
        input_ids, input_mask, batch_logits = example
        return electra.sample(electra.mask(input_ids, input_mask), batch_logits)

    params = objective.params

    def after(corrupted: objreg.CorruptedBatch, i: int) -> torch.Tensor:
        positions = corrupted.extras["masked_positions"]  # (B, K)
        real = corrupted.extras["masked_weights"] > 0
        targets = corrupted.labels.gather(1, positions).clamp(min=0)
        sampled = rtd.sample_replacements(logits[i][:, : positions.shape[1]], targets, corrupted.extras["sample_noise"],
                                          params, v)
        current = corrupted.input_ids.gather(1, positions)
        return corrupted.input_ids.scatter(1, positions, torch.where(real, sampled, current))

    return Case(objective, "ELECTRA pretrain_helpers mask + sample_from_softmax (Gumbel-max), batched torch "
                f"(benchmarks/references.py), max_predictions_per_seq {max_predictions}, same logits",
                batches, T, inputs, reference, after)


def rtd_count(tokenizer: objreg.Tokenizer, rows: list[Row], T: int) -> int:
    """Most positions rtd selects in a row of these examples (its ``K``)."""
    batch = tokenizer.assemble(rows, T)
    n = (~(batch.is_special | batch.is_padding)).sum(dim=1)
    return int(torch.round(n * 0.15).long().clamp(min=1).max())


# -- operation counts -------------------------------------------------------------------------------


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
    reference_batch_us = B / measured["reference_examples_per_s"] * 1e6
    objreg_batch_us = B / measured["objreg_examples_per_s"] * 1e6
    return {
        "assemble_ops": assemble_ops,
        "corrupt_ops": corrupt_ops,
        "us_per_trivial_op": rounded(per_op),
        "objreg_us_per_batch": rounded(objreg_batch_us),
        "us_per_op_measured": rounded(objreg_batch_us / (assemble_ops + corrupt_ops)),
        "reference_us_per_batch": rounded(reference_batch_us),
        "speedup_ceiling_from_op_count": rounded(reference_batch_us / ((assemble_ops + corrupt_ops) * per_op)),
    }


# -- the benchmark ----------------------------------------------------------------------------------


def load(seq_len: int) -> tuple[objreg.Registry, objreg.Tokenizer, objreg.TokenizedCorpus]:
    registry = objreg.Registry.load()
    corpus = registry.load_corpus("default", objreg.cache_dir())
    tokenizer = registry.load_tokenizer("default", corpus, objreg.cache_dir())
    return registry, tokenizer, objreg.TokenizedCorpus(tokenizer, corpus, seq_len)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    # One thread, as in a DataLoader worker (which is where corruption runs in training).
    parser = base_parser(__doc__.splitlines()[0], threads_default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batches", type=int, default=20, help="batches per timed run")
    parser.add_argument("--objectives", default=",".join(OBJECTIVES),
                        help=f"comma-separated, from {', '.join(OBJECTIVES)} (default: all)")
    parser.add_argument("--profile", action="store_true", help="count the ATen operations of each objreg call")
    parser.add_argument("--word-ids", action="store_true",
                        help="give objreg explicit word ids (one per token) instead of None: the same batches, "
                             "for code that predates id-only rows")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    global EXPLICIT_WORD_IDS
    EXPLICIT_WORD_IDS = args.word_ids
    apply_threads(args.threads)
    torch.manual_seed(0)
    np.random.seed(0)
    registry, tokenizer, tokens = load(args.seq_len)
    repeats = args.repeats or 5
    B, T, N = args.batch_size, args.seq_len, args.batches
    result: dict[str, Any] = {
        "benchmark": "corruption",
        "machine": machine(torch.device("cpu")),
        "config": {"batch_size": B, "seq_len": T, "batches": N, "repeats": repeats, "vocab_size": tokenizer.vocab.size},
    }
    for name in [n.strip() for n in args.objectives.split(",") if n.strip()]:
        try:
            case = build_case(name, registry, tokenizer, tokens, B, T, N)
        except ImportError as error:
            result[name] = {"skipped": f"{error}: pip install 'objreg[bench]' (transformers) for this row"}
            continue
        result[name] = run_case(case, torch.Generator().manual_seed(0), B, repeats, tokenizer, args.profile)
    names = [n for n in result if isinstance(result[n], dict) and n not in ("machine", "config")]
    rows = [(f"{n}.{k}", v) for n in names for k, v in result[n].items() if not isinstance(v, dict)]
    rows += [(f"{n}.profile.{k}", v) for n in names for k, v in result[n].get("profile", {}).items()]
    emit(result, args.json, rows)
    return result


if __name__ == "__main__":
    main()
