"""classification: single-sentence and sentence-pair classification on the first token.

Each example is one row ``[CLS] text [SEP]`` or, for a pair, ``[CLS] text [SEP] text_pair [SEP]``
(segment ids 0 and 1, BERT's ``token_type_ids``); the ``classifier`` head (BERT's tanh pooler on
``[CLS]`` and a linear layer) predicts the label, as BERT does for GLUE (Devlin et al. 2019, §4.1).
A pair too long for a row is cut longest-first, token by token from the longer text (Hugging
Face's default ``truncation=True``, ``"longest_first"``).

Two sources of examples:

* ``--downstream-data PATH``: a GLUE-style TSV file with a header line (SST-2 ``sentence``,
  ``label``; RTE ``sentence1``, ``sentence2``, ``label``, ``idx``; other columns are ignored) or a
  JSONL file (``{"text": ..., "label": ...}`` or ``{"text": ..., "text_pair": ..., "label": ...}``).
  The text, pair and label fields are found among the usual names (see ``PAIR_FIELDS``,
  ``TEXT_FIELDS``, ``LABEL_FIELDS``) or named with the ``text_field``, ``text_pair_field`` and
  ``label_field`` parameters. TSV fields may be CSV-quoted (``"a ""quoted"" word"``, as pandas
  and Hugging Face ``datasets`` write them) or bare (GLUE's own ``QUOTE_NONE`` files); a record is
  one line in both. Labels are strings or integers; the label set is read from the whole file
  and ordered numerically when every label is an integer (``0, 1``), else alphabetically
  (``entailment, not_entailment``), or fixed with the ``labels`` parameter. Up to ``limit``
  records, evenly spaced over the file.
* No path: a built-in **same-document** pair set from held-out documents of the corpus. Each
  sentence of a document with at least two sentences is paired with another sentence of the same
  document (label ``same_document``) or, with probability 1/2, with a sentence of another
  document (``different_document``); the draws come from a generator seeded with ``seed``. The
  signal is shared topic words and names (a docstring's sentences talk about the same function):
  on the default corpus's 1,051 held-out pairs the rule "the two sentences share a content word
  of 4+ letters" is right 70% of the time (labels are 50/50), so a model that learns to match
  tokens across the two segments can learn it. It is a coherence task close to BERT's
  next-sentence prediction, but the positive partner is any sentence of the document, not only
  the next one. Use a real file (SST-2, RTE) for claims about semantics.

The number of classes comes from the data, but heads are built from ``ObjectiveInfo.heads``, which
is declared before any data is read. So the head has ``MAX_CLASSES`` outputs and every row carries
``num_classes``; the loss is the cross-entropy over the first ``num_classes`` logits, the others
pushed to ``finfo.min`` (their ``exp`` is exactly 0). That is exactly the loss of a
``num_classes``-way head made of the first rows of the weight: the unused rows get zero gradient,
and, as head parameters, they are outside the alignment, which is measured on the backbone.
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import objreg

NAME = "classification"
HEAD = "classification"
#: Outputs of the classifier head: the most classes a data set may have.
MAX_CLASSES = 128

#: (text, pair) field names tried in this order when ``text_field`` is empty: GLUE's pair tasks
#: (RTE/MNLI/WNLI, QQP, QNLI, MRPC), NLI data sets and the JSONL names.
PAIR_FIELDS = (
    ("sentence1", "sentence2"),
    ("question1", "question2"),
    ("question", "sentence"),
    ("#1 String", "#2 String"),
    ("premise", "hypothesis"),
    ("text", "text_pair"),
)
#: Single-text field names tried after the pairs (SST-2, CoLA with a header, JSONL).
TEXT_FIELDS = ("sentence", "text")
#: Label field names tried in order when ``label_field`` is empty (GLUE, MNLI, QQP, MRPC).
LABEL_FIELDS = ("label", "gold_label", "is_duplicate", "Quality")
#: A label meaning "annotators did not agree" (SNLI/MNLI ``gold_label``): the record is skipped.
NO_GOLD_LABEL = "-"

BUILTIN_LABELS = ("different_document", "same_document")

# A CSV-quoted field: one pair of outer quotes, inner quotes doubled.
_QUOTED = re.compile(r'"((?:[^"]|"")*)"')


@objreg.hookimpl
def objreg_objective_info() -> objreg.ObjectiveInfo:
    return objreg.ObjectiveInfo(
        name=NAME,
        description="Sentence / sentence-pair classification from [CLS]: GLUE TSV or JSONL, or built-in same-document pairs",
        kind="downstream",
        attention="bidirectional",
        heads=(objreg.HeadSpec(HEAD, "classifier", MAX_CLASSES),),
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


def fit_lengths(lengths: Sequence[int], budget: int) -> list[int]:
    """Lengths cut to fit ``budget`` in total, longest first: the result is what removing one
    token at a time from the currently longest text gives (ties: the earlier text keeps the
    extra token), i.e. Hugging Face's ``"longest_first"`` truncation, generalised to n texts."""
    if sum(lengths) <= budget:
        return list(lengths)
    # The largest cap c with sum(min(l, c)) <= budget, then the leftover tokens to the earliest
    # texts that reach the cap.
    cap = max(c for c in range(max(lengths) + 1) if sum(min(n, c) for n in lengths) <= budget)
    out = [min(n, cap) for n in lengths]
    left = budget - sum(out)
    for i, n in enumerate(lengths):
        if left and n > cap:
            out[i] += 1
            left -= 1
    return out


