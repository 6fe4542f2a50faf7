"""Which positions masking selects: whole words, inclusion probabilities, budgets, policies."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

import objreg
from objreg import IGNORE_INDEX
from objreg.toolkit import selection


def test_words_follow_word_id_changes_for_any_tokenizer():
    # A SentencePiece-like row: "▁The ▁cat s ▁sat [MASK] ▁on ▁it" with arbitrary, non-contiguous word
    # ids and a literal special token inside the text; no "##" anywhere. Then padding.
    ids = torch.tensor([[2, 10, 11, 12, 13, 4, 14, 15, 3, 0, 0]])
    word_ids = torch.tensor([[-1, 7, 9, 9, 4, -1, 4, 30, -1, -1, -1]])
    padding = torch.arange(11)[None] >= 9
    special = torch.isin(ids, torch.arange(5)) | padding
    batch = objreg.TokenBatch(ids, padding, special, word_ids, torch.zeros_like(ids), torch.zeros_like(ids))
    w = selection.words(batch)
    # Reference: a new word wherever the id changes or a special token intervenes.
    expected, current, previous = [], -1, None
    for t in range(11):
        if special[0, t]:
            expected.append(-1)
            previous = None
            continue
        if previous is None or word_ids[0, t] != previous:
            current += 1
        previous = word_ids[0, t]
        expected.append(current)
    assert w.index[0].tolist() == expected == [-1, 0, 1, 1, 2, -1, 3, 4, -1, -1, -1]
    assert w.count.tolist() == [5] and w.size[0].tolist() == [1, 2, 1, 1, 1]
    # "▁sat" and "▁on" share the word id 4 but a [MASK] separates them: two words.
    assert selection.per_token(w.size, w, fill=0)[0].tolist() == [0, 1, 2, 2, 1, 0, 1, 1, 0, 0, 0]


def test_inclusion_probabilities_water_filling_matches_bisection():
    g = torch.Generator().manual_seed(0)
    weights = torch.rand(6, 30, generator=g, dtype=torch.float64) ** 4 * 100  # very skewed
    sizes = torch.randint(1, 4, (6, 30), generator=g)
    target = torch.tensor([[3.0], [10.0], [20.0], [35.0], [50.0], [1.0]], dtype=torch.float64)
    pi = selection.inclusion_probabilities(weights, target, sizes).double()
    lo, hi = torch.zeros(6, 1, dtype=torch.float64), torch.full((6, 1), 1e12, dtype=torch.float64)
    for _ in range(200):  # bisection on each row's scale c, in float64
        c = (lo + hi) / 2
        short = ((c * weights).clamp(max=1) * sizes).sum(dim=1, keepdim=True) < target
        lo, hi = torch.where(short, c, lo), torch.where(short, hi, c)
    torch.testing.assert_close(pi, (c * weights).clamp(max=1), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close((pi * sizes).sum(dim=1, keepdim=True), target, rtol=0, atol=1e-4)
    assert (pi == 1).any() and (pi < 1).any()  # the case where water-filling matters


def bert_greedy(sizes: list[int], keys: list[float], budget: int) -> list[bool]:
    """google-research/bert's loop: visit words in key order, skip one that would overflow."""
    taken, used = [False] * len(sizes), 0
    for i in sorted(range(len(sizes)), key=lambda i: -keys[i]):
        if used >= budget:
            break
        if keys[i] == -math.inf or used + sizes[i] > budget:
            continue
        taken[i], used = True, used + sizes[i]
    return taken


def test_greedy_fill_equals_the_sequential_reference():
    g = torch.Generator().manual_seed(1)
    B, U = 300, 25
    sizes = torch.randint(1, 6, (B, U), generator=g)
    keys = torch.rand(B, U, generator=g, dtype=torch.float64)
    keys = torch.where(torch.rand(B, U, generator=g) < 0.1, -math.inf, keys)  # some invalid units
    budget = torch.randint(0, 30, (B,), generator=g)
    taken = selection.greedy_fill(sizes, keys, budget)
    for b in range(B):
        assert taken[b].tolist() == bert_greedy(sizes[b].tolist(), keys[b].tolist(), int(budget[b])), b


def test_pareto_keys_select_with_the_target_probabilities():
    weights = torch.tensor([[5.0, 3, 2, 1, 1, 1, 0.5, 0.5, 0.2, 0.1] * 2])
    pi = selection.inclusion_probabilities(weights, torch.tensor([[6.0]]))  # two capped at 1
    N = 40_000
    keys = selection.pareto_keys(pi.expand(N, -1), torch.ones(N, 20, dtype=torch.bool), torch.Generator().manual_seed(2))
    included = torch.zeros(N, 20).scatter(1, keys.topk(6, dim=1).indices, 1.0).mean(dim=0)
    sigma = (pi[0] * (1 - pi[0]) / N).sqrt()
    assert ((included - pi[0]).abs() <= 5 * sigma + 2e-3).all(), (included, pi)


def masked_per_rank(cb: objreg.CorruptedBatch, batch: objreg.TokenBatch, zipf) -> torch.Tensor:
    selected = cb.labels != IGNORE_INDEX
    return torch.bincount(batch.input_ids[selected] - zipf.special, minlength=zipf.ranks).double()


