"""qa: extractive span question answering, the downstream task of the gradient-alignment analysis.

Each example is one row ``[CLS] question [SEP] context [SEP]``; a span head predicts the start and
end token of the answer inside the context (Devlin et al. 2019). An unanswerable question
(SQuAD v2.0 ``"is_impossible": true``) points both at position 0, the ``[CLS]`` token, the
standard BERT handling.

Two sources of examples:

* ``--downstream-data PATH``: a SQuAD v1.1 / v2.0 JSON file (Rajpurkar et al. 2016), read by
  :func:`objreg.toolkit.squadfiles.read_squad`. The first answer of each question is the target.
  Up to ``limit`` questions, evenly spaced over the file.
* No path: a built-in **cloze** QA set built from held-out documents of the corpus, after Lewis
  et al. 2019 ("Unsupervised Question Answering by Cloze Translation", their identity-mapping
  baseline). For each sentence an answer span is picked by a fixed rule (a capitalised,
  non-sentence-initial word run or a number, else the longest content word), the question is that
  sentence with the answer replaced by the mask token, and the context is a window of sentences
  around it, *including the sentence itself*. So the question is the context sentence with one
  word masked: this is much easier than SQuAD (answering amounts to aligning the question with
  its copy in the context and reading off the gap). It still needs a span head reading the
  context, which is what the analysis measures transfer to; use real SQuAD data for claims about
  reading comprehension.

Long contexts are split into overlapping windows with a stride, as BERT's SQuAD fine-tuning
does (google-research/bert ``run_squad.py``, Hugging Face ``run_qa.py``): each window is one row
``[CLS] question [SEP] window [SEP]``; consecutive windows overlap by ``doc_stride`` tokens
(Hugging Face's default 128, capped at half a window so windows always advance). A window that does
not contain the whole answer points at ``[CLS]``, as in both references. ``limit`` counts rows
(windows), not questions.

About 360 lines, one module: the two sources of examples share the row layout, and a plugin
module loads no other plugin module (the import floors of docs/architecture.md); the file reading
is in :mod:`objreg.toolkit.squadfiles`.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import objreg
from objreg.toolkit.squadfiles import read_squad
from objreg.toolkit.taskfiles import evenly_spaced, round_robin

NAME = "qa"

#: Function words that never make a cloze answer (lower-cased).
STOPWORDS = frozenset(
    """a about above after again against all also although among an and another any are around as
    at be because been before being below between both but by can could did do does doing down
    during each either every few for from further had has have having he her here hers herself him
    himself his how however i if in into is it its itself just many may me might more most much
    must my myself neither no nor not now of off often on once only or other others our ours
    ourselves out over own same several she should since so some such than that the their theirs
    them themselves then there these they this those through thus to too under until up upon us
    very was we were what when where whether which while who whom whose why will with within
    without would yet you your yours yourself""".split()
)

# A word: letters or digits, with inner apostrophes or hyphens ("don't", "well-known").
_WORD = re.compile(r"[^\W_]+(?:['’-][^\W_]+)*")

@objreg.hookimpl
def objreg_objective_info() -> objreg.ObjectiveInfo:
    return objreg.ObjectiveInfo(
        name=NAME,
        description="Extractive span QA: SQuAD v1.1/v2.0 JSON, or built-in cloze questions from held-out text",
        kind="downstream",
        attention="bidirectional",
        heads=(objreg.HeadSpec("qa", "span"),),
        params=(
            objreg.Param("max_question_tokens", 32, "Longest question in tokens (longer ones are cut)", int, low=1),
            objreg.Param(
                "doc_stride", 128, "SQuAD files: overlap in tokens between consecutive windows of a long context "
                "(Hugging Face run_qa.py default; capped at half a window)", int, low=0,
            ),
            objreg.Param(
                "context_sentences", 2, "Built-in cloze set: sentences of context on each side of the question", int,
                low=0,
            ),
        ),
        references=(
            "Rajpurkar et al. 2016, SQuAD: 100,000+ Questions for Machine Comprehension of Text",
            "Lewis et al. 2019, Unsupervised Question Answering by Cloze Translation",
            "Devlin et al. 2019, BERT (span start/end head for SQuAD)",
        ),
        min_seq_len=8,
    )


# -- examples and rows --------------------------------------------------------------------------


@dataclass(frozen=True)
class _Example:
    """One question before framing: token ids and the answer's inclusive token span in the
    context (``None`` for an unanswerable question)."""

    question: list[int]
    context: list[int]
    answer: tuple[int, int] | None


def _token_span(offsets: Sequence[tuple[int, int]], start: int, end: int) -> tuple[int, int] | None:
    """Inclusive token span covering the characters ``[start, end)``: every token that overlaps
    them. ``None`` when no token does (an answer made only of whitespace or dropped characters)."""
    inside = [i for i, (a, b) in enumerate(offsets) if a < end and b > start]
    return (inside[0], inside[-1]) if inside else None


def _fit(example: _Example, seq_len: int) -> _Example | None:
    """Cut the context to what fits beside the question, keeping the answer inside (a window
    centred on it); ``None`` when even the answer alone does not fit. Used for the built-in cloze
    set, whose contexts are a few sentences around the question's own sentence."""
    budget = seq_len - 3 - len(example.question)  # [CLS] q [SEP] c [SEP]
    context = example.context
    if example.answer is None:
        return _Example(example.question, context[:budget], None) if budget >= 1 and context else None
    start, end = example.answer
    length = end - start + 1
    if budget < length:
        return None
    width = min(budget, len(context))
    first = min(max(start - (width - length) // 2, 0), len(context) - width)
    return _Example(example.question, context[first : first + width], (start - first, end - first))


def _windows(example: _Example, seq_len: int, doc_stride: int) -> list[_Example]:
    """The context split into windows that fit beside the question, overlapping by ``doc_stride``
    tokens (at most half a window). The answer keeps its span in each window that holds all of
    it; other windows point at ``[CLS]`` (``answer=None``). Empty when not one context token fits."""
    budget = seq_len - 3 - len(example.question)  # [CLS] q [SEP] c [SEP]
    context = example.context
    if budget < 1 or not context:
        return []
    step = budget - min(doc_stride, budget // 2)
    windows = []
    for first in range(0, max(len(context) - budget, 0) + step, step):
        last = min(first + budget, len(context))  # exclusive
        answer = None
        if example.answer is not None and first <= example.answer[0] and example.answer[1] < last:
            answer = (example.answer[0] - first, example.answer[1] - first)
        windows.append(_Example(example.question, context[first:last], answer))
        if last == len(context):
            break
    return windows


def _assemble(examples: Sequence[_Example], vocab: objreg.Vocabulary) -> objreg.CorruptedBatch:
    """Frame each example as ``[CLS] question [SEP] context [SEP]`` and right-pad to the longest row."""
    B = len(examples)
    T = max(len(e.question) + len(e.context) + 3 for e in examples)
    input_ids = torch.full((B, T), vocab.pad_id, dtype=torch.long)
    is_padding = torch.ones(B, T, dtype=torch.bool)
    context_mask = torch.zeros(B, T, dtype=torch.bool)
    start_positions = torch.zeros(B, dtype=torch.long)  # 0 = [CLS]: unanswerable
    end_positions = torch.zeros(B, dtype=torch.long)
    for b, e in enumerate(examples):
        ids = [vocab.cls_id, *e.question, vocab.sep_id, *e.context, vocab.sep_id]
        first = len(e.question) + 2  # row index of the first context token
        n = len(ids)
        input_ids[b, :n] = torch.tensor(ids)
        is_padding[b, :n] = False
        context_mask[b, first : first + len(e.context)] = True
        if e.answer is not None:
            start_positions[b] = first + e.answer[0]
            end_positions[b] = first + e.answer[1]
    rows = torch.arange(B)[:, None].expand(B, T)
    return objreg.CorruptedBatch(
        input_ids=input_ids,
        labels=torch.full((B, T), objreg.IGNORE_INDEX, dtype=torch.long),
        is_padding=is_padding,
        position_ids=torch.arange(T).repeat(B, 1),
        document_ids=torch.where(is_padding, -1, rows),
        extras={
            "start_positions": start_positions,
            "end_positions": end_positions,
            "context_mask": context_mask,
        },
    )


# -- the built-in cloze set ---------------------------------------------------------------------


def cloze_answer(sentence: str) -> tuple[int, int] | None:
    """Character span ``[start, end)`` of the cloze answer in ``sentence``, or ``None``.

    First choice, named-entity-like: the first number, or the first capitalised word that does
    not open the sentence (extended over the capitalised words that follow it, so "Johannes
    Brahms" stays whole). Otherwise the longest content word of at least 5 letters (the first of
    equal length). Stopwords never qualify.
    """
    words = [m for m in _WORD.finditer(sentence) if m.group().lower() not in STOPWORDS]
    for i, m in enumerate(words):
        word = m.group()
        if word.isdigit():
            return m.span()
        if word[0].isupper() and m.start() > _first_word_start(sentence):
            end = m.end()
            for following in words[i + 1 :]:
                if sentence[end:following.start()] != " " or not following.group()[0].isupper():
                    break
                end = following.end()
            return m.start(), end
    content = [m for m in words if m.group().isalpha() and len(m.group()) >= 5]
    if not content:
        return None
    best = max(content, key=lambda m: len(m.group()))  # max keeps the first of equal length
    return best.span()


def _first_word_start(sentence: str) -> int:
    first = _WORD.search(sentence)
    return first.start() if first else 0


def _cloze_question(sentence: str, span: tuple[int, int], tokenizer: objreg.Tokenizer, max_tokens: int) -> list[int]:
    """The sentence with the answer replaced by the mask token, cut to ``max_tokens`` around the
    mask. The two sides are encoded apart and the mask id put between them, which is what
    encoding ``left + "[MASK]" + right`` gives, without relying on the backend to recognise the
    mask string in text."""
    left = tokenizer.encode_with_offsets(sentence[: span[0]])[0]
    right = tokenizer.encode_with_offsets(sentence[span[1] :])[0]
    ids = [*left, tokenizer.vocab.mask_id, *right]
    first = min(max(len(left) - max_tokens // 2, 0), max(len(ids) - max_tokens, 0))
    return ids[first : first + max_tokens]


def _cloze_examples(
    document: Sequence[str], tokenizer: objreg.Tokenizer, seq_len: int, params: Mapping[str, Any]
) -> Iterator[_Example]:
    """The cloze questions of one document, in sentence order, already fitted to ``seq_len``."""
    width = params["context_sentences"]
    max_question = params["max_question_tokens"]
    for i, sentence in enumerate(document):
        span = cloze_answer(sentence)
        if span is None:
            continue
        question = _cloze_question(sentence, span, tokenizer, max_question)
        # The context: neighbouring sentences joined by spaces; the answer keeps its offset
        # inside sentence i, shifted by the text before it.
        before = list(document[max(i - width, 0) : i])
        after = list(document[i + 1 : i + 1 + width])
        shift = sum(len(s) + 1 for s in before)
        context = " ".join([*before, sentence, *after])
        ids, offsets = tokenizer.encode_with_offsets(context)
        answer = _token_span(offsets, shift + span[0], shift + span[1])
        if answer is None:
            continue
        fitted = _fit(_Example(question, ids, answer), seq_len)
        if fitted is not None:
            yield fitted


def cloze_task_data(
    documents: Sequence[Sequence[str]], tokenizer: objreg.Tokenizer, seq_len: int, limit: int,
    params: Mapping[str, Any],
) -> objreg.CorruptedBatch:
    streams = [_cloze_examples(doc, tokenizer, seq_len, params) for doc in documents]
    examples = round_robin(streams, limit)  # one example from each document in turn
    if not examples:
        sentences = sum(len(d) for d in documents)
        raise objreg.DataError(
            f"too few held-out documents to build the built-in qa set ({len(documents)} documents, "
            f"{sentences} sentences gave no cloze question that fits seq_len {seq_len}); "
            f"pass --downstream-data with a SQuAD v1.1/v2.0 JSON file"
        )
    return _assemble(examples, tokenizer.vocab)


# -- SQuAD files ----------------------------------------------------------------------------------


def squad_task_data(
    source: str, tokenizer: objreg.Tokenizer, seq_len: int, limit: int, params: Mapping[str, Any]
) -> objreg.CorruptedBatch:
    """Up to ``limit`` rows: the windows of ``limit`` questions at evenly spaced indices over the
    file's usable questions (those whose answer text matches the context), thinned evenly to
    ``limit`` when long contexts gave more windows, so a small limit still samples every article."""
    path = Path(source)
    squad = read_squad(path)
    contexts, questions = squad.contexts, squad.questions
    encodings: dict[int, tuple[list[int], list[tuple[int, int]]]] = {}  # many questions share a paragraph
    examples: list[_Example] = []
    too_long = untokenised = 0
    for index in evenly_spaced(len(questions), limit):
        item = questions[index]
        if item.paragraph not in encodings:
            encodings[item.paragraph] = tokenizer.encode_with_offsets(contexts[item.paragraph])
        context_ids, offsets = encodings[item.paragraph]
        answer = None if item.answer is None else _token_span(offsets, *item.answer)
        if item.answer is not None and answer is None:
            untokenised += 1  # an answer the tokenizer drops entirely must not become "unanswerable"
            continue
        question = tokenizer.encode_with_offsets(item.question)[0][: params["max_question_tokens"]]
        windows = _windows(_Example(question, context_ids, answer), seq_len, params["doc_stride"])
        if not windows:
            too_long += 1
        examples.extend(windows)
    if len(examples) > limit:
        examples = [examples[i] for i in evenly_spaced(len(examples), limit)]
    if squad.mismatched:
        warnings.warn(
            f"{path}: skipped {len(squad.mismatched)} questions whose answer text does not match the context "
            f"at answer_start (first: {squad.mismatched[0]})",
            stacklevel=2,
        )
    if not examples:
        total = len(questions) + len(squad.mismatched) + len(squad.no_answer)
        raise objreg.DataError(
            f"{path}: no usable qa example ({total} questions; {len(squad.mismatched)} with an answer text "
            f"that does not match the context at answer_start, {len(squad.no_answer)} with no answer and no "
            f'"is_impossible": true, {untokenised} whose answer has no tokens, {too_long} whose question '
            f"leaves no room for context in seq_len {seq_len}). Each answerable question needs context[answer_start:answer_start + len(text)] "
            f"== text"
        )
    return _assemble(examples, tokenizer.vocab)


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
    if source is None:
        return cloze_task_data(documents, tokenizer, seq_len, limit, params)
    return squad_task_data(source, tokenizer, seq_len, limit, params)


@objreg.hookimpl
def objreg_attention_mask(batch: objreg.CorruptedBatch) -> objreg.AttentionMask:
    return objreg.AttentionMask.bidirectional(batch.is_padding)


@objreg.hookimpl
def objreg_loss(outputs: objreg.ModelOutputs, batch: objreg.CorruptedBatch) -> torch.Tensor:
    """Mean of the start and end cross-entropies over the allowed positions: the context tokens
    and position 0 ([CLS], the target of unanswerable questions). Written with ``where``,
    ``logsumexp`` and ``gather`` so it is vmap/jvp-safe."""
    logits = outputs.model.heads["qa"](outputs.hidden)  # (B, T, 2): start, end
    T = logits.shape[1]
    is_cls = torch.arange(T, device=logits.device) == 0  # (T,)
    allowed = batch.extras["context_mask"] | is_cls  # (B, T)
    # finfo.min rather than -inf: exp underflows to exactly 0, and no inf - inf NaN can appear.
    floor = torch.full((), torch.finfo(logits.dtype).min, dtype=logits.dtype, device=logits.device)
    masked = torch.where(allowed[..., None], logits, floor)  # (B, T, 2)
    targets = torch.stack([batch.extras["start_positions"], batch.extras["end_positions"]], dim=-1)  # (B, 2)
    picked = masked.gather(1, targets[:, None, :]).squeeze(1)  # (B, 2)
    nll = torch.logsumexp(masked, dim=1) - picked  # (B, 2)
    return nll.mean(dim=-1)  # (B,)


#: The longest answer span the metrics consider, in tokens (Hugging Face run_qa.py's default).
MAX_ANSWER_TOKENS = 30


@objreg.hookimpl
def objreg_task_metrics(outputs: objreg.ModelOutputs, batch: objreg.CorruptedBatch) -> dict[str, torch.Tensor]:
    """Exact match and F1 of each row's best span (start ≤ end, at most ``MAX_ANSWER_TOKENS``
    tokens, inside the context, or ``[CLS]`` for no answer) against the labelled span, by token
    positions within the row: SQuAD's metrics read on tokens of one window, not the official
    script's normalised words over a question's windows."""
    logits = outputs.model.heads["qa"](outputs.hidden).float()  # (B, T, 2)
    T = logits.shape[1]
    positions = torch.arange(T, device=logits.device)
    allowed = batch.extras["context_mask"] | (positions == 0)  # (B, T)
    start = logits[..., 0].masked_fill(~allowed, float("-inf"))
    end = logits[..., 1].masked_fill(~allowed, float("-inf"))
    length = positions[None, :] - positions[:, None]  # (T, T): end - start
    starts_in_context = positions[:, None] > 0
    valid = starts_in_context & (length >= 0) & (length < MAX_ANSWER_TOKENS)
    valid = valid | ((positions[:, None] == 0) & (positions[None, :] == 0))  # [CLS] alone: no answer
    spans = (start[:, :, None] + end[:, None, :]).masked_fill(~valid, float("-inf"))  # (B, T, T)
    best = spans.flatten(1).argmax(dim=1)
    pred_start, pred_end = best // T, best % T
    gold_start, gold_end = batch.extras["start_positions"], batch.extras["end_positions"]
    exact = (pred_start == gold_start) & (pred_end == gold_end)
    overlap = (torch.minimum(pred_end, gold_end) - torch.maximum(pred_start, gold_start) + 1).clamp(min=0).float()
    predicted = (pred_end - pred_start + 1).float()
    gold = (gold_end - gold_start + 1).float()
    f1 = torch.where(overlap > 0, 2 * overlap / (predicted + gold), torch.zeros_like(overlap))
    # No answer ([CLS] at 0) is right only when the label is no answer too (SQuAD 2.0's rule).
    f1 = torch.where((gold_start == 0) | (pred_start == 0), exact.float(), f1)
    return {"exact_match": exact.float(), "f1": f1}
