"""token_classification: a tag for every word (NER, POS, chunking), from a per-token head.

Each example is one sentence, ``[CLS] subwords of word 1 ... subwords of word n [SEP]``; the
``token_classifier`` head (a linear layer on every position) predicts each word's tag from its
**first subword**. The other subwords, ``[CLS]``, ``[SEP]`` and padding carry no label
(``IGNORE_INDEX``): BERT's NER setup (Devlin et al. 2019, §5.3: "we use the representation of the
first sub-token as the input to the token-level classifier") and the Hugging Face convention
(``examples/pytorch/token-classification/run_ner.py``, ``tokenize_and_align_labels`` with
``label_all_tokens=False``). ``label_all_tokens=True`` gives every subword its word's tag instead.
Words are tokenised one by one, as ``is_split_into_words=True`` does, so a word's subwords never
merge with its neighbours'. The per-sample loss is the mean cross-entropy over the sentence's
labelled positions.

Two sources of examples:

* ``--downstream-data PATH``: CoNLL style (one ``token<TAB or spaces>tag`` per line, the tag in
  the last column so CoNLL-2003's four columns work; a blank line between sentences;
  ``-DOCSTART-`` lines skipped) or JSONL (``{"tokens": [...], "tags": [...]}``; ``words`` and
  ``ner_tags``/``pos_tags``/``labels`` are found too, or named with ``tokens_field`` and
  ``tags_field``). Tags are strings or integers; the tag set is read from the whole file, in
  numeric order when every tag is an integer, else alphabetical, or fixed with ``labels``. Up to
  ``limit`` sentences, evenly spaced over the file.
* No path: a built-in **lexical tagging** of held-out sentences of the corpus, a deterministic
  stand-in for POS tagging that any tokenizer can see (it ignores case, which the default
  tokenizer lower-cases away). Words are runs of letters and digits (with inner ``.``, ``'`` or
  ``-`` and an optional trailing ``()``) or single punctuation marks, and each gets one of
  ``BUILTIN_TAGS``: ``PUNCT`` (no letter or digit), ``NUM`` (a number such as ``3.4`` or
  ``2,047``), ``CODE`` (an identifier: an underscore, a call ``f()``, a dotted name such as
  ``os.path`` or letters mixed with digits such as ``utf8``), ``FUNC`` (a function word from
  ``FUNCTION_WORDS``: determiners, pronouns, prepositions, conjunctions, auxiliaries) and ``WORD``
  (any other word). On the default corpus's 1,606 held-out sentences (25,557 words) that is 45% WORD,
  36.5% FUNC, 16% PUNCT, 2% CODE and 0.4% NUM. Telling CODE from WORD needs the subwords that follow the first
  one (``os`` in ``os . path``), so the tagger has to read context, not only the token itself.

The number of tags comes from the data, but heads are built from ``ObjectiveInfo.heads`` before
any data is read: the head has ``MAX_TAGS`` outputs, every row carries ``num_tags``, and the loss
uses only the first ``num_tags`` logits (the others at ``finfo.min``, so their ``exp`` is 0): the
loss of a ``num_tags``-way head, whose unused rows get zero gradient and are head parameters,
outside the alignment.
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

NAME = "token_classification"
HEAD = "token_classification"
#: Outputs of the token head: the most tags a data set may have (OntoNotes NER has 37 BIO tags,
#: the Penn Treebank 45 POS tags).
MAX_TAGS = 128

BUILTIN_TAGS = ("WORD", "FUNC", "CODE", "NUM", "PUNCT")
#: Closed-class English words: the built-in set tags them FUNC (compared lower-cased).
FUNCTION_WORDS = frozenset(
    """a an the this that these those each every either neither no some any all both few many much
    several such what which whose whatever whichever i me my mine we us our ours you your yours he
    him his she her hers it its they them their theirs who whom myself yourself himself herself
    itself ourselves themselves one about above across after against along among around as at
    before behind below beneath beside besides between beyond by despite down during except for
    from in inside into like near of off on onto out outside over past per since through
    throughout till to toward towards under underneath unlike until up upon via with within
    without and but or nor so yet if then else because although though unless whereas while
    whether than when where whenever wherever how why not be is am are was were been being have
    has had having do does did doing will would shall should can could may might must there here
    also only just too very""".split()
)

TOKENS_FIELDS = ("tokens", "words")
TAGS_FIELDS = ("tags", "ner_tags", "pos_tags", "labels")
DOCSTART = "-DOCSTART-"

# A built-in word: letters/digits with inner . ' ’ or -, and an optional call "()"; or one mark.
_WORD = re.compile(r"\w+(?:[.'’-]\w+)*(?:\(\))?|[^\w\s]")
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")


@objreg.hookimpl
def objreg_objective_info() -> objreg.ObjectiveInfo:
    return objreg.ObjectiveInfo(
        name=NAME,
        description="Per-word tagging from the first subword: CoNLL or JSONL files, or built-in lexical tags",
        kind="downstream",
        attention="bidirectional",
        heads=(objreg.HeadSpec(HEAD, "token_classifier", MAX_TAGS),),
        params=(
            objreg.Param("tokens_field", "", "JSONL key of the word list; empty: tokens or words", str),
            objreg.Param("tags_field", "", "JSONL key of the tag list; empty: tags, ner_tags, pos_tags or labels", str),
            objreg.Param(
                "labels",
                "",
                "Comma-separated tag set in class order; empty: read from the data "
                "(numeric order when every tag is an integer, else alphabetical)",
                str,
            ),
            objreg.Param(
                "label_all_tokens",
                False,
                "Label every subword with its word's tag, not only the first "
                "(Hugging Face run_ner.py label_all_tokens)",
                bool,
            ),
        ),
        references=(
            "Devlin et al. 2019, BERT (§5.3: the first sub-token of each word feeds the token classifier)",
            "Hugging Face transformers examples/pytorch/token-classification/run_ner.py (tokenize_and_align_labels)",
            "Tjong Kim Sang & De Meulder 2003, CoNLL-2003 shared task (the column file format)",
        ),
        min_seq_len=3,
    )


# -- sentences and rows -------------------------------------------------------------------------


@dataclass(frozen=True)
class _Sentence:
    """One tagged sentence of a file (or of the built-in set): where it starts, words, tags."""

    line: int
    words: tuple[str, ...]
    tags: tuple[str, ...]


@dataclass
class _Dropped:
    """What row building had to leave out, for one warning."""

    untokenised_words: int = 0
    truncated_sentences: int = 0
    empty_sentences: int = 0


def _assemble(
    sentences: Sequence[_Sentence],
    tokenizer: objreg.Tokenizer,
    tag_ids: Mapping[str, int],
    seq_len: int,
    label_all_tokens: bool,
    dropped: _Dropped,
) -> objreg.CorruptedBatch | None:
    """Rows ``[CLS] subwords [SEP]`` with the tag at each word's first subword (every subword with
    ``label_all_tokens``), cut to ``seq_len``; ``None`` when no sentence has a token."""
    vocab = tokenizer.vocab
    words = [w for s in sentences for w in s.words]
    pieces = iter(ids for ids, _ in tokenizer.encode_sentences(words))  # one word at a time
    rows = []
    for sentence in sentences:
        ids, labels, word_ids = [vocab.cls_id], [objreg.IGNORE_INDEX], [-1]
        for w, tag in enumerate(sentence.tags):
            subwords = next(pieces)
            if not subwords:  # e.g. a control character the normaliser drops: the word has no token
                dropped.untokenised_words += 1
                continue
            ids += subwords
            labels += [tag_ids[tag]] + [tag_ids[tag] if label_all_tokens else objreg.IGNORE_INDEX] * (len(subwords) - 1)
            word_ids += [w] * len(subwords)
        if len(ids) == 1:
            dropped.empty_sentences += 1
            continue
        if len(ids) > seq_len - 1:
            dropped.truncated_sentences += 1
            ids, labels, word_ids = ids[: seq_len - 1], labels[: seq_len - 1], word_ids[: seq_len - 1]
        rows.append((ids + [vocab.sep_id], labels + [objreg.IGNORE_INDEX], word_ids + [-1]))
    if not rows:
        return None
    B, T = len(rows), max(len(r[0]) for r in rows)
    input_ids = torch.full((B, T), vocab.pad_id, dtype=torch.long)
    labels_t = torch.full((B, T), objreg.IGNORE_INDEX, dtype=torch.long)
    word_ids_t = torch.full((B, T), -1, dtype=torch.long)
    is_padding = torch.ones(B, T, dtype=torch.bool)
    for b, (ids, labels, word_ids) in enumerate(rows):
        n = len(ids)
        input_ids[b, :n] = torch.tensor(ids)
        labels_t[b, :n] = torch.tensor(labels)
        word_ids_t[b, :n] = torch.tensor(word_ids)
        is_padding[b, :n] = False
    rows_index = torch.arange(B)[:, None].expand(B, T)
    return objreg.CorruptedBatch(
        input_ids=input_ids,
        labels=labels_t,
        is_padding=is_padding,
        position_ids=torch.arange(T).repeat(B, 1),
        document_ids=torch.where(is_padding, -1, rows_index),
        extras={
            "num_tags": torch.full((B,), len(tag_ids), dtype=torch.long),
            "word_ids": word_ids_t,  # the word's index in its sentence, -1 at [CLS], [SEP] and padding
        },
    )


def _warn(where: str, dropped: _Dropped, seq_len: int) -> None:
    if dropped.untokenised_words:
        warnings.warn(
            f"{where}: dropped {dropped.untokenised_words} words that the tokenizer turns into no token "
            f"(their tags are lost)",
            stacklevel=3,
        )
    if dropped.truncated_sentences:
        warnings.warn(
            f"{where}: cut {dropped.truncated_sentences} sentences longer than seq_len {seq_len}; "
            f"the tags of their last words are lost",
            stacklevel=3,
        )


# -- the built-in lexical tagging ----------------------------------------------------------------


def builtin_tag(word: str) -> str:
    """The built-in tag of one word (see the module docstring); independent of case."""
    if not re.search(r"\w", word):
        return "PUNCT"
    if _NUMBER.fullmatch(word):
        return "NUM"
    has_letter, has_digit = re.search(r"[^\W\d_]", word), re.search(r"\d", word)
    dotted = "." in word and any(len(part) > 1 for part in word.removesuffix("()").split("."))
    if "_" in word or word.endswith("()") or dotted or (has_letter and has_digit):
        return "CODE"
    if word.lower() in FUNCTION_WORDS:
        return "FUNC"
    return "WORD"


def builtin_words(sentence: str) -> list[str]:
    """The built-in set's words of a sentence."""
    return _WORD.findall(sentence)


