"""Next-sentence prediction: true continuations, negatives from another document, loss vs a loop."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import objreg
from objreg import IGNORE_INDEX

H = 8


@pytest.fixture
def batch(tokenizer, texts):
    return tokenizer.batch_from_texts(texts)


def repeated(batch: objreg.TokenBatch, times: int) -> objreg.TokenBatch:
    """The rows ``times`` over: each document then occupies several rows."""
    return batch.select(torch.arange(batch.batch_size).repeat(times))


def body_and_boundaries(batch: objreg.TokenBatch, b: int) -> tuple[list[int], set[int]]:
    """Row ``b`` without [CLS]/[SEP], and the offsets in it where a sentence other than the first starts."""
    n = int((~batch.is_padding[b]).sum())
    ids, sentences = batch.input_ids[b, 1 : n - 1].tolist(), batch.sentence_ids[b, 1 : n - 1].tolist()
    return ids, {k for k in range(1, len(ids)) if sentences[k] != sentences[k - 1]}


def parse(row: list[int], sep: int) -> tuple[list[int], list[int]]:
    """``[CLS] A [SEP] B [SEP] pad...`` -> (A, B)."""
    first = row.index(sep)
    second = row.index(sep, first + 1)
    return row[1:first], row[first + 1 : second]


def check_rows(batch: objreg.TokenBatch, cb: objreg.CorruptedBatch, vocab: objreg.Vocabulary) -> None:
    """Every row is [CLS] A [SEP] B [SEP]: A a sentence-prefix of its own row; a positive's B is
    exactly the rest of the row; a negative's B starts at a sentence boundary of a row of ANOTHER
    document and is that row's text from there (cut only where the row is full)."""
    B, T = batch.input_ids.shape
    assert set(cb.extras) == {"next_sentence_label", "next_document"}  # no segment_ids: no model reads them
    assert torch.equal(cb.position_ids, torch.arange(T + 1).expand(B, T + 1))
    docs = batch.document_ids[:, 0].tolist()
    rows = [body_and_boundaries(batch, r) for r in range(B)]
    for b in range(B):
        row = cb.input_ids[b].tolist()
        assert row[0] == vocab.cls_id
        a, seg_b = parse(row, vocab.sep_id)
        own, boundaries = rows[b]
        assert len(a) in boundaries and a == own[: len(a)], b
        end = len(a) + len(seg_b) + 2  # index of the final [SEP]
        assert cb.is_padding[b].tolist() == [j > end for j in range(T + 1)]
        assert all(t == vocab.pad_id for t in row[end + 1 :])
        assert cb.document_ids[b].tolist() == [docs[b] if j <= end else -1 for j in range(T + 1)]
        if cb.extras["next_sentence_label"][b] == 0:
            assert seg_b == own[len(a) :], f"row {b}: a positive's B must be the true continuation"
            assert cb.extras["next_document"][b] == docs[b]
            continue
        truncated = end == T
        sources = [
            r for r in range(B) if docs[r] != docs[b]
            for k in rows[r][1]
            if rows[r][0][k : k + len(seg_b)] == seg_b and (truncated or k + len(seg_b) == len(rows[r][0]))
        ]
        assert sources, f"row {b}: a negative's B must come from a row of another document"
        assert int(cb.extras["next_document"][b]) in {docs[r] for r in sources}
        assert int(cb.extras["next_document"][b]) != docs[b]


def test_positives_continue_and_negatives_come_from_another_document(registry, tokenizer, batch):
    big = repeated(batch, 8)  # 48 rows, 8 per document: same-document rows must never be picked
    objective = registry.get("nsp", vocab=tokenizer.vocab)
    for seed in range(3):
        cb = objective.corrupt(big, torch.Generator().manual_seed(seed))
        assert cb.input_ids.shape == (big.batch_size, big.input_ids.shape[1] + 1)
        labels = cb.extras["next_sentence_label"]
        assert labels.dtype == torch.long and set(labels.tolist()) == {0, 1}
        check_rows(big, cb, tokenizer.vocab)
        assert (cb.labels == IGNORE_INDEX).all()


def test_a_long_random_next_is_cut_to_the_row_width(registry, tokenizer):
    # Row 0's A is longer than row 1's, so row 1's long second sentence cannot follow it whole.
    texts = ["The committee met on the roof. It rained.",
             "Bees. The orchestra played a symphony by Brahms and the audience applauded for several minutes."]
    batch = tokenizer.batch_from_texts(texts)
    cb = registry.get("nsp", vocab=tokenizer.vocab, random_next_prob=1.0).corrupt(batch, torch.Generator())
    T = batch.input_ids.shape[1]
    assert cb.extras["next_document"].tolist() == [1, 0]
    check_rows(batch, cb, tokenizer.vocab)
    a, seg_b = parse(cb.input_ids[0].tolist(), tokenizer.vocab.sep_id)
    body, boundaries = body_and_boundaries(batch, 1)
    (k,) = boundaries
    assert len(a) + len(body) - k + 3 > T + 1  # the whole sentence would not fit
    assert not cb.is_padding[0].any()  # so B fills the row ...
    assert seg_b == body[k : k + T - 2 - len(a)]  # ... with the start of that sentence


def within_4_sigma(count: float, n: float, p: float) -> bool:
    return abs(count - n * p) <= 4 * math.sqrt(n * p * (1 - p)) + 1e-9


