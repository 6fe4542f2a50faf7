"""Sentence splitting, row framing, TokenizedCorpus chunking and sampling, vocab round trips."""

from __future__ import annotations

import random

import pytest
import torch

from objreg import Corpus, DataError, InvalidParameterError, ObjregError, TokenizedCorpus, split_sentences
from objreg.toolkit.tokenizer import _Chunk
from objreg.toolkit.wordpiece import BASE_SPECIALS, NAMED_SPECIALS, SENTINELS, wordpiece_from_vocab

# -- split_sentences ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Fruit, e.g. apples and pears, is sold. Then he left.", ["Fruit, e.g. apples and pears, is sold.", "Then he left."]),
        ("It costs approx. ten pounds, i.e. a lot.", ["It costs approx. ten pounds, i.e. a lot."]),
        ('She said "Stop." Then she left.', ['She said "Stop."', "Then she left."]),
        ("(See the note.) Next one.", ["(See the note.)", "Next one."]),
        ("It is a list [of things.] Another one.", ["It is a list [of things.]", "Another one."]),
        ("Rome fell in 476. 1066 came later.", ["Rome fell in 476.", "1066 came later."]),
        ('Is it? "Yes," he said.', ["Is it?", '"Yes," he said.']),
        ("Really?! Yes. (Maybe.)", ["Really?!", "Yes.", "(Maybe.)"]),
        ("Pi is 3.14 roughly. Version 2.0 shipped.", ["Pi is 3.14 roughly.", "Version 2.0 shipped."]),
        ("  A  b.\n\n  C\td!   E?  ", ["A b.", "C d!", "E?"]),
        ("no full stop at the end", ["no full stop at the end"]),
        ("   \n\t ", []),
        ("", []),
    ],
)
def test_split_sentences(text, expected):
    assert split_sentences(text) == expected


def test_split_sentences_keeps_every_word():
    text = "One two. Three (four) five! Six e.g. seven? 8 nine."
    assert " ".join(split_sentences(text)).split() == text.split()


# -- batch_from_texts -----------------------------------------------------------------------------


def test_framing_and_padding(tokenizer, texts):
    batch = tokenizer.batch_from_texts(texts[:4] + ["Short."])
    v = tokenizer.vocab
    B, T = batch.input_ids.shape
    assert B == 5
    special = set(v.special_ids)
    for b in range(B):
        ids = batch.input_ids[b].tolist()
        n = int((~batch.is_padding[b]).sum())
        assert batch.is_padding[b].tolist() == [False] * n + [True] * (T - n)  # right-padded
        assert ids[0] == v.cls_id and ids[n - 1] == v.sep_id
        assert ids[n:] == [v.pad_id] * (T - n)
        assert v.sep_id not in ids[1 : n - 1] and v.cls_id not in ids[1 : n - 1]
        for t in range(T):
            expected_special = t >= n or ids[t] in special
            assert bool(batch.is_special[b, t]) == expected_special
            if expected_special:
                assert batch.word_ids[b, t] == -1 and batch.sentence_ids[b, t] == -1
            assert batch.document_ids[b, t] == (b if t < n else -1)
    # the longest text fits whole: its row has no padding
    assert (~batch.is_padding).sum(dim=1).max() == T
    assert batch.surprisal is None
    for name, t in zip(batch._fields[:6], batch[:6]):
        assert t.shape == (B, T), name
    assert batch.input_ids.dtype == torch.long and batch.is_padding.dtype == torch.bool


