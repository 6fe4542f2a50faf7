"""classification: single-sentence and sentence-pair classification on the first token.

Each example is one row ``[CLS] text [SEP]`` or, for a pair, ``[CLS] text [SEP] text_pair [SEP]``
(no segment ids: no backbone reads them); the ``classifier`` head (BERT's tanh pooler on ``[CLS]``
and a linear layer) predicts the label, as BERT does for GLUE (Devlin et al. 2019, §4.1).
A pair too long for a row is cut longest-first, token by token from the longer text (Hugging
Face's default ``truncation=True``, ``"longest_first"``).

Two sources of examples:

* ``--downstream-data PATH``: a GLUE-style TSV file with a header line (SST-2 ``sentence``,
  ``label``; RTE ``sentence1``, ``sentence2``, ``label``, ``idx``; other columns are ignored) or a
  JSONL file (``{"text": ..., "label": ...}`` or ``{"text": ..., "text_pair": ..., "label": ...}``),
  read by :func:`objreg.toolkit.classfiles.read_classification`. The text, pair and label fields
  are found among the usual names or named with the ``text_field``, ``text_pair_field`` and
  ``label_field`` parameters. TSV fields may be CSV-quoted (``"a ""quoted"" word"``, as pandas
  and Hugging Face ``datasets`` write them) or bare (GLUE's own ``QUOTE_NONE`` files); a record is
  one line in both. Labels are strings or integers; a label that is a number is one class however
  it is written (``0``/``00``, ``1``/``1.0``: :func:`objreg.toolkit.taskfiles.canonical_label`); the
  label set is read from the whole file and ordered numerically when every label is an integer (``0, 1``), else alphabetically
  (``entailment, not_entailment``), or fixed with the ``labels`` parameter. Up to ``limit``
  records, evenly spaced over the file.
* No path: a built-in **same-document** pair set from held-out documents of the corpus. Each
  sentence of a document with at least two sentences is paired with another sentence of the same
  document (label ``same_document``) or, with probability 1/2, with a sentence of another
  document (``different_document``); the draws come from a generator seeded with ``seed``. The
  signal is shared topic words and names (a docstring's sentences talk about the same function),
  so a model that learns to match tokens across the two segments can learn it. It is a coherence task close to BERT's
  next-sentence prediction, but the positive partner is any sentence of the document, not only
  the next one. Use a real file (SST-2, RTE) for claims about semantics.

The classifier has exactly as many outputs as the data has classes (SST-2: 2): the task returns
its head sized from the data with the batch (:class:`objreg.TaskData`).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import objreg
from objreg.toolkit.classfiles import read_classification
from objreg.toolkit.heads import summary_states
from objreg.toolkit.lengths import fit_lengths
from objreg.toolkit.losses import label_nll
from objreg.toolkit.taskfiles import evenly_spaced, round_robin

NAME = "classification"
HEAD = "classification"
BUILTIN_LABELS = ("different_document", "same_document")


@objreg.hookimpl
def objreg_objective_info() -> objreg.ObjectiveInfo:
    return objreg.ObjectiveInfo(
        name=NAME,
        description="Sentence / sentence-pair classification from [CLS]: GLUE TSV or JSONL, or built-in same-document pairs",
        kind="downstream",
        attention="bidirectional",
        heads=(objreg.HeadSpec(HEAD, "classifier"),),  # sized from the data
        params=(
            objreg.Param(
                "text_field",
                "",
                "Column/key of the text; empty: the first usual name found "
                "(sentence1+sentence2, question1+question2, question+sentence, premise+hypothesis, "
                "text+text_pair, sentence, text)",
                str,
            ),
            objreg.Param(
                "text_pair_field",
                "",
                "Column/key of the second text of a pair; with text_field set, empty means single-sentence",
                str,
            ),
            objreg.Param(
                "label_field", "", "Column/key of the label; empty: label, gold_label, is_duplicate or Quality", str
            ),
            objreg.Param(
                "labels",
                "",
                "Comma-separated label set in class order; empty: read from the data "
                "(numeric order when every label is an integer, else alphabetical)",
                str,
            ),
            objreg.Param("seed", 0, "Built-in set: seed of the draws of labels and partner sentences", int, low=0),
        ),
        references=(
            "Devlin et al. 2019, BERT (sentence and sentence-pair classification from [CLS])",
            "Wang et al. 2019, GLUE: A Multi-Task Benchmark and Analysis Platform for NLU",
        ),
        min_seq_len=4,
    )


# -- examples and rows --------------------------------------------------------------------------


@dataclass(frozen=True)
class _Example:
    """One example as token ids; ``pair`` is ``None`` for a single sentence."""

    text: list[int]
    pair: list[int] | None
    label: int


def _assemble(examples: Sequence[_Example], vocab: objreg.Vocabulary, seq_len: int) -> objreg.CorruptedBatch:
    """Frame each example as ``[CLS] text [SEP] (pair [SEP])``, cut to ``seq_len``, right-padded."""
    rows = []
    for e in examples:
        if e.pair is None:
            (n_text,) = fit_lengths([len(e.text)], seq_len - 2)
            rows.append([vocab.cls_id, *e.text[:n_text], vocab.sep_id])
        else:
            n_text, n_pair = fit_lengths([len(e.text), len(e.pair)], seq_len - 3)
            rows.append([vocab.cls_id, *e.text[:n_text], vocab.sep_id, *e.pair[:n_pair], vocab.sep_id])
    B = len(rows)
    T = max(len(ids) for ids in rows)
    input_ids = torch.full((B, T), vocab.pad_id, dtype=torch.long)
    is_padding = torch.ones(B, T, dtype=torch.bool)
    for b, ids in enumerate(rows):
        input_ids[b, : len(ids)] = torch.tensor(ids)
        is_padding[b, : len(ids)] = False
    rows_index = torch.arange(B)[:, None].expand(B, T)
    return objreg.CorruptedBatch(
        input_ids=input_ids,
        labels=torch.full((B, T), objreg.IGNORE_INDEX, dtype=torch.long),
        is_padding=is_padding,
        position_ids=torch.arange(T).repeat(B, 1),
        document_ids=torch.where(is_padding, -1, rows_index),
        extras={"label": torch.tensor([e.label for e in examples], dtype=torch.long)},
    )


def _task_data(batch: objreg.CorruptedBatch, num_classes: int) -> objreg.TaskData:
    """The batch and the classifier sized to its classes."""
    return objreg.TaskData(batch, (objreg.HeadSpec(HEAD, "classifier", num_classes),))


# -- the built-in same-document set -------------------------------------------------------------


def same_document_pairs(documents: Sequence[Sequence[str]], limit: int, seed: int) -> list[tuple[str, str, int]]:
    """``(anchor, partner, label)`` triples of the built-in set: label 1 when the partner is another
    sentence of the anchor's document, 0 when it is a sentence of another document. Deterministic
    for ``seed``."""
    # (document, sentence) of each anchor, one document after another in turn, so a small limit
    # still spans documents; only documents with two sentences or more.
    anchors = round_robin([[(d, s) for s in range(len(doc))] for d, doc in enumerate(documents) if len(doc) >= 2],
                          limit)
    if not anchors or len(documents) < 2:
        return []
    generator = torch.Generator().manual_seed(seed)
    n_docs = len(documents)
    triples = []
    for d, s in anchors:
        doc = documents[d]
        same = bool(torch.rand((), generator=generator) < 0.5)
        if same:
            k = int(torch.randint(len(doc) - 1, (), generator=generator))
            partner = doc[k + (k >= s)]  # any sentence of the document but the anchor
        else:
            other = int(torch.randint(n_docs - 1, (), generator=generator))
            other_doc = documents[other + (other >= d)]  # any document but the anchor's
            partner = other_doc[int(torch.randint(len(other_doc), (), generator=generator))]
        triples.append((doc[s], partner, int(same)))
    return triples


def builtin_task_data(
    documents: Sequence[Sequence[str]], tokenizer: objreg.Tokenizer, seq_len: int, limit: int, seed: int
) -> objreg.TaskData:
    documents = [doc for doc in documents if doc]
    triples = same_document_pairs(documents, limit, seed)
    if not triples:
        raise objreg.DataError(
            f"too few held-out documents to build the built-in classification set ({len(documents)} documents, "
            f"it needs 2 or more, one of them with 2 sentences or more); pass --downstream-data with a TSV or "
            f"JSONL classification file"
        )
    encoded = _encode(tokenizer, [t for a, b, _ in triples for t in (a, b)])
    examples = [_Example(encoded[2 * i], encoded[2 * i + 1], label) for i, (_, _, label) in enumerate(triples)]
    examples = [e for e in examples if e.text and e.pair]
    if not examples:
        raise objreg.DataError("the built-in classification set is empty: no held-out sentence has a token")
    return _task_data(_assemble(examples, tokenizer.vocab, seq_len), len(BUILTIN_LABELS))


def _encode(tokenizer: objreg.Tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of each text, no special tokens; many texts repeat (pair partners), encode once."""
    unique = list(dict.fromkeys(texts))
    ids = dict(zip(unique, (ids for ids, _ in tokenizer.encode_sentences(unique))))
    return [ids[t] for t in texts]


