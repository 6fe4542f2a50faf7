"""ordering: sentence-order coherence: are these sentences in their original order?

Each example is a window of ``num_sentences`` consecutive sentences of one document, framed
``[CLS] s_a [SEP] s_b [SEP] s_c [SEP]`` after reordering them by a permutation; the classifier
head on ``[CLS]`` predicts the order. This is the shuffled-document discrimination task of the
coherence literature (Barzilay & Lapata 2008) at window level, and DiscoEval's binary sentence
ordering (Chen et al. 2019) when two adjacent sentences are swapped. Three modes:

* ``shuffle`` (default): binary, label 0 = original order, 1 = a permutation drawn uniformly from
  the ``k! - 1`` others (so a negative always differs from the original order);
* ``swap``: binary, a negative swaps one pair of adjacent sentences (drawn uniformly): harder,
  since most of the window stays in order; with ``num_sentences=2`` it is ALBERT's SOP on a
  downstream set;
* ``permutation``: ``k!``-way, the label is the permutation's rank in lexicographic order
  (0 = the original order), drawn uniformly.

Binary labels are drawn with probability 1/2 each. Every draw comes from a generator seeded with
``seed``, so the set is the same on every call. Sentence boundaries are kept exactly: each
segment between two ``[SEP]`` is one whole sentence (cut at its end only when the window does not
fit ``seq_len``, longest sentence first, the same cut whatever the order, so a sentence's length
never gives the permutation away). Windows whose sentences tokenise identically are skipped, since
reordering them would change nothing.

Source of the windows: the held-out documents of the corpus (the default corpus, or the file
given with ``--corpus``), or ``--downstream-data PATH``: a text or JSONL file (or a directory of
them) read exactly as ``--corpus`` reads it (documents are blank-line-separated blocks, or one per
line; :func:`objreg.toolkit.documents.read_documents`), all of whose documents are used (so it should not be the ``--corpus`` file as well, or
the model pre-trains on the evaluation text). Windows come one document after another in turn, each
document's windows sliding by one sentence, up to ``limit``.

The classifier has exactly as many outputs as there are classes: 2 for ``shuffle`` and ``swap``,
``k!`` for ``permutation`` (returned with the batch, :class:`objreg.TaskData`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

import objreg
from objreg.toolkit.documents import read_documents
from objreg.toolkit.heads import summary_states
from objreg.toolkit.lengths import fit_lengths
from objreg.toolkit.losses import label_nll
from objreg.toolkit.taskfiles import round_robin

NAME = "ordering"
HEAD = "ordering"
MAX_SENTENCES = 5
MODES = ("shuffle", "swap", "permutation")


@objreg.hookimpl
def objreg_objective_info() -> objreg.ObjectiveInfo:
    return objreg.ObjectiveInfo(
        name=NAME,
        description="Sentence-order coherence: is a window of sentences in its original order, or which order?",
        kind="downstream",
        attention="bidirectional",
        heads=(objreg.HeadSpec(HEAD, "classifier"),),  # sized from the data: 2 or k!
        params=(
            objreg.Param("num_sentences", 3, "Consecutive sentences per window (k)", int, low=2, high=MAX_SENTENCES),
            objreg.Param(
                "mode",
                "shuffle",
                "shuffle: original vs any other order; swap: original vs one adjacent pair swapped; "
                "permutation: k!-way, which order",
                str,
                choices=MODES,
            ),
            objreg.Param("seed", 0, "Seed of the draws of labels and permutations", int, low=0),
        ),
        references=(
            "Barzilay & Lapata 2008, Modeling Local Coherence: An Entity-Based Approach (shuffled-order discrimination)",
            "Chen, Chu & Gimpel 2019, Evaluation Benchmarks and Learning Criteria for Discourse-Aware Sentence "
            "Representations (DiscoEval binary sentence ordering)",
            "Lan et al. 2020, ALBERT (sentence-order prediction)",
        ),
        min_seq_len=2 * 2 + 1,
    )


def permutations(k: int) -> list[tuple[int, ...]]:
    """Every order of ``k`` sentences in lexicographic order: index 0 is the original order."""
    return list(itertools.permutations(range(k)))


def windows(encoded: Sequence[Sequence[list[int]]], k: int, limit: int) -> list[tuple[int, int]]:
    """``(document, first sentence)`` of up to ``limit`` windows of ``k`` sentences, one document
    after another in turn, each document's windows sliding by one. A window is skipped (its turn
    passes) when a sentence has no token or two sentences have the same tokens."""

    def usable(doc: Sequence[list[int]], start: int) -> bool:
        sentences = [tuple(ids) for ids in doc[start : start + k]]
        return all(sentences) and len(set(sentences)) == k

    streams = [[(d, s) if usable(doc, s) else None for s in range(len(doc) - k + 1)] for d, doc in enumerate(encoded)]
    return round_robin(streams, limit)


def draw_orders(n: int, k: int, mode: str, seed: int) -> list[tuple[tuple[int, ...], int]]:
    """``(order, label)`` of ``n`` examples: ``order[j]`` is the window sentence placed at slot
    ``j``. Deterministic for ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    orders = permutations(k)
    out = []
    for _ in range(n):
        if mode == "permutation":
            rank = int(torch.randint(len(orders), (), generator=generator))
            out.append((orders[rank], rank))
            continue
        if not bool(torch.rand((), generator=generator) < 0.5):
            out.append((orders[0], 0))
        elif mode == "shuffle":
            out.append((orders[1 + int(torch.randint(len(orders) - 1, (), generator=generator))], 1))
        else:  # swap one adjacent pair
            i = int(torch.randint(k - 1, (), generator=generator))
            order = list(range(k))
            order[i], order[i + 1] = order[i + 1], order[i]
            out.append((tuple(order), 1))
    return out