def chi_square_flat(counts: torch.Tensor) -> float:
    return float(((counts - counts.mean()) ** 2 / counts.mean()).sum())


@pytest.mark.parametrize("name", ["mlm", "wwm"])
def test_inverse_frequency_flattens_the_masked_ranks(zipf, registry, name):
    batch = zipf.batch(256, 256)
    vocab = selection.vocab_with_counts(zipf.vocab, batch)
    flat = masked_per_rank(registry.get(name, vocab=vocab, masking_policy="inverse_frequency")
                           .corrupt(batch, torch.Generator().manual_seed(3)), batch, zipf)
    zipfian = masked_per_rank(registry.get(name, vocab=vocab).corrupt(batch, torch.Generator().manual_seed(3)), batch, zipf)
    # 19 degrees of freedom: chi-square above 50 has probability < 1e-4 for a flat distribution.
    assert chi_square_flat(flat) < 50, flat
    assert chi_square_flat(zipfian) > 1000 and zipfian[0] / zipfian[-1] > 10  # uniform masking follows Zipf


@pytest.mark.parametrize("name", ["mlm", "wwm"])
def test_entropy_policy_masks_in_proportion_to_surprisal(zipf, registry, name):
    batch = zipf.batch(256, 256, seed=4)
    cb = registry.get(name, vocab=zipf.vocab, masking_policy="entropy").corrupt(batch, torch.Generator().manual_seed(5))
    selected = cb.labels != IGNORE_INDEX
    s = batch.surprisal[~batch.is_special].double()
    mu, var = float(s.mean()), float(s.var(unbiased=False))
    expected = (var + mu**2) / mu  # size-biased mean: E[s | masked] when P(masked) ∝ s
    masked = batch.surprisal[selected].double()
    standard_error = float(masked.std()) / math.sqrt(len(masked))
    assert abs(float(masked.mean()) - expected) < 5 * standard_error + 0.01, (float(masked.mean()), expected)
    assert expected - mu > 0.5  # the test can tell the policy from uniform masking


def test_span_policies_shift_which_spans_are_masked(zipf, registry):
    # A span brings its neighbours along, so the policy weighs spans, not single tokens: masked
    # tokens are flatter across ranks and more surprising than under uniform span masking.
    batch = zipf.batch(256, 256, seed=6)
    vocab = selection.vocab_with_counts(zipf.vocab, batch)
    policies = ("uniform", "inverse_frequency", "entropy")
    objectives = {policy: registry.get("span", vocab=vocab, masking_policy=policy) for policy in policies}
    runs = {policy: o.corrupt(batch, torch.Generator().manual_seed(7)) for policy, o in objectives.items()}
    ratio = {p: float((c := masked_per_rank(cb, batch, zipf))[0] / c[-1]) for p, cb in runs.items()}
    assert ratio["inverse_frequency"] < 0.7 * ratio["uniform"]
    mean = {p: float(batch.surprisal[cb.labels != IGNORE_INDEX].mean()) for p, cb in runs.items()}
    assert mean["entropy"] > mean["uniform"] + 0.08


@pytest.mark.parametrize("name", ["mlm", "wwm", "span"])
def test_policies_without_their_data_raise_a_clear_error(zipf, registry, name):
    batch = zipf.batch(2, 16)
    with pytest.raises(objreg.DataError, match="token_counts"):
        registry.get(name, vocab=zipf.vocab, masking_policy="inverse_frequency").corrupt(batch, torch.Generator())
    entropy = registry.get(name, vocab=zipf.vocab, masking_policy="entropy")
    with pytest.raises(objreg.DataError, match="surprisal.*token_surprisal"):
        entropy.corrupt(batch._replace(surprisal=None), torch.Generator())
    with pytest.raises(objreg.DataError, match="shape"):
        entropy.corrupt(batch._replace(surprisal=torch.ones(2, 3)), torch.Generator())
    with pytest.raises(objreg.DataError, match="non-negative"):
        entropy.corrupt(batch._replace(surprisal=-batch.surprisal), torch.Generator())
    with pytest.raises(objreg.InvalidParameterError, match="masking_policy"):
        registry.get(name, vocab=zipf.vocab, masking_policy="loudest")


def test_corpus_path_fills_token_counts(tokenizer, texts):
    corpus = objreg.Corpus("tiny", tuple(tuple(objreg.split_sentences(t)) for t in texts))
    tokenized = objreg.TokenizedCorpus(tokenizer, corpus, 24)
    expected = Counter(i for doc in corpus.documents for ids, _ in tokenizer.encode_sentences(doc) for i in ids)
    counts = tokenized.vocab.token_counts
    assert counts.shape == (tokenizer.vocab.size,) and int(counts.sum()) == sum(expected.values())
    assert all(int(counts[i]) == n for i, n in expected.items())
    assert tokenized.vocab == tokenizer.vocab  # counts do not take part in equality
    with pytest.raises(objreg.InvalidParameterError, match="token_counts"):
        objreg.Vocabulary(size=6, pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4, special_ids=(0,),
                          token_counts=torch.ones(5))