# -- files -----------------------------------------------------------------------------------------


def file_task_data(
    source: str, tokenizer: objreg.Tokenizer, seq_len: int, limit: int, params: Mapping[str, Any]
) -> objreg.TaskData:
    """Up to ``limit`` records of a TSV or JSONL file, evenly spaced over it."""
    path = Path(source)
    records, classes = read_classification(
        path, params["text_field"], params["text_pair_field"], params["label_field"], params["labels"]
    )
    class_id = {label: i for i, label in enumerate(classes)}
    chosen = [records[i] for i in evenly_spaced(len(records), limit)]
    pairs = chosen[0].pair is not None
    encoded = _encode(tokenizer, [t for r in chosen for t in ((r.text, r.pair) if pairs else (r.text,))])
    step = 2 if pairs else 1
    examples, untokenised = [], []
    for i, r in enumerate(chosen):
        text, pair = encoded[step * i], encoded[step * i + 1] if pairs else None
        if not text or (pairs and not pair):
            untokenised.append(r.line)  # e.g. only control characters, which the normaliser drops
            continue
        examples.append(_Example(text, pair, class_id[r.label]))
    if untokenised:
        warnings.warn(
            f"{path}: skipped {len(untokenised)} records whose text has no token (first: line {untokenised[0]})",
            stacklevel=2,
        )
    if not examples:
        raise objreg.DataError(f"{path}: no classification record has a text with tokens")
    return _task_data(_assemble(examples, tokenizer.vocab, seq_len), len(classes))


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
        return builtin_task_data(documents, tokenizer, seq_len, limit, params["seed"])
    return file_task_data(source, tokenizer, seq_len, limit, params)


@objreg.hookimpl
def objreg_attention_mask(batch: objreg.CorruptedBatch) -> objreg.AttentionMask:
    return objreg.AttentionMask.bidirectional(batch.is_padding)


@objreg.hookimpl
def objreg_loss(outputs: objreg.ModelOutputs, batch: objreg.CorruptedBatch) -> torch.Tensor:
    """Cross-entropy of the label over the head's classes (vmap/jvp-safe)."""
    # The first token on an encoder; the last real token on a decoder-only model (docs/models.md).
    states = summary_states(outputs.hidden, batch)
    return label_nll(outputs.model.heads[HEAD](states), batch.extras["label"])  # logits (B, C)


@objreg.hookimpl
def objreg_task_metrics(outputs: objreg.ModelOutputs, batch: objreg.CorruptedBatch) -> dict[str, torch.Tensor]:
    """Accuracy: whether the head's most likely class is the label."""
    logits = outputs.model.heads[HEAD](summary_states(outputs.hidden, batch))
    return {"accuracy": (logits.argmax(dim=-1) == batch.extras["label"]).float()}