@pytest.mark.parametrize("prob", [0.5, 0.2, 1.0, 0.0])
def test_label_rate_matches_random_next_prob(registry, tokenizer, batch, prob):
    big = repeated(batch, 300)  # 1800 rows
    objective = registry.get("nsp", vocab=tokenizer.vocab, random_next_prob=prob)
    cb = objective.corrupt(big, torch.Generator().manual_seed(1))
    labels = cb.extras["next_sentence_label"]
    assert within_4_sigma(int(labels.sum()), big.batch_size, prob)
    # A label says where B came from: 1 exactly when B is from another document.
    docs = big.document_ids[:, 0]
    assert torch.equal(labels.bool(), cb.extras["next_document"] != docs)


def test_random_next_document_is_uniform_over_the_other_documents(registry, tokenizer, batch):
    big = repeated(batch, 300)  # 6 documents, equally many rows each
    cb = registry.get("nsp", vocab=tokenizer.vocab, random_next_prob=1.0).corrupt(big, torch.Generator().manual_seed(3))
    own = big.document_ids[:, 0]
    source = cb.extras["next_document"]
    rows = own == 0
    n = int(rows.sum())
    counts = torch.bincount(source[rows], minlength=6).tolist()
    assert counts[0] == 0
    assert all(within_4_sigma(c, n, 1 / 5) for c in counts[1:]), counts


def test_a_single_document_batch_is_an_error_unless_no_negative_is_needed(registry, tokenizer, texts):
    batch = tokenizer.batch_from_texts([texts[0]])
    with pytest.raises(objreg.DataError, match="all 1 row.* come from one document.*random_next_prob=0"):
        registry.get("nsp", vocab=tokenizer.vocab).corrupt(batch, torch.Generator())
    two_rows_one_document = repeated(batch, 2)
    with pytest.raises(objreg.DataError, match="all 2 row"):
        registry.get("nsp", vocab=tokenizer.vocab).corrupt(two_rows_one_document, torch.Generator())
    cb = registry.get("nsp", vocab=tokenizer.vocab, random_next_prob=0.0).corrupt(batch, torch.Generator())
    assert cb.extras["next_sentence_label"].tolist() == [0]
    check_rows(batch, cb, tokenizer.vocab)


def test_one_sentence_row_is_an_error(registry, tokenizer, texts):
    batch = tokenizer.batch_from_texts([texts[0], "Only one sentence here."])
    with pytest.raises(objreg.DataError, match="nsp needs at least 2 sentences in each row; row 1 has 1"):
        registry.get("nsp", vocab=tokenizer.vocab).corrupt(batch, torch.Generator().manual_seed(0))


def test_packed_row_is_an_error(registry, tokenizer, batch):
    docs = batch.document_ids.clone()
    docs[2, 5:] = torch.where(batch.is_padding[2, 5:], -1, 99)
    with pytest.raises(objreg.DataError, match="row 2"):
        registry.get("nsp", vocab=tokenizer.vocab).corrupt(batch._replace(document_ids=docs), torch.Generator())


def test_the_two_segments_attend_to_each_other(registry, tokenizer, batch):
    objective = registry.get("nsp", vocab=tokenizer.vocab, random_next_prob=1.0)
    cb = objective.corrupt(batch, torch.Generator().manual_seed(0))
    described = objective.attention(cb)
    assert isinstance(described, objreg.AttentionMask) and described.pattern == "bidirectional"
    mask = objective.attention_mask(cb)
    real = ~cb.is_padding
    # Every real query sees every real key, across the segment boundary, even though B is from another document.
    assert torch.equal(mask, real[:, :, None] & real[:, None, :])


def test_loss_equals_a_per_example_loop(registry, tokenizer, batch, stand_in_model):
    objective = registry.get("nsp", vocab=tokenizer.vocab)
    cb = objective.corrupt(batch, torch.Generator().manual_seed(2))
    model = stand_in_model("next_sentence", H, 2, first_token=True)
    hidden = torch.randn(*cb.input_ids.shape, H, dtype=torch.float64)
    loss = objective.loss(objreg.ModelOutputs(hidden, model), cb)
    head = model.heads["next_sentence"].linear
    expected = torch.stack([F.cross_entropy(head(hidden[b, 0]), cb.extras["next_sentence_label"][b])
                            for b in range(cb.batch_size)])
    torch.testing.assert_close(loss, expected)


def test_same_seed_same_output_other_seed_differs(registry, tokenizer, batch):
    big = repeated(batch, 10)
    objective = registry.get("nsp", vocab=tokenizer.vocab)
    a, b, c = (objective.corrupt(big, torch.Generator().manual_seed(s)) for s in (5, 5, 6))
    assert all(torch.equal(x, y) for x, y in zip(a[:5], b[:5]))
    assert all(torch.equal(a.extras[k], b.extras[k]) for k in a.extras)
    assert not torch.equal(a.input_ids, c.input_ids)


def test_info_declares_the_reference_defaults(registry):
    info = registry.info("nsp")
    assert info.defaults() == {"random_next_prob": 0.5}
    assert info.min_sentences == 2 and not info.batch_coupled
    assert info.heads == (objreg.HeadSpec("next_sentence", "classifier", 2),)


def test_special_tokens_inside_the_text_keep_their_row_usable(registry, tokenizer, texts):
    # A literal [MASK] (or an [UNK]) inside a sentence has sentence id -1, like [CLS] and [SEP].
    batch = tokenizer.batch_from_texts(["Bees collect [MASK] from flowers. They store honey in wax cells.", texts[1]])
    assert (batch.input_ids[0] == tokenizer.vocab.mask_id).any()
    cb = registry.get("nsp", vocab=tokenizer.vocab, random_next_prob=0.0).corrupt(batch, torch.Generator())
    check_rows(batch, cb, tokenizer.vocab)