def _assemble(
    examples: Sequence[_Example], vocab: objreg.Vocabulary, num_classes: int, seq_len: int
) -> objreg.CorruptedBatch:
    """Frame each example as ``[CLS] text [SEP] (pair [SEP])``, cut to ``seq_len``, right-padded."""
    rows = []
    for e in examples:
        if e.pair is None:
            (n_text,) = fit_lengths([len(e.text)], seq_len - 2)
            rows.append(([vocab.cls_id, *e.text[:n_text], vocab.sep_id], n_text + 2))
        else:
            n_text, n_pair = fit_lengths([len(e.text), len(e.pair)], seq_len - 3)
            ids = [vocab.cls_id, *e.text[:n_text], vocab.sep_id, *e.pair[:n_pair], vocab.sep_id]
            rows.append((ids, n_text + 2))
    B = len(rows)
    T = max(len(ids) for ids, _ in rows)
    input_ids = torch.full((B, T), vocab.pad_id, dtype=torch.long)
    is_padding = torch.ones(B, T, dtype=torch.bool)
    segment_ids = torch.zeros(B, T, dtype=torch.long)
    for b, (ids, first_of_pair) in enumerate(rows):
        input_ids[b, : len(ids)] = torch.tensor(ids)
        is_padding[b, : len(ids)] = False
        segment_ids[b, first_of_pair : len(ids)] = 1  # empty for a single sentence
    rows_index = torch.arange(B)[:, None].expand(B, T)
    return objreg.CorruptedBatch(
        input_ids=input_ids,
        labels=torch.full((B, T), objreg.IGNORE_INDEX, dtype=torch.long),
        is_padding=is_padding,
        position_ids=torch.arange(T).repeat(B, 1),
        document_ids=torch.where(is_padding, -1, rows_index),
        extras={
            "label": torch.tensor([e.label for e in examples], dtype=torch.long),
            "num_classes": torch.full((B,), num_classes, dtype=torch.long),
            "segment_ids": segment_ids,
        },
    )


# -- the built-in same-document set -------------------------------------------------------------


def _round_robin_anchors(documents: Sequence[Sequence[str]], limit: int) -> list[tuple[int, int]]:
    """(document, sentence) of each anchor sentence, one document after another in turn, so a
    small ``limit`` still spans documents. Only documents with two sentences or more."""
    eligible = [d for d, doc in enumerate(documents) if len(doc) >= 2]
    out: list[tuple[int, int]] = []
    for s in range(max((len(documents[d]) for d in eligible), default=0)):
        for d in eligible:
            if s < len(documents[d]):
                out.append((d, s))
                if len(out) == limit:
                    return out
    return out


