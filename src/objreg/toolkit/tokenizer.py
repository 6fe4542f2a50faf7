"""Tokenisation into :class:`TokenBatch` rows, on top of the ``tokenizers`` library.

A row is ``[CLS] sentence_1 sentence_2 ... [SEP]`` from consecutive sentences of one document,
right-padded to the batch's length. Word ids (for whole-word masking) come from the backend's
pre-tokeniser, so they work for any tokenizer, not only ``##`` WordPiece.

A document is encoded as one running text, its sentences joined by single spaces, and its tokens
are then cut at the sentence boundaries (:meth:`Tokenizer.encode_documents`): a row's tokens are
what the model's own tokenizer gives for that text. Encoding each sentence on its own would
differ for a byte-level BPE (GPT-2, RoBERTa, Llama 3), which keeps the space before a word in the
word's token (``ĠUnlike``): alone, a sentence's first word has no space and becomes other tokens
(``Un like``). For WordPiece and Metaspace tokenizers the two are the same.
"""

from __future__ import annotations

import re
import struct
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import accumulate, chain
from typing import Any

import torch

from objreg.core.errors import DataError, InvalidParameterError
from objreg.core.types import Corpus, TokenBatch, Vocabulary

# A sentence ends at . ! or ? followed by space and an upper-case letter, digit, quote or bracket.
# Deliberately simple: good enough for encyclopaedic and documentation prose; a corpus plugin
# with better needs can split sentences itself before building its Corpus.
_SENTENCE_END = re.compile(r"(?:(?<=[.!?])|(?<=[.!?][\"')\]]))\s+(?=[\"'(\[A-Z0-9])")


def split_sentences(text: str) -> list[str]:
    """Split prose into sentences; whitespace is normalised and empty pieces dropped."""
    text = " ".join(text.split())
    return [s.strip() for s in _SENTENCE_END.split(text) if s.strip()]