def _round_robin(documents: Sequence[Sequence[str]], limit: int) -> list[str]:
    """Sentences one document after another in turn, so a small ``limit`` spans documents."""
    out: list[str] = []
    for s in range(max((len(d) for d in documents), default=0)):
        for doc in documents:
            if s < len(doc):
                out.append(doc[s])
                if len(out) == limit:
                    return out
    return out


def builtin_task_data(
    documents: Sequence[Sequence[str]], tokenizer: objreg.Tokenizer, seq_len: int, limit: int, label_all_tokens: bool
) -> objreg.CorruptedBatch:
    sentences = []
    for text in _round_robin(documents, limit):
        words = builtin_words(text)
        if words:
            sentences.append(_Sentence(0, tuple(words), tuple(builtin_tag(w) for w in words)))
    dropped = _Dropped()
    tag_ids = {tag: i for i, tag in enumerate(BUILTIN_TAGS)}
    batch = _assemble(sentences, tokenizer, tag_ids, seq_len, label_all_tokens, dropped) if sentences else None
    if batch is None:
        raise objreg.DataError(
            f"too few held-out sentences to build the built-in token_classification set ({len(documents)} "
            f"documents, none with a word that has a token); pass --downstream-data with a CoNLL or JSONL file"
        )
    _warn("built-in token_classification set", dropped, seq_len)
    return batch


