"""BART: each noising function on its own (infilling, deletion, masking, permutation, rotation,
insertion), their combination, and the target being the original text."""

from __future__ import annotations

import functools
import itertools
import math
from fractions import Fraction

import pytest
import torch

import objreg
from objreg.plugins.objectives import bart

# 0..19 special (pad 0, unk 1, cls 2, sep 3, mask 4); 20..999 ordinary.
VOCAB = objreg.Vocabulary(size=1000, pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4, special_ids=tuple(range(20)))
MASK = VOCAB.mask_id
ONLY = {"mask": 0.0, "mask_random": 0.0, "permute_sentences": 0.0, "rotate": 0.0, "insert": 0.0}


def document_batch(B: int, sentences: int, words: tuple[int, int] = (3, 6), seed: int = 0) -> objreg.TokenBatch:
    """Rows ``[CLS] s_0 … s_k [SEP]`` of ``sentences`` sentences of random words of 1–3 tokens,
    with word and sentence ids, right-padded."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(B):
        ids, word_ids, sentence_ids, w = [VOCAB.cls_id], [-1], [-1], 0
        for s in range(sentences):
            for _ in range(int(torch.randint(words[0], words[1] + 1, (1,), generator=g))):
                size = int(torch.randint(1, 4, (1,), generator=g))
                ids += torch.randint(20, 1000, (size,), generator=g).tolist()
                word_ids += [w] * size
                sentence_ids += [s] * size
                w += 1
        rows.append((ids + [VOCAB.sep_id], word_ids + [-1], sentence_ids + [-1]))
    T = max(len(r[0]) for r in rows)

    def pad(values: list[int], fill: int) -> list[int]:
        return values + [fill] * (T - len(values))

    ids = torch.tensor([pad(r[0], 0) for r in rows])
    is_padding = torch.tensor([[j >= len(r[0]) for j in range(T)] for r in rows])
    is_special = (ids < 20) | is_padding
    documents = torch.where(is_padding, -1, torch.arange(B)[:, None])
    return objreg.TokenBatch(ids, is_padding, is_special, torch.tensor([pad(r[1], -1) for r in rows]),
                             torch.tensor([pad(r[2], -1) for r in rows]), documents)


def corrupt(registry, batch, seed=0, **params):
    return registry.get("bart", vocab=VOCAB, **params).corrupt(batch, torch.Generator().manual_seed(seed))


def original(batch, b) -> list[int]:
    return batch.input_ids[b][~batch.is_padding[b]].tolist()


def source(cb, b) -> list[int]:
    p = int(cb.extras["prefix_length"][b])
    return cb.input_ids[b, :p].tolist()


def sentences(batch, b) -> list[list[int]]:
    ids, sid = original(batch, b), batch.sentence_ids[b].tolist()
    return [[t for t, s in zip(ids, sid) if s == k] for k in range(max(sid) + 1)]


def is_infilled(batch, b, corrupted: list[int]) -> bool:
    """Is ``corrupted`` the original row with runs of whole words replaced by one [MASK] each, a
    [MASK] possibly standing for nothing (an insertion)? A memoised alignment, not the code under test."""
    ids = original(batch, b)
    words = batch.word_ids[b, : len(ids)].tolist()
    special = batch.is_special[b, : len(ids)].tolist()
    n = len(ids)

    def boundary(k: int) -> bool:  # no word continues across position k
        return k == n or k == 0 or not (words[k] >= 0 and words[k] == words[k - 1])

    @functools.cache
    def aligns(i: int, j: int) -> bool:
        if i == len(corrupted):
            return j == n
        if corrupted[i] != MASK:
            return j < n and corrupted[i] == ids[j] and aligns(i + 1, j + 1)
        if aligns(i + 1, j):  # an inserted [MASK]
            return True
        if not boundary(j):
            return False
        for k in range(j + 1, n + 1):  # the run ids[j:k], whole ordinary words
            if special[k - 1]:
                return False
            if boundary(k) and aligns(i + 1, k):
                return True
        return False

    return aligns(0, 0)


def test_defaults_are_the_bart_large_recipe(registry):
    assert registry.info("bart").defaults() == {
        "mask": 0.3, "mask_random": 0.1, "mask_length": "span-poisson", "poisson_lambda": 3.0,
        "replace_length": 1, "permute_sentences": 1.0, "rotate": 0.0, "insert": 0.0,
    }


@pytest.mark.parametrize("params", [
    {},
    {"rotate": 1.0, "insert": 0.1},
    {"mask_length": "subword", "replace_length": 0},
    {"mask_length": "word", "replace_length": -1, "mask_random": 0.5},
])
def test_the_target_is_the_original_text(registry, params):
    batch = document_batch(12, 3, seed=1)
    objective = registry.get("bart", vocab=VOCAB, **params)
    cb = objective.corrupt(batch, torch.Generator().manual_seed(2))
    for b in range(12):
        p, n = int(cb.extras["prefix_length"][b]), int((~cb.is_padding[b]).sum())
        assert cb.input_ids[b, p:n].tolist() == original(batch, b)
        src = source(cb, b)
        assert src[0] == VOCAB.cls_id and src[-1] == VOCAB.sep_id
        assert not set(src) & (set(range(20)) - {MASK, VOCAB.cls_id, VOCAB.sep_id})  # no other specials appear
        assert cb.input_ids[b, n:].eq(VOCAB.pad_id).all()


def test_sentence_permutation_keeps_sentences_whole(registry):
    N = 1200
    batch = document_batch(N, 3, seed=3)
    cb = corrupt(registry, batch, **{**ONLY, "permute_sentences": 1.0})
    changed = 0
    for b in range(N):
        parts = sentences(batch, b)
        body = source(cb, b)[1:-1]
        orders = [perm for perm in itertools.permutations(range(3)) if sum((parts[i] for i in perm), []) == body]
        assert orders, b  # the body is the three sentences, each intact, in some order
        changed += orders[0] != (0, 1, 2)
    p = 5 / 6  # every order but the identity
    assert abs(changed - N * p) <= 4 * math.sqrt(N * p * (1 - p))


def test_partial_permutation_moves_the_chosen_share(registry):
    """4 sentences, permute_sentences 0.5: ceil(2) = 2 sentences are shuffled between their two
    slots, so half the rows swap exactly two sentences and half stay."""
    N = 1200
    batch = document_batch(N, 4, seed=4)
    cb = corrupt(registry, batch, **{**ONLY, "permute_sentences": 0.5})
    swapped = 0
    for b in range(N):
        parts, body = sentences(batch, b), source(cb, b)[1:-1]
        orders = [perm for perm in itertools.permutations(range(4)) if sum((parts[i] for i in perm), []) == body]
        moved = sum(i != s for i, s in enumerate(orders[0]))
        assert moved in (0, 2), orders
        swapped += moved == 2
    assert abs(swapped - N / 2) <= 4 * math.sqrt(N / 4)


def test_token_masking_masks_exactly_the_budget(registry):
    batch = document_batch(200, 3, seed=5)
    cb = corrupt(registry, batch, **{**ONLY, "mask": 0.3, "mask_length": "subword", "replace_length": -1})
    for b in range(200):
        before, after = original(batch, b), source(cb, b)
        assert len(after) == len(before)
        changed = [i for i, (x, y) in enumerate(zip(before, after)) if x != y]
        assert all(after[i] == MASK for i in changed)
        assert len(changed) == math.ceil(Fraction(3, 10) * (len(before) - 2))  # [CLS]/[SEP] never masked
        assert 0 not in changed and len(before) - 1 not in changed


def test_token_deletion_deletes_exactly_the_budget(registry):
    batch = document_batch(200, 3, seed=6)
    cb = corrupt(registry, batch, **{**ONLY, "mask": 0.3, "mask_length": "subword", "replace_length": 0})
    for b in range(200):
        before, after = original(batch, b), source(cb, b)
        assert MASK not in after
        assert len(before) - len(after) == math.ceil(Fraction(3, 10) * (len(before) - 2))
        remaining = iter(before)
        assert all(t in remaining for t in after)  # a subsequence: only deletions


def test_word_masking_masks_whole_words(registry):
    batch = document_batch(200, 3, seed=7)
    cb = corrupt(registry, batch, **{**ONLY, "mask": 0.3, "mask_length": "word", "replace_length": -1})
    for b in range(200):
        before, after = original(batch, b), source(cb, b)
        words = batch.word_ids[b, : len(before)].tolist()
        masked_words = {w for w, x in zip(words, after) if x == MASK}
        assert all((x == MASK) == (w in masked_words) for w, x in zip(words, after))  # whole words
        assert len(masked_words) == math.ceil(Fraction(3, 10) * (max(words) + 1))


def test_text_infilling_replaces_whole_word_runs_with_one_mask(registry):
    batch = document_batch(300, 3, words=(5, 9), seed=8)
    cb = corrupt(registry, batch, **{**ONLY, "mask": 0.3})
    masked_share = []
    for b in range(300):
        after = source(cb, b)
        assert is_infilled(batch, b, after), b
        literal = next(i for i, t in enumerate(after) if t >= 20)
        assert not is_infilled(batch, b, after[:literal] + [after[literal] % 979 + 21] + after[literal + 1:])
        masks = after.count(MASK)
        assert masks >= 1
        masked_share.append(1 - (len(after) - 2 - masks) / (len(original(batch, b)) - 2))
    # Spans start at distinct words but may overlap, so a little under 30% of the text goes.
    assert 0.2 < sum(masked_share) / len(masked_share) < 0.34


def test_zero_length_spans_insert_a_mask(registry):
    """With λ = 0.1 most Poisson spans are empty; each still leaves a [MASK] (an insertion)."""
    batch = document_batch(100, 3, words=(5, 9), seed=9)
    cb = corrupt(registry, batch, **{**ONLY, "mask": 0.3, "poisson_lambda": 0.1})
    inserted = 0
    for b in range(100):
        after = source(cb, b)
        assert is_infilled(batch, b, after), b
        removed = len(original(batch, b)) - (len(after) - after.count(MASK))
        inserted += after.count(MASK) > removed  # more masks than removed tokens: some stand for nothing
    assert inserted >= 95


def test_poisson_span_lengths_reach_the_budget_exactly():
    g = torch.Generator().manual_seed(10)
    budget = torch.full((3000,), 40)
    lengths, zeros = bart.span_lengths(budget, 3.0, g)
    assert torch.equal(lengths.sum(dim=1), budget) and bool((lengths >= 0).all())
    # A row's first positive span is untrimmed (budget 40 is far above it): Poisson(3) given > 0.
    first = lengths[:, 0]
    for k in range(1, 7):
        p = math.exp(-3) * 3**k / math.factorial(k) / (1 - math.exp(-3))
        count = int((first == k).sum())
        assert abs(count - 3000 * p) <= 4 * math.sqrt(3000 * p * (1 - p)), k
    # Zero-length draws come at e^-3 of all draws (a little less: the span that reaches the budget
    # is never empty).
    spans_per_row = (lengths > 0).sum(dim=1)
    share_zero = float(zeros.sum()) / float(zeros.sum() + spans_per_row.sum())
    assert abs(share_zero - math.exp(-3)) < 0.01


def test_random_replacements_are_never_special(registry):
    batch = document_batch(200, 3, seed=11)
    cb = corrupt(registry, batch, **{**ONLY, "mask": 0.5, "mask_length": "subword", "replace_length": -1,
                                     "mask_random": 1.0})
    for b in range(200):
        before, after = original(batch, b), source(cb, b)
        replaced = [y for x, y in zip(before, after) if x != y]
        assert replaced and all(t >= 20 for t in replaced)


def test_mask_random_share(registry):
    batch = document_batch(400, 3, seed=12)
    cb = corrupt(registry, batch, **{**ONLY, "mask": 0.3, "mask_length": "subword", "replace_length": -1,
                                     "mask_random": 0.1})
    masks = randoms = 0
    for b in range(400):
        before, after = original(batch, b), source(cb, b)
        masks += sum(y == MASK for y in after)
        randoms += sum(x != y and y != MASK for x, y in zip(before, after))
    n = masks + randoms  # (a random draw equal to the original token goes unseen: 1 in 980)
    assert abs(randoms - 0.1 * n) <= 4 * math.sqrt(n * 0.1 * 0.9)


def test_document_rotation(registry):
    N = 2000
    batch = document_batch(N, 2, words=(4, 4), seed=13)
    cb = corrupt(registry, batch, **{**ONLY, "rotate": 1.0})
    offsets = []
    for b in range(N):
        body, after = original(batch, b)[1:-1], source(cb, b)
        assert after[0] == VOCAB.cls_id and after[-1] == VOCAB.sep_id
        rotations = [k for k in range(len(body)) if body[k:] + body[:k] == after[1:-1]]
        assert rotations, b
        offsets.append(rotations[0] / (len(body) - 1))
    # The new start is uniform over the text's m tokens: offset / (m - 1) has mean 1/2, sd < 0.58.
    assert abs(sum(offsets) / N - 0.5) < 4 * 0.58 / math.sqrt(N)
    assert sum(o == 0 for o in offsets) < 0.2 * N


def test_insertion(registry):
    batch = document_batch(200, 3, seed=14)
    cb = corrupt(registry, batch, **{**ONLY, "insert": 0.2})
    for b in range(200):
        before, after = original(batch, b), source(cb, b)
        assert len(after) == len(before) + math.ceil(Fraction(2, 10) * len(before))
        assert after[0] != MASK and after[-1] != MASK
        assert [t for t in after if t != MASK] == before


def test_everything_together_is_deterministic(registry):
    batch = document_batch(16, 4, seed=15)
    params = {"rotate": 0.5, "insert": 0.1}
    a, b, c = (corrupt(registry, batch, seed=s, **params) for s in (1, 1, 2))
    assert all(torch.equal(x, y) for x, y in zip(a[:5], b[:5]))
    assert not torch.equal(a.input_ids, c.input_ids)


def test_lambda_must_be_positive(registry):
    with pytest.raises(objreg.InvalidParameterError, match="poisson_lambda"):
        registry.get("bart", vocab=VOCAB, poisson_lambda=0.0)


@pytest.mark.parametrize("seed", range(8))
def test_multinomial_draws_are_torch_multinomial_draw_for_draw(seed):
    """The rand + searchsorted form of bart's random tokens gives torch.multinomial's samples and
    leaves the generator where torch.multinomial leaves it (the draws after it stay the same)."""
    g = torch.Generator().manual_seed(seed)
    for V, n in ((5, 2), (100, 7), (1000, 1000), (30522, 20000), (8000, 1)):
        weights = (torch.rand(V, generator=g) > 0.05).float()
        weights[:3] = 0.0
        a, b = torch.Generator().manual_seed(seed + V), torch.Generator().manual_seed(seed + V)
        expected = torch.multinomial(weights, n, replacement=True, generator=a)
        assert torch.equal(bart.multinomial_draws(weights, n, b), expected)
        assert torch.equal(a.get_state(), b.get_state())
        where = torch.rand(n, generator=g) < 0.1
        c = torch.Generator().manual_seed(seed + V)
        assert torch.equal(bart.multinomial_draws(weights, n, c, where)[where], expected[where])
        assert torch.equal(c.get_state(), a.get_state())