def test_token_batch_surprisal_is_optional(zipf):
    batch = zipf.batch(4, 8)
    bare = batch._replace(surprisal=None)
    assert bare.to("cpu").surprisal is None and bare.select(slice(1, 3)).surprisal is None
    assert torch.equal(batch.select(torch.tensor([2, 0])).surprisal, batch.surprisal[[2, 0]])
    assert objreg.TokenBatch(*bare[:6]).surprisal is None  # six fields still build a batch


# -- partial selection instead of sorts: the same picks as the sorts -------------------------------


def tied_keys(seed: int, B: int, G: int, levels: int) -> torch.Tensor:
    """Keys with many equal values (``levels`` distinct ones), so that ties fall at every cut."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, levels, (B, G), generator=g).float() / levels


@pytest.mark.parametrize("shape", [(1, 1), (5, 9), (40, 300), (3, 0), (0, 4)])
def test_nonzero_positions_are_torch_nonzero(shape):
    mask = torch.rand(shape, generator=torch.Generator().manual_seed(shape[0])) < 0.3
    rows, columns = selection.nonzero_positions(mask)
    expected = mask.nonzero(as_tuple=True)
    assert rows.dtype == columns.dtype == torch.long
    assert torch.equal(rows, expected[0]) and torch.equal(columns, expected[1])


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("levels", [3, 50, 2**24])
def test_smallest_keys_picks_the_first_places_of_the_argsort(seed, levels):
    for B, G in ((1, 1), (7, 2), (33, 17), (64, 484)):
        keys = tied_keys(seed, B, G, levels)
        count = torch.randint(0, G + 1, (B,), generator=torch.Generator().manual_seed(seed))
        first = torch.arange(G)[None, :] < count[:, None]
        expected = torch.zeros_like(first).scatter_(1, keys.argsort(dim=1), first)
        assert torch.equal(selection.smallest_keys(keys, count), expected)
        assert torch.equal(selection.smallest_keys(keys, torch.zeros(B, dtype=torch.long)), torch.zeros_like(first))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("levels", [3, 50, 2**24])
def test_smallest_ranks_are_the_argsort_ranks_of_the_smallest(seed, levels):
    for B, G in ((1, 1), (9, 5), (40, 214)):
        keys = tied_keys(seed, B, G, levels)
        count = torch.randint(0, G + 1, (B,), generator=torch.Generator().manual_seed(seed + 1))
        expected = keys.argsort(dim=1).argsort(dim=1)
        got = selection.smallest_ranks(keys, count)
        inside = expected < count[:, None]
        assert torch.equal(got[inside], expected[inside])
        assert bool((got[~inside] >= count[:, None].expand_as(got)[~inside]).all())


def test_smallest_sorted_is_topk():
    keys = torch.rand(50, 300, generator=torch.Generator().manual_seed(0))
    for k in (1, 29, 300):
        assert torch.equal(selection.smallest_sorted(keys, k), keys.topk(k, dim=1, largest=False).values)
        assert torch.equal(selection.smallest_sorted(keys.double(), k), keys.double().topk(k, dim=1, largest=False).values)


def reference_selection_lists(selected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The sort-based formulation: selected positions sort first, in order."""
    B, T = selected.shape
    count = selected.sum(dim=1)
    K = max(1, int(count.max())) if B else 1
    index = torch.arange(T).expand(B, T)
    order = torch.where(selected, index, index + T).argsort(dim=1)[:, :K]
    real = torch.arange(K)[None, :] < count[:, None]
    return torch.where(real, order, 0), real.float()


def test_selection_lists_match_the_sort():
    g = torch.Generator().manual_seed(0)
    for B, T, p in ((1, 1, 0.5), (5, 9, 0.0), (32, 128, 0.15), (8, 40, 1.0)):
        selected = torch.rand(B, T, generator=g) < p
        for got, want in zip(selection.selection_lists(selected), reference_selection_lists(selected)):
            assert got.dtype == want.dtype and torch.equal(got, want)


@pytest.mark.parametrize("rate", [0.0, 0.01, 0.15, 0.5, 1.0])
def test_uniform_bernoulli_select_is_the_weighted_one_with_equal_weights(rate):
    """weights=None (the uniform policy's per-row probability) gives the very selection of
    all-equal weights, and leaves the generator in the same state, forced rows included."""
    g = torch.Generator().manual_seed(3)
    B, T = 64, 40
    length = torch.randint(0, T + 1, (B,), generator=g)
    can = (torch.arange(T)[None, :] < length[:, None]) & (torch.rand(B, T, generator=g) < 0.9)
    for at_least_one in (True, False):
        a, b = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
        fast = selection.bernoulli_select(None, can, rate, a, at_least_one)
        weighted = selection.bernoulli_select(can.float(), can, rate, b, at_least_one)
        assert torch.equal(fast, weighted) and torch.equal(a.get_state(), b.get_state())
        if at_least_one and rate < 0.5:
            assert bool((fast.sum(dim=1) == (can.sum(dim=1) > 0).long()).any())  # some rows were forced
