"""objreg.toolkit.segments: the checks on framed rows, the uniform split at a sentence boundary
(special tokens inside the text included) and the pair layout, each against a loop."""

from __future__ import annotations

import math

import pytest
import torch

import objreg
from objreg.toolkit import segments

VOCAB = objreg.Vocabulary(size=40, pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4, special_ids=(0, 1, 2, 3, 4))
MASK = -4  # in a row spec: a literal [MASK] inside the text (sentence id -1)


def rows_batch(rows: list[list[list[int]]], documents: list[int] | None = None) -> objreg.TokenBatch:
    """Rows ``[CLS] sentences [SEP]`` from sentences given as lists of ordinary ids (10..39); ``MASK``
    is a literal [MASK] without a sentence. Sentence ids count the sentences as given (one made only
    of ``MASK`` leaves its number out, as a tokenizer does)."""
    flat = []
    for sentences in rows:
        ids, sentence_ids = [VOCAB.cls_id], [-1]
        for s, tokens in enumerate(sentences):
            ids += [VOCAB.mask_id if t == MASK else t for t in tokens]
            sentence_ids += [-1 if t == MASK else s for t in tokens]
        flat.append((ids + [VOCAB.sep_id], sentence_ids + [-1]))
    B, T = len(rows), max(len(ids) for ids, _ in flat)
    input_ids = torch.zeros(B, T, dtype=torch.long)
    sentence_ids = torch.full((B, T), -1)
    is_padding = torch.ones(B, T, dtype=torch.bool)
    for b, (ids, sents) in enumerate(flat):
        input_ids[b, : len(ids)] = torch.tensor(ids)
        sentence_ids[b, : len(ids)] = torch.tensor(sents)
        is_padding[b, : len(ids)] = False
    is_special = is_padding | (input_ids < 5)
    words = torch.where(is_special, -1, torch.arange(T).expand(B, T))
    docs = torch.tensor(documents if documents is not None else list(range(B)))
    return objreg.TokenBatch(input_ids, is_padding, is_special, words, sentence_ids,
                             torch.where(is_padding, -1, docs[:, None]))


def expected_splits(sentence_ids: list[int]) -> list[int]:
    """The positions that may start segment B, by the documented rule written as a loop: a special
    token (-1) belongs to the sentence before it; leading ones count as sentence 0."""
    body = sentence_ids[1:-1]
    current, owners = 0, []
    for s in body:
        current = max(current, s)
        owners.append(current)
    return [1 + k for k in range(1, len(body)) if owners[k] != owners[k - 1]]


def within_4_sigma(count: float, n: float, p: float) -> bool:
    return abs(count - n * p) <= 4 * math.sqrt(n * p * (1 - p)) + 1e-9


ROWS = [
    [[10, 11], [12], [13, 14, 15]],  # three sentences
    [[16, MASK, 17], [18, 19]],  # a literal [MASK] inside a sentence never splits it
    [[MASK, 20, 21], [22]],  # a leading [MASK] of sentence 0 joins it
    [[MASK], [23, 24], [25]],  # sentence 0 was [MASK] only: the tokenizer numbers the next 1
    [[26], [27, MASK], [28]],  # a trailing [MASK] stays with its sentence
]


def test_split_is_uniform_over_the_sentence_boundaries():
    batch = rows_batch(ROWS)
    big = batch.select(torch.arange(len(ROWS)).repeat(600))
    a, b = segments.split_pair(big, VOCAB, torch.Generator().manual_seed(0), "test")
    length = (~big.is_padding).sum(dim=1)
    assert torch.equal(a.row, torch.arange(big.batch_size)) and torch.equal(b.row, a.row)
    assert (a.start == 1).all() and torch.equal(a.start + a.length, b.start)
    assert torch.equal(b.start + b.length, length - 1)  # B ends right before the final [SEP]
    for r, spec in enumerate(ROWS):
        allowed = expected_splits(batch.sentence_ids[r, : int(length[r])].tolist())
        assert len(allowed) == len(spec) - 1, r
        picked = b.start[r :: len(ROWS)]
        assert set(picked.tolist()) == set(allowed), r
        assert all(within_4_sigma(int((picked == p).sum()), 600, 1 / len(allowed)) for p in allowed), r


