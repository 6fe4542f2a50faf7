"""Property-based tests over every registered pre-training objective (hypothesis): random row
lengths, padding, literal special tokens inside the text, tiny rows, several documents.

For any such batch an objective either refuses it with an ``objreg.ObjregError`` (a clear message,
e.g. "needs two sentences") or returns a corruption that keeps the invariants every objective
shares: consistent shapes, valid ids and labels, no label at padding, a mask that never attends
to padding and lets every real token attend somewhere, the input left untouched, the same output
for the same seed, and finite per-sample losses on a tiny model.

Refusing is not a way through: every batch is a well-formed row set, so an objective that needs
one sentence per row must accept all of them, and a sentence-pair objective (which may refuse a
batch of one document, or a row whose second sentence was special tokens only) at least
:data:`MIN_PAIR_SHARE` of them, or the invariants would be checked on almost nothing.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import objreg
from objreg.core.registry import merge_heads
from objreg.testing import TINY_MODEL

REGISTRY = objreg.Registry.load(load_entrypoints=False)
NAMES = REGISTRY.objectives()
EXAMPLES = 30
#: Share of the batches a sentence-pair objective must accept. nsp, the strictest, accepts about
#: 60% of them (a one-row or one-document batch has no negative); a fifth keeps the chance of a
#: false alarm in a run far below one in ten thousand.
MIN_PAIR_SHARE = 0.2


@pytest.fixture(scope="module")
def vocab(tokenizer) -> objreg.Vocabulary:
    return tokenizer.vocab


@st.composite
def token_batches(draw, vocab: objreg.Vocabulary, min_sentences: int = 0) -> objreg.TokenBatch:
    """Rows ``[CLS] sentences [SEP]`` of ``min_sentences``–4 sentences of 1–5 words of 1–3 tokens,
    right-padded; a few tokens are literal special ids (e.g. the pad id written in the text)."""
    ordinary = [i for i in range(vocab.size) if i not in set(vocab.special_ids)]
    specials = [vocab.pad_id, vocab.mask_id, vocab.sep_id, *vocab.sentinel_ids[:1]]
    rows = []
    for _ in range(draw(st.integers(1, 5))):
        ids, words, sentences = [vocab.cls_id], [-1], [-1]
        word = 0
        for s in range(draw(st.integers(min_sentences, 4))):
            for _ in range(draw(st.integers(1, 5))):
                if draw(st.integers(0, 19)) == 0:
                    ids.append(draw(st.sampled_from(specials)))
                    words.append(-1)
                    sentences.append(-1)
                    continue
                pieces = draw(st.integers(1, 3))
                ids += [draw(st.sampled_from(ordinary)) for _ in range(pieces)]
                words += [word] * pieces
                sentences += [s] * pieces
                word += 1
        ids.append(vocab.sep_id)
        words.append(-1)
        sentences.append(-1)
        rows.append((ids, words, sentences, draw(st.integers(0, 3))))
    T = max(len(r[0]) for r in rows)
    B = len(rows)
    input_ids = torch.full((B, T), vocab.pad_id)
    word_ids = torch.full((B, T), -1)
    sentence_ids = torch.full((B, T), -1)
    document_ids = torch.full((B, T), -1)
    is_padding = torch.ones(B, T, dtype=torch.bool)
    is_special = torch.ones(B, T, dtype=torch.bool)
    for b, (ids, words, sents, doc) in enumerate(rows):
        n = len(ids)
        input_ids[b, :n] = torch.tensor(ids)
        word_ids[b, :n] = torch.tensor(words)
        sentence_ids[b, :n] = torch.tensor(sents)
        document_ids[b, :n] = doc
        is_padding[b, :n] = False
        is_special[b, :n] = torch.tensor([w < 0 for w in words])
    return objreg.TokenBatch(input_ids, is_padding, is_special, word_ids, sentence_ids, document_ids)


_MODELS: dict[str, torch.nn.Module] = {}


def tiny_model(name: str, objective: objreg.Objective, vocab: objreg.Vocabulary) -> torch.nn.Module:
    if name not in _MODELS:
        heads = merge_heads({name: objective.info.heads})
        _MODELS[name] = REGISTRY.load_model("default", vocab, heads, TINY_MODEL, torch.Generator().manual_seed(0))
    return _MODELS[name]


@pytest.mark.parametrize("name", NAMES)
def test_corruption_invariants(name, vocab):
    objective = REGISTRY.get(name, vocab=vocab)

    # Sentence-level objectives get rows with enough sentences, or every example would be refused.
    pairs = objective.info.min_sentences > 1
    sentences = objective.info.min_sentences if pairs else 0
    calls: list[bool] = []  # per example: accepted
    refusals: list[str] = []

    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(batch=token_batches(vocab, sentences), seed=st.integers(0, 2**31 - 1))
    def check(batch: objreg.TokenBatch, seed: int) -> None:
        before = [t.clone() for t in batch[:6]]
        try:
            out = objective.corrupt(batch, torch.Generator().manual_seed(seed))
        except objreg.ObjregError as e:
            assert str(e).strip() and "\n" not in str(e).strip()  # one clear line
            calls.append(False)
            refusals.append(str(e))
            return
        calls.append(True)
        assert all(torch.equal(a, b) for a, b in zip(before, batch[:6])), "corrupt modified its input"
        again = objective.corrupt(batch, torch.Generator().manual_seed(seed))
        assert all(torch.equal(a, b) for a, b in zip(out[:5], again[:5]))
        assert out.extras.keys() == again.extras.keys()
        assert all(torch.equal(out.extras[k], again.extras[k]) for k in out.extras)

        B, T = out.input_ids.shape
        assert B == batch.batch_size
        assert all(tuple(t.shape) == (B, T) for t in out[:5])
        assert out.is_padding.dtype == torch.bool
        assert ((out.input_ids >= 0) & (out.input_ids < vocab.size)).all()
        labelled = out.labels != objreg.IGNORE_INDEX
        assert ((out.labels[labelled] >= 0) & (out.labels[labelled] < vocab.size)).all()
        assert not (labelled & out.is_padding).any(), "a label at a padding position"

        mask = objective.attention_mask(out)
        assert mask.dtype == torch.bool and tuple(mask.shape) == (B, T, T)
        assert not (mask & out.is_padding[:, None, :]).any(), "attends to padding"
        real_queries = ~out.is_padding
        assert mask.any(dim=-1)[real_queries].all(), "a real token attends to nothing"

        model = tiny_model(name, objective, vocab)
        with torch.no_grad():
            losses = objective.losses(model, out, mask)
        assert tuple(losses.shape) == (B,)
        assert torch.isfinite(losses).all()

    check()
    accepted = sum(calls)
    floor = MIN_PAIR_SHARE * len(calls) if pairs else len(calls)
    assert calls and accepted >= floor, (
        f"{name} accepted {accepted} of {len(calls)} well-formed batches (needs {floor:g}); refusals: {refusals[:3]}"
    )
