"""objreg's own WordPiece tokenizers: the special-token layout (the BERT five, span sentinels,
named markers), training one on a corpus, and loading one from a ``vocab.txt``.

Training is objreg's own (:func:`train_wordpiece_vocab`), not ``tokenizers``' ``WordPieceTrainer``:
that trainer breaks ties between equally frequent pairs by ids handed out in hash-map order, so two
trainings on the same text differ (on WikiText-2's validation split, 6 of 8,000 tokens and about
900 ids; tokenizers#1794), even single-threaded. Ours runs the same algorithm (BPE merges with a
``##`` continuation prefix, the vocabulary built as WordPiece) with every order fixed: words are
counted by a plain count over the normalised, pre-tokenised text; the alphabet and the ``##``
pieces are sorted by code point; the most frequent pair wins and ties go to the pair of the
lowest ids. The result depends on the text alone. docs/reliability.md says why.
"""

from __future__ import annotations

import bisect
import heapq
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

from objreg.toolkit.tokenizer import Tokenizer

#: Special tokens of tokenizers objreg trains itself, in id order: the BERT five first, then span
#: sentinels (T5, UL2, BART infilling) and named markers (UL2 modes, FIM, end of text).
BASE_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


SENTINELS = tuple(f"[S{i}]" for i in range(64))


NAMED_SPECIALS = ("[EOS]", "[NLU]", "[NLG]", "[S2S]", "[FIM_PREFIX]", "[FIM_MIDDLE]", "[FIM_SUFFIX]", "[FIM_PAD]")

#: Every special token of the layout, in id order.
SPECIALS = (*BASE_SPECIALS, *SENTINELS, *NAMED_SPECIALS)
CONTINUATION = "##"
#: Sentences normalised and pre-tokenised per call: one call per sentence would cost more than the
#: counting itself; one call for the whole corpus would hold it twice in memory.
_CHUNK = 2048


def wordpiece_tokenizer(backend: object, name: str) -> Tokenizer:
    """Wrap a backend built with the default special-token layout."""
    return Tokenizer(
        backend, pad="[PAD]", unk="[UNK]", cls="[CLS]", sep="[SEP]", mask="[MASK]",
        sentinels=SENTINELS, named=NAMED_SPECIALS, name=name,
    )