def test_word_and_sentence_ids_against_per_sentence_encoding(tokenizer, texts):
    text = texts[0]
    batch = tokenizer.batch_from_texts([text])
    sentences = split_sentences(text)
    assert len(sentences) == 3
    expected_ids, expected_words, expected_sentences = [], [], []
    offset = 0
    for s, sentence in enumerate(sentences):
        enc = tokenizer.backend.encode(sentence, add_special_tokens=False)
        expected_ids += enc.ids
        expected_words += [w + offset for w in enc.word_ids]
        expected_sentences += [s] * len(enc.ids)
        offset += max(enc.word_ids) + 1
    n = len(expected_ids) + 2
    assert batch.input_ids[0, 1 : n - 1].tolist() == expected_ids
    assert batch.word_ids[0, :n].tolist() == [-1, *expected_words, -1]
    assert batch.sentence_ids[0, :n].tolist() == [-1, *expected_sentences, -1]
    # word ids continue across sentences: non-decreasing, without gaps, starting at 0
    words = [w for w in batch.word_ids[0].tolist() if w >= 0]
    assert words[0] == 0 and all(b - a in (0, 1) for a, b in zip(words, words[1:]))
    # tokens of one word share an id: "committee" style sub-words
    tokens = tokenizer.tokens(batch.input_ids[0, :n])
    for t in range(1, n - 1):
        if tokens[t].startswith("##"):
            assert batch.word_ids[0, t] == batch.word_ids[0, t - 1]


def test_truncation_keeps_final_sep(tokenizer, texts):
    full = tokenizer.batch_from_texts(texts[:3])
    for seq_len in (3, 5, 9):
        batch = tokenizer.batch_from_texts(texts[:3], seq_len=seq_len)
        assert batch.input_ids.shape == (3, seq_len)
        assert (batch.input_ids[:, -1] == tokenizer.vocab.sep_id).all()
        assert (batch.input_ids[:, 0] == tokenizer.vocab.cls_id).all()
        assert not batch.is_padding.any()
        # the content is the prefix of the untruncated row
        assert torch.equal(batch.input_ids[:, : seq_len - 1], full.input_ids[:, : seq_len - 1])
        assert torch.equal(batch.word_ids[:, : seq_len - 1], full.word_ids[:, : seq_len - 1])
        assert (batch.word_ids[:, -1] == -1).all()


@pytest.mark.parametrize("seq_len", [0, 1, 2])
def test_seq_len_below_three_rejected(tokenizer, texts, seq_len):
    with pytest.raises(InvalidParameterError, match=f"seq_len must be at least 3.*got {seq_len}"):
        tokenizer.batch_from_texts(texts[:1], seq_len=seq_len)


def test_single_string_rejected(tokenizer):
    with pytest.raises(InvalidParameterError, match="a list of texts, not a single string"):
        tokenizer.batch_from_texts("The committee met on Tuesday.")


def test_empty_list_of_texts_is_a_clear_error(tokenizer):
    with pytest.raises(ObjregError):  # InvalidParameterError or DataError, not a bare ValueError
        tokenizer.batch_from_texts([], seq_len=8)


def test_literal_special_token_in_text_gets_no_word_id(tokenizer):
    batch = tokenizer.batch_from_texts(["The [MASK] met on Tuesday."])
    assert (batch.input_ids == tokenizer.vocab.mask_id).any()
    assert (batch.word_ids[batch.is_special] == -1).all()
    assert (batch.sentence_ids[batch.is_special] == -1).all()


def test_encode_with_offsets_maps_back_to_text(tokenizer, texts):
    text = "  " + texts[2] + " The Committees   redundantly sedimented. Deltas slowed."
    ids, offsets = tokenizer.encode_with_offsets(text)
    assert len(ids) == len(offsets) > 10
    tokens = tokenizer.tokens(ids)
    assert "[UNK]" not in tokens
    assert any(t.startswith("##") for t in tokens)  # sub-words are exercised
    for token, (start, end) in zip(tokens, offsets):
        assert text[start:end].lower() == token.removeprefix("##")
    starts = [s for s, _ in offsets]
    assert starts == sorted(starts)


def test_unknown_special_token_rejected(tokenizer):
    from objreg import Tokenizer

    with pytest.raises(InvalidParameterError, match=r"has no token '\[NOPE\]'"):
        Tokenizer(tokenizer.backend, pad="[PAD]", unk="[UNK]", cls="[CLS]", sep="[SEP]", mask="[NOPE]", name="x")


