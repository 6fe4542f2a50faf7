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
  numeric order when every tag is an integer, else alphabetical, or fixed with ``labels``
  (:func:`objreg.toolkit.tagfiles.read_tagged`). Up to ``limit`` sentences, evenly spaced over
  the file.
* No path: a built-in **lexical tagging** of held-out sentences of the corpus, a deterministic
  stand-in for POS tagging that any tokenizer can see (it ignores case, which the default
  tokenizer lower-cases away). Words are runs of letters and digits (with inner ``.``, ``'`` or
  ``-`` and an optional trailing ``()``) or single punctuation marks, and each gets one of
  ``BUILTIN_TAGS``: ``PUNCT`` (no letter or digit), ``NUM`` (a number such as ``3.4`` or
  ``2,047``), ``CODE`` (an identifier: an underscore, a call ``f()``, a dotted name such as
  ``os.path`` or letters mixed with digits such as ``utf8``), ``FUNC`` (a function word from
  ``FUNCTION_WORDS``: determiners, pronouns, prepositions, conjunctions, auxiliaries) and ``WORD``
  (any other word); on prose WORD and FUNC dominate and NUM is rare. Telling CODE from WORD needs
  the subwords that follow the first one (``os`` in ``os . path``), so the tagger has to read
  context, not only the token itself.

The head has exactly as many outputs as the data has tags: the task returns it sized from the
data with the batch (:class:`objreg.TaskData`).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import objreg
from objreg.toolkit.losses import label_nll
from objreg.toolkit.tagfiles import TaggedSentence, read_tagged
from objreg.toolkit.taskfiles import evenly_spaced, round_robin

NAME = "token_classification"
HEAD = "token_classification"

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
        heads=(objreg.HeadSpec(HEAD, "token_classifier"),),  # sized from the data
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


# -- rows ----------------------------------------------------------------------------------------


@dataclass
class _Dropped:
    """What row building had to leave out, for one warning."""

    untokenised_words: int = 0
    truncated_sentences: int = 0
    empty_sentences: int = 0


def _assemble(
    sentences: Sequence[TaggedSentence],
    tokenizer: objreg.Tokenizer,
    tag_ids: Mapping[str, int],
    seq_len: int,
    label_all_tokens: bool,
    dropped: _Dropped,
) -> objreg.CorruptedBatch | None:
    """Rows ``[CLS] subwords [SEP]`` with the tag at each word's first subword (every subword with
    ``label_all_tokens``), cut to ``seq_len``; ``None`` when no sentence has a token."""
    vocab = tokenizer.vocab
    # Each word's tokens as they are in its sentence's running text (a byte-level BPE keeps the
    # space before a word in its first token; alone, the word would get other tokens).
    pieces = iter(ids for encoded in tokenizer.encode_documents([s.words for s in sentences]) for ids, _ in encoded)
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
            "word_ids": word_ids_t,  # the word's index in its sentence, -1 at [CLS], [SEP] and padding
        },
    )


def _task_data(batch: objreg.CorruptedBatch, num_tags: int) -> objreg.TaskData:
    """The batch and the token head sized to its tags."""
    return objreg.TaskData(batch, (objreg.HeadSpec(HEAD, "token_classifier", num_tags),))


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


def builtin_task_data(
    documents: Sequence[Sequence[str]], tokenizer: objreg.Tokenizer, seq_len: int, limit: int, label_all_tokens: bool
) -> objreg.TaskData:
    sentences = []
    for text in round_robin(documents, limit):  # one document after another, so a small limit spans them
        words = builtin_words(text)
        if words:
            sentences.append(TaggedSentence(0, tuple(words), tuple(builtin_tag(w) for w in words)))
    dropped = _Dropped()
    tag_ids = {tag: i for i, tag in enumerate(BUILTIN_TAGS)}
    batch = _assemble(sentences, tokenizer, tag_ids, seq_len, label_all_tokens, dropped) if sentences else None
    if batch is None:
        raise objreg.DataError(
            f"too few held-out sentences to build the built-in token_classification set ({len(documents)} "
            f"documents, none with a word that has a token); pass --downstream-data with a CoNLL or JSONL file"
        )
    _warn("built-in token_classification set", dropped, seq_len)
    return _task_data(batch, len(BUILTIN_TAGS))


def file_task_data(
    source: str, tokenizer: objreg.Tokenizer, seq_len: int, limit: int, params: Mapping[str, Any]
) -> objreg.TaskData:
    """Up to ``limit`` sentences of a CoNLL or JSONL file, evenly spaced over it."""
    path = Path(source)
    sentences, tags = read_tagged(path, params["tokens_field"], params["tags_field"], params["labels"])
    chosen = [sentences[i] for i in evenly_spaced(len(sentences), limit)]
    dropped = _Dropped()
    tag_ids = {tag: i for i, tag in enumerate(tags)}
    batch = _assemble(chosen, tokenizer, tag_ids, seq_len, params["label_all_tokens"], dropped)
    _warn(str(path), dropped, seq_len)
    if batch is None:
        raise objreg.DataError(f"{path}: no sentence has a word the tokenizer turns into a token")
    return _task_data(batch, len(tags))


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
        return builtin_task_data(documents, tokenizer, seq_len, limit, params["label_all_tokens"])
    return file_task_data(source, tokenizer, seq_len, limit, params)


@objreg.hookimpl
def objreg_attention_mask(batch: objreg.CorruptedBatch) -> objreg.AttentionMask:
    return objreg.AttentionMask.bidirectional(batch.is_padding)


@objreg.hookimpl
def objreg_loss(outputs: objreg.ModelOutputs, batch: objreg.CorruptedBatch) -> torch.Tensor:
    """Mean cross-entropy over the row's labelled positions (padding excluded by position); a row
    with no labelled position has loss 0. Fixed shapes, so it is vmap/jvp-safe."""
    logits = outputs.model.heads[HEAD](outputs.hidden)  # (B, T, C)
    labelled = (batch.labels != objreg.IGNORE_INDEX) & ~batch.is_padding  # (B, T)
    return label_nll(logits, batch.labels, labelled)  # (B,)