def same_document_pairs(documents: Sequence[Sequence[str]], limit: int, seed: int) -> list[tuple[str, str, int]]:
    """``(anchor, partner, label)`` triples of the built-in set: label 1 when the partner is another
    sentence of the anchor's document, 0 when it is a sentence of another document. Deterministic
    for ``seed``."""
    anchors = _round_robin_anchors(documents, limit)
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
) -> objreg.CorruptedBatch:
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
    return _assemble(examples, tokenizer.vocab, len(BUILTIN_LABELS), seq_len)


def _encode(tokenizer: objreg.Tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of each text, no special tokens; many texts repeat (pair partners), encode once."""
    unique = list(dict.fromkeys(texts))
    ids = dict(zip(unique, (ids for ids, _ in tokenizer.encode_sentences(unique))))
    return [ids[t] for t in texts]


# -- reading TSV and JSONL files ----------------------------------------------------------------


@dataclass(frozen=True)
class _Record:
    """One usable record of a file: its line number, its texts and its label as a string."""

    line: int
    text: str
    pair: str | None
    label: str


@dataclass(frozen=True)
class _Fields:
    text: str
    pair: str | None
    label: str


_ALLOWED = (
    "allowed: a TSV file with a header line (GLUE: sentence, label; or sentence1, sentence2, label) or "
    'JSONL lines like {"text": str, "label": str or int} or {"text": str, "text_pair": str, "label": str or int}'
)


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` of a UTF-8 file without line endings; clear errors for a missing
    file or bytes that are not UTF-8. Split on newlines only, so line numbers match an editor's."""
    if not path.is_file():
        what = "is a directory, not a file" if path.is_dir() else "does not exist"
        raise objreg.DataError(f"classification data file {path} {what}; {_ALLOWED}")
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError as e:
                raise objreg.DataError(
                    f"{path} line {number}: not UTF-8 text (byte {e.start}); save it as UTF-8"
                ) from None
            yield number, line.rstrip("\n").rstrip("\r")


def _unquote(field: str) -> str:
    """A CSV-quoted field's text (outer quotes off, doubled quotes single); a bare field as it is."""
    match = _QUOTED.fullmatch(field)
    return match.group(1).replace('""', '"') if match else field


def _choose_fields(names: Sequence[str], params: Mapping[str, Any], path: Path, where: str) -> _Fields:
    """The text, pair and label fields among ``names`` (a TSV header or the first JSONL record's
    keys), from the parameters or the usual names."""
    present = set(names)
    listed = ", ".join(map(repr, names)) or "none"
    if params["text_field"]:
        text, pair = params["text_field"], params["text_pair_field"] or None
        missing = [f for f in (text, pair) if f is not None and f not in present]
        if missing:
            raise objreg.DataError(
                f"{path}: {where} has no field {missing[0]!r} (text_field/text_pair_field); its fields: {listed}"
            )
    else:
        found = [p for p in PAIR_FIELDS if set(p) <= present] + [(t, None) for t in TEXT_FIELDS if t in present]
        if not found:
            usual = ", ".join([f"{a}+{b}" for a, b in PAIR_FIELDS] + list(TEXT_FIELDS))
            raise objreg.DataError(
                f"{path}: {where} has no text field (its fields: {listed}); expected one of "
                f"{usual}, or name it with the text_field parameter. {_ALLOWED}"
            )
        text, pair = found[0]
    if params["label_field"]:
        label = params["label_field"]
        if label not in present:
            raise objreg.DataError(f"{path}: {where} has no label field {label!r} (label_field); its fields: {listed}")
    else:
        labels = [f for f in LABEL_FIELDS if f in present]
        if not labels:
            raise objreg.DataError(
                f"{path}: {where} has no label field (its fields: {listed}); expected one of "
                f"{', '.join(LABEL_FIELDS)}, or name it with the label_field parameter"
            )
        label = labels[0]
    return _Fields(text, pair, label)


@dataclass
class _Skipped:
    empty_text: list[int]
    no_gold_label: list[int]


def _read_tsv(
    path: Path, lines: Iterator[tuple[int, str]], params: Mapping[str, Any], skipped: _Skipped
) -> list[_Record]:
    header_line = next(((n, line) for n, line in lines if line.strip()), None)
    if header_line is None:
        raise objreg.DataError(f"{path}: the file is empty; {_ALLOWED}")
    header = [_unquote(f) for f in header_line[1].split("\t")]
    fields = _choose_fields(header, params, path, f"the header (line {header_line[0]})")
    columns = {name: header.index(name) for name in (fields.text, fields.pair, fields.label) if name is not None}
    records = []
    for number, line in lines:
        if not line.strip():
            continue
        values = [_unquote(f) for f in line.split("\t")]
        if len(values) != len(header):
            raise objreg.DataError(
                f"{path} line {number}: {len(values)} tab-separated fields, but the header has {len(header)} "
                f"({', '.join(header)}); each record is one line with one field per column"
            )
        label = values[columns[fields.label]].strip()
        if not label:
            raise objreg.DataError(f"{path} line {number}: empty {fields.label!r} field; every record needs a label")
        record = _record(
            number,
            values[columns[fields.text]],
            None if fields.pair is None else values[columns[fields.pair]],
            label,
            skipped,
        )
        if record is not None:
            records.append(record)
    return records


def _record(number: int, text: str, pair: str | None, label: str, skipped: _Skipped) -> _Record | None:
    if label == NO_GOLD_LABEL:
        skipped.no_gold_label.append(number)
        return None
    if not text.strip() or (pair is not None and not pair.strip()):
        skipped.empty_text.append(number)
        return None
    return _Record(number, text, pair, label)


def _json_type(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", int: "integer", float: "number", bool: "boolean"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def _read_jsonl(
    path: Path, lines: Iterator[tuple[int, str]], params: Mapping[str, Any], skipped: _Skipped
) -> list[_Record]:
    fields: _Fields | None = None
    records = []
    for number, line in lines:
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as e:
            raise objreg.DataError(
                f"{path} line {number}: not valid JSON ({e.msg}, column {e.colno}); {_ALLOWED}"
            ) from None
        if not isinstance(value, dict):
            raise objreg.DataError(f"{path} line {number}: a JSON {_json_type(value)}, not an object; {_ALLOWED}")
        if fields is None:
            fields = _choose_fields(list(value), params, path, f"the first record (line {number})")
        texts = []
        for key in (fields.text, fields.pair):
            if key is None:
                texts.append(None)
                continue
            if key not in value:
                raise objreg.DataError(f"{path} line {number}: no {key!r} field, which the first record has")
            if not isinstance(value[key], str):
                raise objreg.DataError(f"{path} line {number}: {key!r} must be a string, got {_json_type(value[key])}")
            texts.append(value[key])
        if fields.label not in value:
            raise objreg.DataError(f"{path} line {number}: no {fields.label!r} field; every record needs a label")
        label = value[fields.label]
        if (
            isinstance(label, bool)
            or not isinstance(label, (str, int))
            or (isinstance(label, str) and not label.strip())
        ):
            got = "an empty string" if isinstance(label, str) else f"a JSON {_json_type(label)} ({json.dumps(label)})"
            raise objreg.DataError(
                f"{path} line {number}: {fields.label!r} is {got}; a label must be a non-empty string or an integer"
            )
        record = _record(number, texts[0], texts[1], str(label).strip(), skipped)
        if record is not None:
            records.append(record)
    if fields is None:
        raise objreg.DataError(f"{path}: the file is empty; {_ALLOWED}")
    return records


def _is_jsonl(path: Path) -> bool:
    """JSONL by suffix, or by a first non-blank line that opens a JSON object."""
    if path.suffix.lower() in (".jsonl", ".json", ".ndjson"):
        return True
    first = next((line for _, line in _lines(path) if line.strip()), "")
    return first.lstrip().startswith("{")


def label_order(labels: Sequence[str]) -> list[str]:
    """The distinct labels in class order: numeric when every label is an integer, else alphabetical."""
    distinct = set(labels)
    if all(re.fullmatch(r"[+-]?\d+", label) for label in distinct):
        return sorted(distinct, key=int)
    return sorted(distinct)


def read_records(path: Path, params: Mapping[str, Any]) -> tuple[list[_Record], list[str]]:
    """The usable records of a TSV or JSONL file and the label set in class order; warns about
    skipped records."""
    skipped = _Skipped([], [])
    reader = _read_jsonl if _is_jsonl(path) else _read_tsv
    records = reader(path, _lines(path), params, skipped)
    if skipped.empty_text:
        warnings.warn(
            f"{path}: skipped {len(skipped.empty_text)} records with an empty text "
            f"(first: line {skipped.empty_text[0]})",
            stacklevel=3,
        )
    if skipped.no_gold_label:
        warnings.warn(
            f"{path}: skipped {len(skipped.no_gold_label)} records labelled {NO_GOLD_LABEL!r} (no gold "
            f"label; first: line {skipped.no_gold_label[0]})",
            stacklevel=3,
        )
    if not records:
        dropped = len(skipped.empty_text) + len(skipped.no_gold_label)
        why = f" (all {dropped} skipped, see the warnings)" if dropped else " after the header"
        raise objreg.DataError(f"{path}: no classification record{why}; {_ALLOWED}")
    if params["labels"]:
        classes = [label.strip() for label in params["labels"].split(",") if label.strip()]
        allowed = set(classes)
        for record in records:
            if record.label not in allowed:
                raise objreg.DataError(
                    f"{path} line {record.line}: label {record.label!r} is not in the labels "
                    f"parameter ({', '.join(classes)})"
                )
    else:
        classes = label_order([r.label for r in records])
    if len(classes) < 2:
        raise objreg.DataError(
            f"{path}: every record has the label {classes[0]!r}; classification needs 2 classes "
            f"or more (set the labels parameter to name the others)"
        )
    if len(classes) > MAX_CLASSES:
        raise objreg.DataError(
            f"{path}: {len(classes)} distinct labels; the classification head has at most {MAX_CLASSES} classes"
        )
    return records, classes


def _evenly_spaced(n: int, k: int) -> list[int]:
    """``k`` indices spread evenly over ``range(n)`` (all of them when ``k >= n``)."""
    k = min(k, n)
    return [i * n // k for i in range(k)]


def file_task_data(
    source: str, tokenizer: objreg.Tokenizer, seq_len: int, limit: int, params: Mapping[str, Any]
) -> objreg.CorruptedBatch:
    path = Path(source)
    records, classes = read_records(path, params)
    class_id = {label: i for i, label in enumerate(classes)}
    chosen = [records[i] for i in _evenly_spaced(len(records), limit)]
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
    return _assemble(examples, tokenizer.vocab, len(classes), seq_len)


# -- the hooks ----------------------------------------------------------------------------------


@objreg.hookimpl
def objreg_task_data(
    source: str | None,
    documents: Sequence[Sequence[str]],
    tokenizer: objreg.Tokenizer,
    seq_len: int,
    limit: int,
    params: Mapping[str, Any],
) -> objreg.CorruptedBatch:
    if limit < 1:
        raise objreg.InvalidParameterError(f"classification: limit must be at least 1, got {limit}")
    if source is None:
        return builtin_task_data(documents, tokenizer, seq_len, limit, params["seed"])
    return file_task_data(source, tokenizer, seq_len, limit, params)


@objreg.hookimpl
def objreg_attention_mask(batch: objreg.CorruptedBatch) -> torch.Tensor:
    return objreg.masks.bidirectional(batch.is_padding)


@objreg.hookimpl
def objreg_loss(outputs: objreg.ModelOutputs, batch: objreg.CorruptedBatch) -> torch.Tensor:
    """Cross-entropy of the label over the row's ``num_classes`` first logits. Written with
    ``where``, ``logsumexp`` and ``gather`` so it is vmap/jvp-safe."""
    logits = outputs.model.heads[HEAD](outputs.hidden)  # (B, C): C = MAX_CLASSES
    C = logits.shape[-1]
    used = torch.arange(C, device=logits.device) < batch.extras["num_classes"][:, None]  # (B, C)
    # finfo.min rather than -inf: exp underflows to exactly 0, and no inf - inf NaN can appear.
    floor = torch.full((), torch.finfo(logits.dtype).min, dtype=logits.dtype, device=logits.device)
    masked = torch.where(used, logits, floor)  # (B, C)
    picked = masked.gather(1, batch.extras["label"][:, None]).squeeze(1)  # (B,)
    return torch.logsumexp(masked, dim=1) - picked  # (B,)