def _bert_style_backend(model: object) -> object:
    """A lower-casing BERT pipeline (normaliser, pre-tokeniser, decoder) around a WordPiece model."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, normalizers, pre_tokenizers

    backend = Backend(model)
    backend.normalizer = normalizers.BertNormalizer(lowercase=True)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece()
    return backend


def _from_vocab(tokens: Sequence[str], name: str, added_specials: bool = False) -> Tokenizer:
    """The tokenizer of a vocabulary in id order. ``added_specials``: register the special tokens
    as ``tokenizers`` added tokens too (as its trainer does), so one written literally in a text
    is read as that token."""
    from tokenizers import AddedToken, models

    vocab = {token: i for i, token in enumerate(tokens)}
    model = models.WordPiece(vocab=vocab, unk_token="[UNK]", max_input_chars_per_word=100)
    backend = _bert_style_backend(model)
    if added_specials:
        backend.add_special_tokens(  # type: ignore[attr-defined]
            [AddedToken(t, special=True, normalized=False) for t in SPECIALS if t in vocab]
        )
    return wordpiece_tokenizer(backend, name)


def count_words(texts: Iterable[str]) -> Counter[str]:
    """How often each word occurs in ``texts`` after the BERT pipeline's lower-casing normaliser
    and pre-tokeniser (the words a WordPiece vocabulary is trained on).

    The text is normalised in chunks of sentences, split at whitespace (after normalisation
    Python's and the pre-tokeniser's whitespace agree) and counted; only the distinct pieces go
    through the pre-tokeniser, once, which splits them further at punctuation.
    """
    from tokenizers import normalizers, pre_tokenizers

    from objreg.core.errors import InvalidParameterError

    normalizer = normalizers.BertNormalizer(lowercase=True)
    chunks: Counter[str] = Counter()
    block: list[str] = []
    for text in texts:
        if not isinstance(text, str):
            raise InvalidParameterError(f"a tokenizer is trained on texts (str), got a {type(text).__name__}")
        block.append(text)
        if len(block) == _CHUNK:
            chunks.update(normalizer.normalize_str("\n".join(block)).split())
            block.clear()
    if block:
        chunks.update(normalizer.normalize_str("\n".join(block)).split())
    distinct = sorted(chunks)
    starts, position = [], 0
    for chunk in distinct:
        starts.append(position)
        position += len(chunk) + 1
    counts: Counter[str] = Counter()
    for word, (begin, _) in pre_tokenizers.BertPreTokenizer().pre_tokenize_str("\n".join(distinct)):
        counts[word] += chunks[distinct[bisect.bisect_right(starts, begin) - 1]]
    return counts


def train_wordpiece_vocab(
    word_counts: Counter[str] | dict[str, int], vocab_size: int, specials: Sequence[str] = SPECIALS,
    min_frequency: int = 2,
) -> list[str]:
    """A WordPiece vocabulary (token strings in id order) trained on ``word_counts``.

    The algorithm of ``tokenizers``' WordPiece trainer (BPE merges, ``##`` marking a piece that
    continues a word), every order fixed: ``specials`` first, then every character that starts a
    word or occurs at all, sorted by code point, then the ``##`` form of every character that
    occurs inside a word, sorted likewise; then merged pieces, in merge order, until
    ``vocab_size`` tokens or no pair occurs ``min_frequency`` times. Each merge takes the most
    frequent adjacent pair; a tie goes to the pair of lowest ids (left, then right).
    """
    tokens: list[str] = list(dict.fromkeys(specials))
    ids = {t: i for i, t in enumerate(tokens)}
    words = sorted(word_counts)
    alphabet = sorted({c for word in words for c in word})
    inner = sorted({c for word in words for c in word[1:]})
    for token in [*alphabet, *(CONTINUATION + c for c in inner)]:
        if token not in ids:
            ids[token] = len(tokens)
            tokens.append(token)
    counts = [int(word_counts[w]) for w in words]
    pieces = [[ids[w[0]], *(ids[CONTINUATION + c] for c in w[1:])] for w in words]

    pair_counts: dict[tuple[int, int], int] = {}
    where: dict[tuple[int, int], set[int]] = {}
    for index, (piece, count) in enumerate(zip(pieces, counts)):
        for pair in zip(piece, piece[1:]):
            pair_counts[pair] = pair_counts.get(pair, 0) + count
            where.setdefault(pair, set()).add(index)
    # A max-heap by count, ties to the lowest ids; entries whose count went stale are skipped.
    heap = [(-count, pair) for pair, count in pair_counts.items()]
    heapq.heapify(heap)
    while len(tokens) < vocab_size and heap:
        negative, pair = heapq.heappop(heap)
        count = pair_counts.get(pair, 0)
        if -negative != count or count <= 0:
            continue
        if count < min_frequency:
            break
        left, right = tokens[pair[0]], tokens[pair[1]]
        merged = left + right[len(CONTINUATION):] if right.startswith(CONTINUATION) else left + right
        new = ids.get(merged)
        if new is None:
            new = ids[merged] = len(tokens)
            tokens.append(merged)
        changed: dict[tuple[int, int], int] = {}
        for index in sorted(where.pop(pair, ())):
            piece, count = pieces[index], counts[index]
            merged_piece = _merge(piece, pair, new)
            if merged_piece is piece:
                continue
            for old in zip(piece, piece[1:]):
                changed[old] = changed.get(old, 0) - count
            for fresh in zip(merged_piece, merged_piece[1:]):
                changed[fresh] = changed.get(fresh, 0) + count
                where.setdefault(fresh, set()).add(index)
            pieces[index] = merged_piece
        for changed_pair, delta in changed.items():
            if delta:
                total = pair_counts.get(changed_pair, 0) + delta
                pair_counts[changed_pair] = total
                if total > 0:
                    heapq.heappush(heap, (-total, changed_pair))
        pair_counts.pop(pair, None)
    return tokens


def _merge(piece: list[int], pair: tuple[int, int], new: int) -> list[int]:
    """``piece`` with every non-overlapping occurrence of ``pair`` (left to right) replaced by
    ``new``; ``piece`` itself when it has none."""
    a, b = pair
    out: list[int] = []
    i, n, found = 0, len(piece), False
    while i < n:
        if i + 1 < n and piece[i] == a and piece[i + 1] == b:
            out.append(new)
            i += 2
            found = True
        else:
            out.append(piece[i])
            i += 1
    return out if found else piece


def train_wordpiece(
    texts: Iterable[str], vocab_size: int = 8000, name: str = "wordpiece", min_frequency: int = 2
) -> Tokenizer:
    """Train a lower-cased BERT-style WordPiece tokenizer on ``texts``. Special tokens get the
    first ids, in the order of ``BASE_SPECIALS + SENTINELS + NAMED_SPECIALS``.

    Reproducible: the same texts give the same vocabulary, in the same id order, on every machine
    and in every process (:func:`train_wordpiece_vocab`).
    """
    from objreg.core.errors import InvalidParameterError

    if isinstance(texts, str):
        raise InvalidParameterError("train_wordpiece takes a list of texts, not a single string")
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < len(SPECIALS):
        raise InvalidParameterError(
            f"vocab_size must be an integer ≥ {len(SPECIALS)} (the special tokens), got {vocab_size!r}"
        )
    tokens = train_wordpiece_vocab(count_words(texts), vocab_size, min_frequency=min_frequency)
    return _from_vocab(tokens, name, added_specials=True)


def wordpiece_from_vocab(path: str | Path, name: str) -> Tokenizer:
    """The BERT-style WordPiece tokenizer for a ``vocab.txt`` file (one token per line, id = line
    number) with objreg's special-token layout."""
    return _from_vocab(Path(path).read_text(encoding="utf-8").splitlines(), name)