def test_split_draws_one_number_per_row_whatever_the_data():
    batch = rows_batch(ROWS)
    generator = torch.Generator().manual_seed(3)
    segments.split_pair(batch, VOCAB, generator, "test")
    reference = torch.Generator().manual_seed(3)
    torch.rand(len(ROWS), generator=reference)
    assert torch.equal(generator.get_state(), reference.get_state())


def test_rows_with_fewer_than_two_sentences_are_errors():
    with pytest.raises(objreg.DataError, match=r"sop needs at least 2 sentences in each row; row 1 has 1 \(1 of 2"):
        segments.split_pair(rows_batch([[[10], [11]], [[12, MASK, 13]]]), VOCAB, torch.Generator(), "sop")
    with pytest.raises(objreg.DataError, match="row 0 has 0"):  # [CLS] [SEP]: framed, but no text
        segments.split_pair(rows_batch([[], [[10], [11]]]), VOCAB, torch.Generator(), "nsp")


def broken(batch: objreg.TokenBatch, **fields: torch.Tensor) -> objreg.TokenBatch:
    return batch._replace(**fields)


def test_rows_that_are_not_framed_single_documents_are_errors():
    batch = rows_batch([[[10], [11, 12]], [[13], [14]], [[15, 16], [17]]])
    ids, sentences, padding = batch.input_ids, batch.sentence_ids, batch.is_padding
    no_cls = ids.clone()
    no_cls[1, 0] = 20
    no_sep = ids.clone()
    no_sep[1, 3] = 20
    sentence_outside = sentences.clone()
    sentence_outside[1, 3] = 1  # the [SEP] labelled as text
    left_padded = padding.clone()
    left_padded[1] = torch.tensor([True, False, False, False, True])
    packed = batch.document_ids.clone()
    packed[1, 2:4] = 7
    for bad in (broken(batch, input_ids=no_cls), broken(batch, input_ids=no_sep),
                broken(batch, sentence_ids=sentence_outside), broken(batch, is_padding=left_padded),
                broken(batch, document_ids=packed)):
        with pytest.raises(objreg.DataError, match=r"^contrastive needs each row framed as \[CLS\] sentences \[SEP\] "
                                                   r"\+ padding, from one document; row 1 is not"):
            segments.split_pair(bad, VOCAB, torch.Generator(), "contrastive")
    assert segments.check_rows(batch, VOCAB, "contrastive").tolist() == [5, 4, 5]


def test_join_pair_matches_a_loop_across_rows():
    batch = rows_batch([[[10, 11], [12, 13, 14]], [[15], [16, 17]], [[18, 19, 20], [21]]])
    ids = batch.input_ids
    B, T = ids.shape
    first = segments.Segment(torch.tensor([0, 1, 2]), torch.tensor([1, 1, 2]), torch.tensor([2, 1, 1]))
    second = segments.Segment(torch.tensor([2, 0, 1]), torch.tensor([4, 3, 2]), torch.tensor([1, 3, 2]))
    for second_cls in (False, True):
        tokens, is_padding, start = segments.join_pair(ids, first, second, VOCAB, second_cls=second_cls)
        W = T + (2 if second_cls else 1)
        assert tokens.shape == is_padding.shape == (B, W)
        for b in range(B):
            one, two = (ids[s.row[b], s.start[b] : s.start[b] + s.length[b]].tolist() for s in (first, second))
            middle = [VOCAB.sep_id, VOCAB.cls_id] if second_cls else [VOCAB.sep_id]
            row = [VOCAB.cls_id, *one, *middle, *two, VOCAB.sep_id]
            assert tokens[b].tolist() == row + [VOCAB.pad_id] * (W - len(row)), (b, second_cls)
            assert is_padding[b].tolist() == [j >= len(row) for j in range(W)]
            assert int(start[b]) == 2 + len(one)  # right after the middle [SEP]


def test_choose_picks_whole_segments_per_row():
    a = segments.Segment(torch.tensor([0, 1]), torch.tensor([1, 1]), torch.tensor([2, 3]))
    b = segments.Segment(torch.tensor([0, 1]), torch.tensor([3, 4]), torch.tensor([5, 6]))
    chosen = segments.choose(torch.tensor([True, False]), a, b)
    assert [t.tolist() for t in chosen] == [[0, 1], [1, 4], [2, 6]]