class Tokenizer:
    """A ``tokenizers.Tokenizer`` plus the special tokens objreg needs.

    Args:
        backend: The ``tokenizers.Tokenizer``; objreg adds special tokens itself, so the
            backend's post-processor is not used.
        pad, unk, cls, sep, mask: The special-token strings, which must be in the vocabulary.
        sentinels: Span sentinel tokens in order of use (T5's ``<extra_id_0>``, ...).
        named: Further special tokens objectives may look up by name (mode tokens, FIM markers):
            token strings, or a mapping from the name objectives use (``"[EOS]"``) to the token
            that stands for it in this vocabulary (e.g. BERT's ``"[unused0]"``).
        name: Shown in reports.
        architecture: The architecture of the model this tokenizer came with (``encoder``,
            ``decoder`` or ``encoder-decoder``, as ``objreg.Backbone.architecture``): downstream
            tasks built with a decoder-only model's tokenizer run causally (docs/models.md).
    """

    def __init__(
        self,
        backend: object,
        *,
        pad: str,
        unk: str,
        cls: str,
        sep: str,
        mask: str,
        sentinels: Sequence[str] = (),
        named: Sequence[str] | Mapping[str, str] = (),
        name: str = "",
        architecture: str = "encoder",
    ):
        self.backend = backend
        self.name = name
        self.architecture = architecture

        def token_id(token: str) -> int:
            value = backend.token_to_id(token)  # type: ignore[attr-defined]
            if value is None:
                raise InvalidParameterError(f"tokenizer {name!r} has no token {token!r} in its vocabulary")
            return int(value)

        named_tokens = dict(named) if isinstance(named, Mapping) else {t: t for t in named}
        named_ids = {key: token_id(t) for key, t in named_tokens.items()}
        core_ids = {k: token_id(t) for k, t in dict(pad=pad, unk=unk, cls=cls, sep=sep, mask=mask).items()}
        sentinel_ids = tuple(token_id(t) for t in sentinels)
        specials = set(core_ids.values()) | set(sentinel_ids) | set(named_ids.values())
        self.vocab = Vocabulary(
            size=backend.get_vocab_size(with_added_tokens=True),  # type: ignore[attr-defined]
            pad_id=core_ids["pad"],
            unk_id=core_ids["unk"],
            cls_id=core_ids["cls"],
            sep_id=core_ids["sep"],
            mask_id=core_ids["mask"],
            special_ids=tuple(sorted(specials)),
            sentinel_ids=sentinel_ids,
            named_ids=named_ids,
        )

    # -- encoding -------------------------------------------------------------------------------

    def encode_sentences(self, sentences: Sequence[str]) -> list[tuple[list[int], list[int]]]:
        """Token ids and word ids (within the sentence) of each sentence, no special tokens."""
        encodings = self.backend.encode_batch(list(sentences), add_special_tokens=False)  # type: ignore[attr-defined]
        out = []
        for enc in encodings:
            words = [-1 if w is None else w for w in enc.word_ids]
            out.append((list(enc.ids), words))
        return out

    def encode_documents(self, documents: Sequence[Sequence[str]]) -> list[list[tuple[list[int], list[int]]]]:
        """Token ids and word ids (within the sentence) of each sentence of each document, no
        special tokens, cut out of one encoding of the document's running text: its sentences,
        stripped, joined by single spaces (an empty sentence gets no tokens). A sentence starts at
        the first token of the word (the pre-tokeniser's) that holds its first character, so a space
        the tokenizer keeps with a word goes with that word (byte-level BPE's ``ĠUnlike``)."""
        texts, starts = [], []
        for document in documents:
            parts = [sentence.strip() for sentence in document]
            begin, at = [], 0
            for part in parts:
                begin.append(at if part else None)
                at += len(part) + 1 if part else 0
            texts.append(" ".join(part for part in parts if part))
            starts.append(begin)
        encodings = self.backend.encode_batch(texts, add_special_tokens=False)  # type: ignore[attr-defined]
        return [_cut(encoding, begin) for begin, encoding in zip(starts, encodings)]

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Token ids and their character offsets in ``text`` (no special tokens), for mapping
        character spans (e.g. SQuAD answers) to tokens."""
        encoding = self.backend.encode(text, add_special_tokens=False)  # type: ignore[attr-defined]
        return list(encoding.ids), [tuple(o) for o in encoding.offsets]

    def batch_from_documents(self, documents: Sequence[Sequence[str]], seq_len: int) -> TokenBatch:
        """One row per document: ``[CLS]`` + its sentences + ``[SEP]``, truncated to ``seq_len``."""
        rows = [_Chunk(i, tuple(sentences)) for i, sentences in enumerate(self.encode_documents(documents))]
        return self.assemble(rows, seq_len)

    def batch_from_texts(self, texts: Sequence[str], seq_len: int | None = None) -> TokenBatch:
        """One row per text, split into sentences. ``seq_len=None`` fits the longest text."""
        if isinstance(texts, str):
            raise InvalidParameterError("batch_from_texts takes a list of texts, not a single string")
        documents = [split_sentences(t) for t in texts]
        encoded = self.encode_documents(documents)
        if seq_len is None:
            seq_len = max((sum(len(ids) for ids, _ in d) + 2 for d in encoded), default=2)
        return self.assemble([_Chunk(i, tuple(d)) for i, d in enumerate(encoded)], seq_len)

    def assemble(self, chunks: Sequence[_Chunk], seq_len: int) -> TokenBatch:
        """Frame each chunk as ``[CLS] ... [SEP]``, truncate to ``seq_len``, pad to the longest row.

        Word ids continue across a chunk's sentences (each sentence's are shifted past the words
        before it); sentence ids number the chunk's sentences from 0. ``[CLS]``, ``[SEP]``, padding
        and any special token written literally in the text get word and sentence id ``-1``. A
        sentence may give ``None`` for its word ids (token ids only, as a ``group_texts`` row of
        a T5 pipeline): each of its tokens is then a word of its own, exactly as if it gave
        ``list(range(len(ids)))``.
        """
        if seq_len < 3:
            raise InvalidParameterError(f"seq_len must be at least 3 ([CLS] token [SEP]), got {seq_len}")
        if not chunks:
            raise InvalidParameterError("no texts to tokenise: a batch needs at least one row")
        # Python only flattens the lists and takes each sentence's word count; everything per
        # token is arithmetic on the flat batch. All integers cross into torch through one packed
        # buffer: struct.pack costs under half of array("q", ...) and a tenth of torch.tensor.
        sentences = [s for chunk in chunks for s in chunk.sentences]
        lengths = [len(ids) for ids, _ in sentences]
        given = [words for _, words in sentences if words is not None]
        if given:
            if [n for n, (_, w) in zip(lengths, sentences) if w is not None] != [len(w) for w in given]:
                raise DataError("each sentence of a chunk needs exactly one word id per token id")
            words_in = [n if w is None else max(w, default=-1) + 1 for n, (_, w) in zip(lengths, sentences)]
            word_lists = [range(n) if w is None else w for n, (_, w) in zip(lengths, sentences)]
            words = list(chain.from_iterable(word_lists))
        else:  # token ids only: every token is a word of its own, and nothing per token to pack
            words_in, words = lengths, []
        per_row = [len(chunk.sentences) for chunk in chunks]
        documents = [chunk.document for chunk in chunks]
        S, B = len(sentences), len(chunks)
        if not given and S == B and lengths[0] > 0 and lengths.count(lengths[0]) == B and per_row.count(1) == B:
            return self._assemble_equal([ids for ids, _ in sentences], documents, seq_len)
        ids = list(chain.from_iterable(ids for ids, _ in sentences))
        N = len(ids)
        integers = ids + words + lengths + words_in + per_row + documents
        flat = torch.frombuffer(bytearray(struct.pack(f"{len(integers)}q", *integers)), dtype=torch.long)
        token_id = flat[:N]
        rest = flat[N + len(words) :]
        counts = rest[: 2 * S].view(2, S)  # tokens and words of each sentence
        row_sentences, document = rest[2 * S : -B], rest[-B:]
        v = self.vocab
        T_max = seq_len - 2  # content tokens a row keeps

        # Per sentence: its row, its index in the row, and the tokens and words before it in its
        # row (exclusive cumulative sums, less those before the row's first sentence).
        row = torch.repeat_interleave(torch.arange(B), row_sentences)  # (S,)
        first = (row_sentences.cumsum(0) - row_sentences).index_select(0, row)  # (S,): the row's first sentence
        before = counts.cumsum(1) - counts  # (2, S): tokens and words before, over the whole batch
        first_before = before.index_select(1, first)  # (2, S)
        totals = torch.zeros(B, dtype=torch.long).index_add_(0, row, counts[0])  # (B,): content tokens
        truncated = int(totals.max()) > T_max
        length = totals.clamp_(max=T_max) + 2  # with [CLS] and [SEP]
        T = int(length.max())
        # Per token, from its sentence (one 1-D lookup per field): its column (1 + position in the
        # row's content), its place in the [B * T] planes, the word id shift and the sentence id.
        sentence = torch.repeat_interleave(counts[0])  # (N,): the sentence of each token
        column = torch.arange(N) + (1 - first_before[0]).index_select(0, sentence)  # (N,)
        where = column + (row * T).index_select(0, sentence)  # (N,)
        table = self._special_table()
        special = table.index_select(0, token_id.clamp(-1, table.shape[0] - 1))  # (N,): literal specials too
        # Each field is scattered into a [B * T] plane; truncated tokens go to a spare last slot.
        BT = B * T
        if truncated:
            where = torch.where(column <= T_max, where, BT)

        def plane(fill: int | bool, values: torch.Tensor) -> torch.Tensor:
            return torch.full((BT + 1,), fill, dtype=values.dtype).scatter_(0, where, values)[:BT].view(B, T)

        input_ids = plane(v.pad_id, token_id)
        input_ids[:, 0] = v.cls_id
        input_ids.scatter_(1, (length - 1)[:, None], v.sep_id)
        if given:
            word = flat[N : 2 * N]
            word_id = word + (before[1] - first_before[1]).index_select(0, sentence)
            word_ids = plane(-1, torch.where(special | (word < 0), -1, word_id))
        else:  # word id = the token's position in its row's content
            word_ids = plane(-1, torch.where(special, -1, column - 1))
        sentence_ids = plane(-1, torch.where(special, -1, (torch.arange(S) - first).index_select(0, sentence)))
        is_special = plane(True, special)  # [CLS], [SEP] and padding keep the fill
        is_padding = torch.arange(T)[None, :] >= length[:, None]  # (B, T)
        document_ids = torch.where(is_padding, -1, document[:, None])
        return TokenBatch(input_ids, is_padding, is_special, word_ids, sentence_ids, document_ids)

    def _assemble_equal(self, rows: list[list[int]], documents: list[int], seq_len: int) -> TokenBatch:
        """:meth:`assemble` of rows of token ids only, the same number of ids each (the rows of a
        ``group_texts`` pipeline): the same batch, built as ``[B, length]`` blocks instead of a
        scatter of every token. Each row is packed on its own, which spares the flat list of all
        the batch's ids (a third of the packing's cost)."""
        B, length = len(rows), len(rows[0])
        row = struct.Struct(f"{length}q")
        # Joined straight into a bytearray (writable, as torch.frombuffer wants): no copy of the bytes.
        packed = bytearray().join([*(row.pack(*ids) for ids in rows), struct.pack(f"{B}q", *documents)])
        flat = torch.frombuffer(packed, dtype=torch.long)
        n = min(length, seq_len - 2)  # content tokens a row keeps
        tokens = flat[: B * length].view(B, length)[:, :n]
        v = self.vocab
        T = n + 2
        input_ids = torch.empty(B, T, dtype=torch.long)
        input_ids[:, 0] = v.cls_id
        input_ids[:, 1 : n + 1] = tokens
        input_ids[:, n + 1] = v.sep_id
        table = self._special_table()
        special = table.index_select(0, tokens.clamp(-1, table.shape[0] - 1).flatten()).view(B, n)
        is_special = torch.ones(B, T, dtype=torch.bool)
        is_special[:, 1 : n + 1] = special
        word_ids = torch.full((B, T), -1, dtype=torch.long)
        sentence_ids = torch.full((B, T), -1, dtype=torch.long)
        if special.numpy().any():  # literal special tokens, whose word and sentence ids are -1
            drop = special.long()  # (B, n)
            word_ids[:, 1 : n + 1] = torch.arange(n) - drop * torch.arange(1, n + 1)  # position in the row, or -1
            sentence_ids[:, 1 : n + 1] = -drop
        else:
            word_ids[:, 1 : n + 1] = torch.arange(n)
            sentence_ids[:, 1 : n + 1] = 0
        is_padding = torch.zeros(B, T, dtype=torch.bool)
        document_ids = flat[B * length :, None].expand(B, T).clone()
        return TokenBatch(input_ids, is_padding, is_special, word_ids, sentence_ids, document_ids)

    def _special_table(self) -> torch.Tensor:
        """``[V + 1]`` bool, True at the special ids: a lookup is far cheaper than ``torch.isin``.
        Callers clamp ids to ``[-1, V]``; the last entry, False, answers for every id outside
        the vocabulary, at index ``V`` and at ``-1`` alike."""
        v = self.vocab
        cached = getattr(self, "_special_cache", None)
        if cached is None or cached[0] is not v:
            size = max(v.size, max(v.special_ids, default=-1) + 1)
            table = torch.zeros(size + 1, dtype=torch.bool)
            table[[i for i in v.special_ids if i >= 0]] = True
            cached = self._special_cache = (v, table)
        return cached[1]

    # -- decoding -------------------------------------------------------------------------------

    def tokens(self, ids: Sequence[int] | torch.Tensor) -> list[str]:
        """The token string of each id."""
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        return [self.backend.id_to_token(int(i)) or f"<{int(i)}>" for i in ids]  # type: ignore[attr-defined]

    def decode(self, ids: Sequence[int] | torch.Tensor, skip_special_tokens: bool = True) -> str:
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)  # type: ignore[attr-defined]


def _cut(encoding: Any, starts: Sequence[int | None]) -> list[tuple[list[int], list[int]]]:
    """One document's encoding cut into its sentences, which start at the characters ``starts``
    (``None``: an empty sentence); word ids renumbered from 0 in each sentence."""
    ids = encoding.ids
    words = [-1 if w is None else w for w in encoding.word_ids]
    cuts = [None if start is None else _first_token(encoding, words, start) for start in starts]
    stops, stop = [], len(ids)
    for cut in reversed(cuts):
        stops.append(stop)
        stop = stop if cut is None else cut
    sentences = []
    for cut, stop in zip(cuts, reversed(stops)):
        if cut is None:
            sentences.append(([], []))
            continue
        sentence_words = words[cut:stop]
        first = min((w for w in sentence_words if w >= 0), default=0)
        if first:
            sentence_words = [w - first if w >= 0 else -1 for w in sentence_words]
        sentences.append((ids[cut:stop], sentence_words))
    return sentences


def _first_token(encoding: Any, words: list[int], start: int) -> int:
    """The first token of the word that holds the character ``start`` (a word's space may be a
    token of its own, ``Ġ``, before the token of its first letter); where no token holds it (a
    character the tokenizer drops), the first token that ends after it."""
    token = encoding.char_to_token(start)
    if token is None:
        return bisect_left(list(accumulate((end for _, end in encoding.offsets), max)), start + 1)
    word = words[token]
    while token > 0 and word >= 0 and words[token - 1] == word:
        token -= 1
    return token


@dataclass(frozen=True)
class _Chunk:
    document: int
    sentences: tuple[tuple[list[int], list[int]], ...]

    @property
    def num_tokens(self) -> int:
        return sum(len(ids) for ids, _ in self.sentences)


class TokenizedCorpus:
    """A corpus tokenised once and cut into row-sized chunks of consecutive sentences.

    Each chunk holds whole sentences of one document and fits ``seq_len`` with ``[CLS]``/``[SEP]``
    (a single sentence longer than that is truncated). Batches are drawn with an explicit
    generator, so the same seed gives the same batches.
    """

    def __init__(self, tokenizer: Tokenizer, corpus: Corpus, seq_len: int):
        if not corpus.documents or corpus.num_sentences == 0:
            raise DataError(f"corpus {corpus.name!r} is empty: it has no text to train on")
        self.tokenizer = tokenizer
        self.corpus = corpus
        self.seq_len = seq_len
        budget = seq_len - 2
        chunks: list[_Chunk] = []
        for d, sentences in enumerate(tokenizer.encode_documents(corpus.documents)):
            current: list[tuple[list[int], list[int]]] = []
            used = 0
            for ids, words in sentences:
                if not ids:
                    continue
                if current and used + len(ids) > budget:
                    chunks.append(_Chunk(d, tuple(current)))
                    current, used = [], 0
                current.append((ids, words))
                used += len(ids)
            if current:
                chunks.append(_Chunk(d, tuple(current)))
        if not chunks:
            raise DataError(f"corpus {corpus.name!r} has no tokens after tokenisation")
        self.chunks = chunks
        self._sentence_counts = torch.tensor([len(c.sentences) for c in chunks])
        # How often each id occurs, for the inverse_frequency masking policy: objectives built with
        # this vocabulary (rather than tokenizer.vocab) can use it.
        ids = torch.tensor([i for c in chunks for s_ids, _ in c.sentences for i in s_ids], dtype=torch.long)
        self.vocab = replace(tokenizer.vocab, token_counts=torch.bincount(ids, minlength=tokenizer.vocab.size))

    def __len__(self) -> int:
        return len(self.chunks)

    def eligible(self, min_sentences: int = 1) -> torch.Tensor:
        """Indices of chunks with at least ``min_sentences`` sentences."""
        return torch.nonzero(self._sentence_counts >= min_sentences).flatten()

    def sample(self, batch_size: int, generator: torch.Generator, min_sentences: int = 1, what: str = "") -> TokenBatch:
        """``batch_size`` chunks drawn uniformly (without replacement when there are enough)."""
        pool = self.eligible(min_sentences)
        if len(pool) == 0:
            need = f" ({what} needs {min_sentences} sentences in one document window)" if what else ""
            raise DataError(
                f"corpus {self.corpus.name!r} is too short{need}: no window of seq_len {self.seq_len} "
                f"holds {min_sentences} sentences of one document"
            )
        if len(pool) >= batch_size:
            picks = pool[torch.randperm(len(pool), generator=generator)[:batch_size]]
        else:
            picks = pool[torch.randint(len(pool), (batch_size,), generator=generator)]
        return self.tokenizer.assemble([self.chunks[i] for i in picks.tolist()], self.seq_len)