def _assemble(
    examples: Sequence[tuple[list[list[int]], tuple[int, ...], int]], vocab: objreg.Vocabulary, seq_len: int
) -> objreg.CorruptedBatch:
    """Rows ``[CLS] s_order[0] [SEP] ... s_order[k-1] [SEP]``, right-padded."""
    k = len(examples[0][1])
    rows = []
    for sentences, order, _ in examples:
        keep = fit_lengths([len(s) for s in sentences], seq_len - 1 - k)
        ids, slots = [vocab.cls_id], [-1]
        for slot, j in enumerate(order):
            ids += [*sentences[j][: keep[j]], vocab.sep_id]
            slots += [slot] * keep[j] + [-1]
        rows.append((ids, slots))
    B, T = len(rows), max(len(ids) for ids, _ in rows)
    input_ids = torch.full((B, T), vocab.pad_id, dtype=torch.long)
    sentence_ids = torch.full((B, T), -1, dtype=torch.long)
    is_padding = torch.ones(B, T, dtype=torch.bool)
    for b, (ids, slots) in enumerate(rows):
        input_ids[b, : len(ids)] = torch.tensor(ids)
        sentence_ids[b, : len(ids)] = torch.tensor(slots)
        is_padding[b, : len(ids)] = False
    rows_index = torch.arange(B)[:, None].expand(B, T)
    return objreg.CorruptedBatch(
        input_ids=input_ids,
        labels=torch.full((B, T), objreg.IGNORE_INDEX, dtype=torch.long),
        is_padding=is_padding,
        position_ids=torch.arange(T).repeat(B, 1),
        document_ids=torch.where(is_padding, -1, rows_index),
        extras={
            "label": torch.tensor([label for _, _, label in examples], dtype=torch.long),
            "order": torch.tensor([order for _, order, _ in examples], dtype=torch.long),  # (B, k)
            "sentence_ids": sentence_ids,  # slot of each sentence token, -1 at [CLS], [SEP], padding
        },
    )


def ordering_task_data(
    documents: Sequence[Sequence[str]],
    where: str,
    tokenizer: objreg.Tokenizer,
    seq_len: int,
    limit: int,
    params: Mapping[str, Any],
) -> objreg.TaskData:
    k = params["num_sentences"]
    if seq_len < 2 * k + 1:
        raise objreg.InvalidParameterError(
            f"ordering: seq_len {seq_len} is too short for windows of {k} sentences; it needs at least "
            f"{2 * k + 1} tokens ([CLS], and each sentence with its [SEP])"
        )
    long_enough = [doc for doc in documents if len(doc) >= k]
    flat = [s for doc in long_enough for s in doc]
    pieces = iter(ids for ids, _ in tokenizer.encode_sentences(flat)) if flat else iter(())
    encoded = [[next(pieces) for _ in doc] for doc in long_enough]
    chosen = windows(encoded, k, limit)
    if not chosen:
        raise objreg.DataError(
            f"{where} has no window of {k} consecutive sentences of one document ({len(documents)} documents, "
            f"{len(long_enough)} with {k} sentences or more); use a corpus with longer documents, or lower "
            f"num_sentences"
        )
    mode = params["mode"]
    drawn = draw_orders(len(chosen), k, mode, params["seed"])
    examples = [(encoded[d][start : start + k], order, label) for (d, start), (order, label) in zip(chosen, drawn)]
    num_classes = math.factorial(k) if mode == "permutation" else 2
    return objreg.TaskData(
        _assemble(examples, tokenizer.vocab, seq_len), (objreg.HeadSpec(HEAD, "classifier", num_classes),)
    )


# -- the hooks ----------------------------------------------------------------------------------


@objreg.hookimpl
def objreg_task_data(
    source: str | None,
    documents: Sequence[Sequence[str]],
    tokenizer: objreg.Tokenizer,
    seq_len: int,
    limit: int,
    params: Mapping[str, Any],
) -> objreg.TaskData:
    if source is None:
        return ordering_task_data(documents, "the held-out corpus", tokenizer, seq_len, limit, params)
    documents = read_documents(source, "ordering data")
    return ordering_task_data(documents, f"ordering data {source}", tokenizer, seq_len, limit, params)


@objreg.hookimpl
def objreg_attention_mask(batch: objreg.CorruptedBatch) -> objreg.AttentionMask:
    return objreg.AttentionMask.bidirectional(batch.is_padding)


@objreg.hookimpl
def objreg_loss(outputs: objreg.ModelOutputs, batch: objreg.CorruptedBatch) -> torch.Tensor:
    """Cross-entropy of the order label over the head's classes (vmap/jvp-safe)."""
    # The first token on an encoder; the last real token on a decoder-only model (docs/models.md).
    states = summary_states(outputs.hidden, batch)
    return label_nll(outputs.model.heads[HEAD](states), batch.extras["label"])  # logits (B, C)