def test_default_layout_ids(tokenizer):
    v = tokenizer.vocab
    layout = [*BASE_SPECIALS, *SENTINELS, *NAMED_SPECIALS]
    assert (v.pad_id, v.unk_id, v.cls_id, v.sep_id, v.mask_id) == (0, 1, 2, 3, 4)
    assert v.sentinel_ids == tuple(range(5, 5 + len(SENTINELS)))
    assert dict(v.named_ids) == {t: layout.index(t) for t in NAMED_SPECIALS}
    assert v.special_ids == tuple(range(len(layout)))


# -- assemble against a per-row reference ---------------------------------------------------------


def reference_assemble(chunks, seq_len, vocab):
    """The framing rules row by row in plain Python: [CLS] + sentences (word ids shifted past the
    words of earlier sentences) truncated to seq_len - 1, + [SEP], right-padded; special tokens,
    including literal ones in the text, and padding get word and sentence id -1."""
    rows = []
    for chunk in chunks:
        ids, words, sentences, offset = [vocab.cls_id], [-1], [-1], 0
        for s, (s_ids, s_words) in enumerate(chunk.sentences):
            for token, word in zip(s_ids, s_words):
                ids.append(token)
                words.append(word + offset if word >= 0 else -1)
                sentences.append(s)
            offset += max(s_words, default=-1) + 1
        n = min(len(ids), seq_len - 1)
        rows.append((ids[:n] + [vocab.sep_id], words[:n] + [-1], sentences[:n] + [-1], chunk.document))
    T = max(len(r[0]) for r in rows)
    special = set(vocab.special_ids)
    out = {name: [] for name in ("input_ids", "is_padding", "is_special", "word_ids", "sentence_ids", "document_ids")}
    for ids, words, sentences, document in rows:
        pad = T - len(ids)
        is_special = [t in special for t in ids] + [True] * pad
        out["input_ids"].append(ids + [vocab.pad_id] * pad)
        out["is_padding"].append([False] * len(ids) + [True] * pad)
        out["is_special"].append(is_special)
        out["word_ids"].append([-1 if sp else w for w, sp in zip(words + [-1] * pad, is_special)])
        out["sentence_ids"].append([-1 if sp else s for s, sp in zip(sentences + [-1] * pad, is_special)])
        out["document_ids"].append([document] * len(ids) + [-1] * pad)
    return {k: torch.tensor(v, dtype=torch.bool if k.startswith("is_") else torch.long) for k, v in out.items()}


def random_chunks(rng: random.Random, vocab, count: int) -> list[_Chunk]:
    """Chunks with empty sentences and chunks, literal special tokens, ids outside the vocabulary,
    word ids of -1 (the backend's None) and words repeated, skipped or out of order."""
    chunks = []
    for _ in range(count):
        sentences = []
        for _ in range(rng.choice([0, 1, 1, 2, 3, 5])):
            n = rng.choice([0, 1, 2, 5, 9, 17])
            ids = [
                rng.choice(vocab.special_ids) if rng.random() < 0.15
                else vocab.size + rng.randrange(3) if rng.random() < 0.03
                else rng.randrange(vocab.size)
                for _ in range(n)
            ]
            words = [-1 if rng.random() < 0.1 else rng.randrange(max(1, n)) for _ in range(n)]
            sentences.append((ids, sorted(words) if rng.random() < 0.7 else words))
        chunks.append(_Chunk(rng.randrange(1000), tuple(sentences)))
    return chunks


@pytest.mark.parametrize("seed", range(6))
def test_assemble_matches_per_row_reference(tokenizer, seed):
    rng = random.Random(seed)
    for _ in range(40):
        chunks = random_chunks(rng, tokenizer.vocab, rng.choice([1, 2, 7, 33]))
        seq_len = rng.choice([3, 4, 6, 11, 20, 64])  # most rows are truncated at the small lengths
        batch = tokenizer.assemble(chunks, seq_len)
        expected = reference_assemble(chunks, seq_len, tokenizer.vocab)
        for name, value in zip(batch._fields[:6], batch[:6]):
            assert value.dtype == expected[name].dtype and torch.equal(value, expected[name]), (name, seq_len)
            assert value.is_contiguous()