# -- reading CoNLL and JSONL files ----------------------------------------------------------------

_ALLOWED = (
    "allowed: CoNLL style (one 'token<TAB>tag' per line, the tag in the last column, a blank line between "
    'sentences) or JSONL lines like {"tokens": ["EU", "rejects"], "tags": ["B-ORG", "O"]}'
)


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` of a UTF-8 file without line endings; clear errors for a missing
    file or bytes that are not UTF-8. Split on newlines only, so line numbers match an editor's."""
    if not path.is_file():
        what = "is a directory, not a file" if path.is_dir() else "does not exist"
        raise objreg.DataError(f"token_classification data file {path} {what}; {_ALLOWED}")
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError as e:
                raise objreg.DataError(
                    f"{path} line {number}: not UTF-8 text (byte {e.start}); save it as UTF-8"
                ) from None
            yield number, line.rstrip("\n").rstrip("\r")


def _read_conll(path: Path) -> list[_Sentence]:
    sentences: list[_Sentence] = []
    words: list[str] = []
    tags: list[str] = []
    first = 0
    for number, line in [*_lines(path), (0, "")]:  # a final blank line closes the last sentence
        columns = line.split()
        if columns and columns[0] == DOCSTART:
            columns = []  # a document boundary ends the sentence, like a blank line
        if not columns:
            if words:
                sentences.append(_Sentence(first, tuple(words), tuple(tags)))
            words, tags = [], []
            continue
        if len(columns) < 2:
            raise objreg.DataError(
                f"{path} line {number}: {line.strip()!r} has no tag: expected a token and its tag separated by a "
                f"tab or spaces; {_ALLOWED}"
            )
        if not words:
            first = number
        words.append(columns[0])
        tags.append(columns[-1])
    return sentences


def _json_type(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", int: "integer", float: "number", bool: "boolean"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def _field(path: Path, record: Mapping[str, Any], number: int, given: str, usual: Sequence[str], what: str) -> str:
    if given:
        if given not in record:
            raise objreg.DataError(
                f"{path} line {number}: no {given!r} field ({what}_field); its fields: "
                f"{', '.join(map(repr, record)) or 'none'}"
            )
        return given
    found = [key for key in usual if key in record]
    if not found:
        raise objreg.DataError(
            f"{path} line {number}: no {what} list (its fields: {', '.join(map(repr, record)) or 'none'}); "
            f"expected one of {', '.join(usual)}, or name it with the {what}_field parameter. {_ALLOWED}"
        )
    return found[0]


def _read_jsonl(path: Path, params: Mapping[str, Any], empty: list[int]) -> list[_Sentence]:
    sentences = []
    keys: tuple[str, str] | None = None
    for number, line in _lines(path):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise objreg.DataError(
                f"{path} line {number}: not valid JSON ({e.msg}, column {e.colno}); {_ALLOWED}"
            ) from None
        if not isinstance(record, dict):
            raise objreg.DataError(f"{path} line {number}: a JSON {_json_type(record)}, not an object; {_ALLOWED}")
        if keys is None:
            keys = (
                _field(path, record, number, params["tokens_field"], TOKENS_FIELDS, "tokens"),
                _field(path, record, number, params["tags_field"], TAGS_FIELDS, "tags"),
            )
        words, tags = (record.get(key) for key in keys)
        for key, value in zip(keys, (words, tags)):
            if key not in record:
                raise objreg.DataError(f"{path} line {number}: no {key!r} field, which the first record has")
            if not isinstance(value, list):
                raise objreg.DataError(f"{path} line {number}: {key!r} must be a list, got {_json_type(value)}")
        for word in words:
            if not isinstance(word, str) or not word.strip():
                got = "an empty string" if isinstance(word, str) else f"a JSON {_json_type(word)}"
                raise objreg.DataError(
                    f"{path} line {number}: {keys[0]!r} holds {got}; every token is a non-empty string"
                )
        for tag in tags:
            if isinstance(tag, bool) or not isinstance(tag, (str, int)) or (isinstance(tag, str) and not tag.strip()):
                got = "an empty string" if isinstance(tag, str) else f"a JSON {_json_type(tag)} ({json.dumps(tag)})"
                raise objreg.DataError(
                    f"{path} line {number}: {keys[1]!r} holds {got}; a tag must be a non-empty string or an integer"
                )
        if len(words) != len(tags):
            raise objreg.DataError(
                f"{path} line {number}: {len(words)} tokens but {len(tags)} tags; each token needs one tag"
            )
        if not words:
            empty.append(number)
            continue
        sentences.append(_Sentence(number, tuple(words), tuple(str(t).strip() for t in tags)))
    if keys is None:
        raise objreg.DataError(f"{path}: the file is empty; {_ALLOWED}")
    return sentences


def _is_jsonl(path: Path) -> bool:
    """JSONL by suffix, or by a first non-blank line that opens a JSON object."""
    if path.suffix.lower() in (".jsonl", ".json", ".ndjson"):
        return True
    first = next((line for _, line in _lines(path) if line.strip()), "")
    return first.lstrip().startswith("{")


def tag_order(tags: Sequence[str]) -> list[str]:
    """The distinct tags in class order: numeric when every tag is an integer, else alphabetical."""
    distinct = set(tags)
    if all(re.fullmatch(r"[+-]?\d+", tag) for tag in distinct):
        return sorted(distinct, key=int)
    return sorted(distinct)


def read_sentences(path: Path, params: Mapping[str, Any]) -> tuple[list[_Sentence], list[str]]:
    """The tagged sentences of a CoNLL or JSONL file and the tag set in class order."""
    empty: list[int] = []
    sentences = _read_jsonl(path, params, empty) if _is_jsonl(path) else _read_conll(path)
    if empty:
        warnings.warn(f"{path}: skipped {len(empty)} records with no tokens (first: line {empty[0]})", stacklevel=3)
    if not sentences:
        raise objreg.DataError(f"{path}: no tagged sentence in the file; {_ALLOWED}")
    if params["labels"]:
        tags = [t.strip() for t in params["labels"].split(",") if t.strip()]
        allowed = set(tags)
        for sentence in sentences:
            unknown = next((t for t in sentence.tags if t not in allowed), None)
            if unknown is not None:
                raise objreg.DataError(
                    f"{path} line {sentence.line}: tag {unknown!r} is not in the labels parameter ({', '.join(tags)})"
                )
    else:
        tags = tag_order([t for s in sentences for t in s.tags])
    if len(tags) > MAX_TAGS:
        raise objreg.DataError(
            f"{path}: {len(tags)} distinct tags; the token_classification head has at most {MAX_TAGS}"
        )
    return sentences, tags


def _evenly_spaced(n: int, k: int) -> list[int]:
    """``k`` indices spread evenly over ``range(n)`` (all of them when ``k >= n``)."""
    k = min(k, n)
    return [i * n // k for i in range(k)]


def file_task_data(
    source: str, tokenizer: objreg.Tokenizer, seq_len: int, limit: int, params: Mapping[str, Any]
) -> objreg.CorruptedBatch:
    path = Path(source)
    sentences, tags = read_sentences(path, params)
    chosen = [sentences[i] for i in _evenly_spaced(len(sentences), limit)]
    dropped = _Dropped()
    tag_ids = {tag: i for i, tag in enumerate(tags)}
    batch = _assemble(chosen, tokenizer, tag_ids, seq_len, params["label_all_tokens"], dropped)
    _warn(str(path), dropped, seq_len)
    if batch is None:
        raise objreg.DataError(f"{path}: no sentence has a word the tokenizer turns into a token")
    return batch


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
        raise objreg.InvalidParameterError(f"token_classification: limit must be at least 1, got {limit}")
    if source is None:
        return builtin_task_data(documents, tokenizer, seq_len, limit, params["label_all_tokens"])
    return file_task_data(source, tokenizer, seq_len, limit, params)


@objreg.hookimpl
def objreg_attention_mask(batch: objreg.CorruptedBatch) -> torch.Tensor:
    return objreg.masks.bidirectional(batch.is_padding)


@objreg.hookimpl
def objreg_loss(outputs: objreg.ModelOutputs, batch: objreg.CorruptedBatch) -> torch.Tensor:
    """Mean cross-entropy over the row's labelled positions (padding excluded by position), each
    over the row's ``num_tags`` first logits. Fixed shapes, ``where`` and ``gather`` only, so it
    is vmap/jvp-safe; a row with no labelled position has loss 0."""
    logits = outputs.model.heads[HEAD](outputs.hidden)  # (B, T, C): C = MAX_TAGS
    C = logits.shape[-1]
    used = torch.arange(C, device=logits.device) < batch.extras["num_tags"][:, None]  # (B, C)
    # finfo.min rather than -inf: exp underflows to exactly 0, and no inf - inf NaN can appear.
    floor = torch.full((), torch.finfo(logits.dtype).min, dtype=logits.dtype, device=logits.device)
    masked = torch.where(used[:, None, :], logits, floor)  # (B, T, C)
    labelled = (batch.labels != objreg.IGNORE_INDEX) & ~batch.is_padding  # (B, T)
    target = torch.where(labelled, batch.labels, 0)  # (B, T): any valid class where unlabelled
    picked = masked.gather(2, target[..., None]).squeeze(2)  # (B, T)
    nll = torch.where(labelled, torch.logsumexp(masked, dim=2) - picked, 0.0)  # (B, T)
    return nll.sum(dim=1) / labelled.sum(dim=1).clamp(min=1)  # (B,)
