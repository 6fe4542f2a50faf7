"""The built-in cloze questions of the ``qa`` task: which span of a sentence is the answer, and the
question (the sentence with that span masked), after Lewis et al. 2019's identity-mapping
baseline ("Unsupervised Question Answering by Cloze Translation"). :mod:`.qa` builds the rows.
"""

from __future__ import annotations

import re

import objreg

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


def cloze_question(sentence: str, span: tuple[int, int], tokenizer: objreg.Tokenizer, max_tokens: int) -> list[int]:
    """The sentence with the answer replaced by the mask token, cut to ``max_tokens`` around the
    mask. The two sides are encoded apart and the mask id put between them, which is what
    encoding ``left + "[MASK]" + right`` gives, without relying on the backend to recognise the
    mask string in text."""
    left = tokenizer.encode_with_offsets(sentence[: span[0]])[0]
    right = tokenizer.encode_with_offsets(sentence[span[1] :])[0]
    ids = [*left, tokenizer.vocab.mask_id, *right]
    first = min(max(len(left) - max_tokens // 2, 0), max(len(ids) - max_tokens, 0))
    return ids[first : first + max_tokens]