def test_assemble_real_rows_match_reference_and_stay_independent(tokenizer, texts):
    chunks = [_Chunk(d, tuple(tokenizer.encode_sentences(split_sentences(t)))) for d, t in enumerate(texts)]
    for seq_len in (5, 12, 200):
        batch = tokenizer.assemble(chunks, seq_len)
        expected = reference_assemble(chunks, seq_len, tokenizer.vocab)
        for name, value in zip(batch._fields[:6], batch[:6]):
            assert torch.equal(value, expected[name]), name
    before = [t.clone() for t in batch[:6]]
    batch.input_ids.fill_(7)  # the outputs share no elements with each other or with the chunks
    assert all(torch.equal(a, b) for a, b in zip(batch[1:6], before[1:6]))
    assert torch.equal(tokenizer.assemble(chunks, 200).input_ids, before[0])


def test_assemble_rejects_word_ids_that_do_not_match_the_tokens(tokenizer):
    chunk = _Chunk(0, (([10, 11, 12], [0, 1]),))
    with pytest.raises(DataError, match="one word id per token id"):
        tokenizer.assemble([chunk], 8)


# -- TokenizedCorpus ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def corpus(texts) -> Corpus:
    documents = [tuple(split_sentences(t)) for t in texts]
    documents.append(("A lone sentence.",))
    return Corpus("test", tuple(documents))


@pytest.mark.parametrize("seq_len", [12, 20, 40])
def test_chunks_hold_whole_sentences_in_order(tokenizer, corpus, seq_len):
    tc = TokenizedCorpus(tokenizer, corpus, seq_len)
    # every sentence here is shorter than the budget, so no chunk needs truncation
    longest = max(len(ids) for doc in corpus.documents for ids, _ in tokenizer.encode_sentences(doc))
    assert longest <= seq_len - 2
    assert len(tc) == len(tc.chunks) > 0
    for chunk in tc.chunks:
        assert chunk.num_tokens <= seq_len - 2
    for d, doc in enumerate(corpus.documents):
        expected = [ids for ids, _ in tokenizer.encode_sentences(doc)]
        chunks = [c for c in tc.chunks if c.document == d]
        got = [ids for c in chunks for ids, _ in c.sentences]
        assert got == expected  # whole sentences, in order, nothing lost or repeated
        # greedy packing: the next chunk's first sentence would not have fitted
        for a, b in zip(chunks, chunks[1:]):
            assert a.num_tokens + len(b.sentences[0][0]) > seq_len - 2
    documents = [c.document for c in tc.chunks]
    assert documents == sorted(documents)


def test_sample_rows_fit_and_are_deterministic(tokenizer, corpus):
    tc = TokenizedCorpus(tokenizer, corpus, 20)
    a = tc.sample(4, torch.Generator().manual_seed(3))
    b = tc.sample(4, torch.Generator().manual_seed(3))
    for x, y in zip(a[:6], b[:6]):
        assert torch.equal(x, y)
    assert a.input_ids.shape[0] == 4 and a.input_ids.shape[1] <= 20
    # without replacement when the pool is large enough
    rows = {tuple(r) for r in a.input_ids.tolist()}
    assert len(rows) == 4
    differs = [tc.sample(4, torch.Generator().manual_seed(s)).input_ids for s in range(4, 9)]
    assert any(d.shape != a.input_ids.shape or not torch.equal(d, a.input_ids) for d in differs)
    # each row is one chunk, framed
    for row in range(4):
        assert a.input_ids[row, 0] == tokenizer.vocab.cls_id
        doc = a.document_ids[row][~a.is_padding[row]]
        assert (doc == doc[0]).all()


def test_sample_min_sentences(tokenizer, corpus):
    tc = TokenizedCorpus(tokenizer, corpus, 24)
    counts = [len(c.sentences) for c in tc.chunks]
    assert 1 in counts and max(counts) >= 2  # both kinds exist
    assert tc.eligible(2).tolist() == [i for i, c in enumerate(counts) if c >= 2]
    for seed in range(5):
        batch = tc.sample(6, torch.Generator().manual_seed(seed), min_sentences=2)
        assert (batch.sentence_ids.max(dim=1).values >= 1).all()


def test_impossible_min_sentences_names_the_objective(tokenizer, corpus, generator):
    tc = TokenizedCorpus(tokenizer, corpus, 24)
    with pytest.raises(DataError, match=r"corpus 'test' is too short \(sop needs 50 sentences"):
        tc.sample(2, generator, min_sentences=50, what="sop")


@pytest.mark.parametrize(
    "documents", [(), ((),), (("", ""),)], ids=["no documents", "no sentences", "no tokens"]
)
def test_empty_corpus_rejected(tokenizer, documents):
    with pytest.raises(DataError, match="corpus 'empty'"):
        TokenizedCorpus(tokenizer, Corpus("empty", documents), 16)


def test_long_sentence_is_truncated_in_its_own_chunk(tokenizer, texts):
    corpus = Corpus("long", ((" ".join(texts), "Short one."),))
    tc = TokenizedCorpus(tokenizer, corpus, 10)
    assert len(tc.chunks[0].sentences) == 1 and tc.chunks[0].num_tokens > 8
    batch = tc.sample(2, torch.Generator().manual_seed(0))
    assert batch.input_ids.shape[1] <= 10
    assert (batch.input_ids[~batch.is_padding].reshape(-1) == tokenizer.vocab.sep_id).sum() == 2


# -- wordpiece_from_vocab -----------------------------------------------------------------------


def test_wordpiece_from_vocab_round_trip(tokenizer, texts, tmp_path):
    vocab = tokenizer.backend.get_vocab()
    ordered = sorted(vocab, key=vocab.__getitem__)
    assert [vocab[t] for t in ordered] == list(range(len(ordered)))  # ids are dense
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(ordered) + "\n", encoding="utf-8")
    loaded = wordpiece_from_vocab(path, "loaded")
    assert loaded.vocab == tokenizer.vocab
    samples = [*texts, "Unseen words: zygote quixotic!", "MIXED case, Punctuation; and 42 numbers.", "Redundantly sedimented."]
    for sentence in samples:
        assert tokenizer.backend.encode(sentence, add_special_tokens=False).ids == (
            loaded.backend.encode(sentence, add_special_tokens=False).ids
        )
    a, b = tokenizer.batch_from_texts(samples), loaded.batch_from_texts(samples)
    for x, y in zip(a[:6], b[:6]):
        assert torch.equal(x, y)


@pytest.mark.parametrize("seed", range(3))
def test_assemble_of_id_only_rows_is_assemble_with_one_word_per_token(tokenizer, seed):
    """Word ids None mean one word per token: the batch equals the one built from
    list(range(len(ids))), on the general path (rows of mixed lengths, several sentences) and on
    the equal-length block path (group_texts rows, truncated or not, with literal specials and without)."""
    rng = random.Random(seed)
    v = tokenizer.vocab

    def ids(n):
        return [rng.choice(v.special_ids) if rng.random() < 0.1 else rng.randrange(v.size + 2) for _ in range(n)]

    mixed = [_Chunk(d, tuple((s, None) for s in (ids(rng.randrange(0, 9)) for _ in range(rng.randrange(1, 4)))))
             for d in range(7)]
    equal = [_Chunk(d, ((ids(11), None),)) for d in range(5)]
    plain = [_Chunk(d, (([rng.randrange(len(v.special_ids) + 5, v.size) for _ in range(11)], None),)) for d in range(5)]
    assert not set(v.special_ids) & {i for c in plain for i in c.sentences[0][0]}
    for chunks in (mixed, equal, plain):
        with_words = [_Chunk(c.document, tuple((s, list(range(len(s)))) for s, _ in c.sentences)) for c in chunks]
        for seq_len in (3, 8, 13, 40):
            got, expected = tokenizer.assemble(chunks, seq_len), tokenizer.assemble(with_words, seq_len)
            reference = reference_assemble(with_words, seq_len, v)
            for name, value in zip(got._fields[:6], got[:6]):
                assert value.dtype == getattr(expected, name).dtype and torch.equal(value, getattr(expected, name))
                assert torch.equal(value, reference[name]) and value.is_contiguous(), (name, seq_len)
