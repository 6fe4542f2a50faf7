"""SpanBERT span masking: whole words, the 15% budget, pluggable span lengths, 80/10/10 per span."""

from __future__ import annotations

import math

import pytest
import torch

import objreg
from objreg import IGNORE_INDEX
from objreg.plugins.objectives import span
from objreg.testing import check_objective_contract
from objreg.toolkit import lengths as span_lengths
from objreg.toolkit import selection

# 0..4 special ([PAD] [UNK] [CLS] [SEP] [MASK]), 5..59 ordinary.
VOCAB = objreg.Vocabulary(size=60, pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4, special_ids=tuple(range(5)))
GEOMETRIC = dict(zip(range(1, 11), span_lengths.geometric_lengths(0.2, 1, 10).probs.tolist()))


def word_batch(B: int, T: int, seed: int = 0, piece_prob: float = 0.4) -> objreg.TokenBatch:
    """``[CLS] ... [SEP]`` rows of random lengths; a token continues the previous word with
    probability ``1 - piece_prob`` (``piece_prob=1``: one token per word). Word ids are arbitrary
    labels, as from any tokenizer."""
    g = torch.Generator().manual_seed(seed)
    word_of_token = (torch.rand(B, T, generator=g) < piece_prob).long().cumsum(dim=1)
    labels = torch.randint(1000, 9000, (B, T + 1), generator=g).gather(1, word_of_token)
    ids = torch.randint(5, 60, (B, T), generator=g)
    length = torch.randint(3 * T // 4, T + 1, (B, 1), generator=g)
    index = torch.arange(T)[None, :]
    ids[:, 0] = VOCAB.cls_id
    ids = torch.where(index == length - 1, VOCAB.sep_id, ids)
    padding = index >= length
    ids = torch.where(padding, VOCAB.pad_id, ids)
    special = torch.isin(ids, VOCAB.special_id_tensor()) | padding
    return objreg.TokenBatch(ids, padding, special, torch.where(special, -1, labels), torch.where(special, -1, 0),
                             torch.where(padding, -1, 0))


def selected_mask(cb: objreg.CorruptedBatch) -> torch.Tensor:
    return cb.labels != IGNORE_INDEX


def budget_of(batch: objreg.TokenBatch, generator: torch.Generator, mask_prob: float = 0.15) -> torch.Tensor:
    """The objective's budget: n * mask_prob randomly rounded (its first draw), at least 1."""
    n = (~batch.is_special).sum(dim=1)
    rounding = objreg.uniform(tuple(n.shape), generator).double()
    return torch.where(n > 0, (n * mask_prob + rounding).floor().long().clamp(min=1), 0)


def pooled_lengths(batch: objreg.TokenBatch, distribution: span_lengths.LengthDistribution, seed: int) -> torch.Tensor:
    """Drawn lengths of the spans a corruption uses (those taken whole and the one cut at the
    budget). The stopping rule only looks at spans already drawn, so by Wald's identity their
    pooled histogram follows the length distribution."""
    w = selection.words(batch)
    g = torch.Generator().manual_seed(seed)
    spans = span.select_spans(w, selection.per_word((~batch.is_special).float(), w), distribution, budget_of(batch, g), g)
    used = torch.arange(w.size.shape[1])[None, :] < spans.used[:, None]
    return spans.lengths[used]


def histogram(lengths: torch.Tensor, support: int) -> torch.Tensor:
    return torch.bincount(lengths, minlength=support + 1)[1:].double() / len(lengths)


def assert_whole_words(batch: objreg.TokenBatch, selected: torch.Tensor) -> None:
    w = selection.words(batch)
    count = torch.zeros(w.size.shape[0], w.size.shape[1] + 1, dtype=torch.long)
    count = count.scatter_add(1, torch.where(w.index >= 0, w.index, w.size.shape[1]), selected.long())[:, :-1]
    assert ((count == 0) | (count == w.size)).all()
    assert not (selected & batch.is_special).any()


def test_complete_words_and_the_budget(registry):
    batch = word_batch(512, 96)
    cb = registry.get("span", vocab=VOCAB).corrupt(batch, torch.Generator().manual_seed(0))
    selected = selected_mask(cb)
    assert_whole_words(batch, selected)
    taken, budget = selected.sum(dim=1), budget_of(batch, torch.Generator().manual_seed(0))
    # Each row meets its budget to within half of the word where the last span is cut.
    w = selection.words(batch)
    assert ((taken - budget).abs() <= w.size.amax(dim=1) / 2).all()
    difference = (taken - budget).double()
    # Cut at the nearest word boundary: no bias (a plain cut would undershoot by half a word).
    assert abs(float(difference.mean())) < 4 * float(difference.std()) / math.sqrt(len(difference))
    n = int((~batch.is_special).sum())
    assert abs(int(taken.sum()) - 0.15 * n) < 4 * math.sqrt(len(taken))  # E[budget] = 0.15 n exactly


def test_spans_are_contiguous_runs_of_words(registry):
    # One token per word and a low budget: spans rarely touch, so the masked runs are the spans
    # themselves and their mean length is the distribution's, 3.797 words.
    batch = word_batch(256, 512, seed=1, piece_prob=1.0)
    cb = registry.get("span", vocab=VOCAB, mask_prob=0.05).corrupt(batch, torch.Generator().manual_seed(2))
    selected = selected_mask(cb).long()
    starts = (selected[:, 1:] - selected[:, :-1]) == 1
    runs = int(starts.sum())
    mean_run = float(selected.sum()) / runs
    assert runs > 1500 and abs(mean_run - span_lengths.geometric_lengths(0.2).mean) < 0.35


def test_geometric_length_histogram(registry):
    batch = word_batch(512, 512, seed=3)
    lengths = pooled_lengths(batch, span_lengths.geometric_lengths(0.2, 1, 10), seed=4)
    assert len(lengths) > 4000 and lengths.min() >= 1 and lengths.max() <= 10
    expected = torch.tensor(list(GEOMETRIC.values()), dtype=torch.float64)
    sigma = (expected * (1 - expected) / len(lengths)).sqrt()
    assert ((histogram(lengths, 10) - expected).abs() <= 4.5 * sigma).all()
    assert abs(float(lengths.double().mean()) - 3.797) < 0.1


def test_empirical_length_histogram(registry):
    batch = word_batch(512, 128, seed=5)
    distribution = span_lengths.parse_lengths("1:0.5,4:0.3,7:0.2")
    lengths = pooled_lengths(batch, distribution, seed=6)
    expected = torch.tensor([0.5, 0, 0, 0.3, 0, 0, 0.2], dtype=torch.float64)
    assert set(lengths.unique().tolist()) == {1, 4, 7}
    assert (histogram(lengths, 7) - expected).abs().max() < 4.5 * math.sqrt(0.25 / len(lengths))
    cb = registry.get("span", vocab=VOCAB, length_distribution="empirical",
                      empirical_lengths="1:0.5,4:0.3,7:0.2").corrupt(batch, torch.Generator().manual_seed(7))
    assert_whole_words(batch, selected_mask(cb))


def test_answer_lengths_of_squad_drive_the_spans(registry, shared_file, tokenizer):
    distribution = span_lengths.answer_length_distribution(shared_file("squad_v1.1/dev-v1.1.half-b.json"), tokenizer,
                                                      max_length=10)
    objective = registry.get("span", vocab=VOCAB, length_distribution="empirical",
                             empirical_lengths=span_lengths.format_lengths(distribution))
    lengths = pooled_lengths(word_batch(512, 128, seed=8), span.length_distribution(objective.params), seed=9)
    expected = torch.tensor([distribution.get(n, 0.0) for n in range(1, 11)], dtype=torch.float64)
    assert (histogram(lengths, 10) - expected).abs().max() < 4.5 * math.sqrt(0.25 / len(lengths))


def test_replacement_is_decided_per_span(registry):
    batch = word_batch(256, 96, seed=10)
    params = {"mask_replace_prob": 0.5, "random_replace_prob": 0.3}
    cb = registry.get("span", vocab=VOCAB, **params).corrupt(batch, torch.Generator().manual_seed(11))
    # Redraw the same spans and fates from the same seed (the order the objective draws them).
    g = torch.Generator().manual_seed(11)
    w = selection.words(batch)
    spans = span.select_spans(w, selection.per_word((~batch.is_special).float(), w),
                              span_lengths.geometric_lengths(0.2), budget_of(batch, g), g)
    fate = objreg.uniform(tuple(w.size.shape), g).gather(1, spans.owner.clamp(max=w.size.shape[1] - 1))
    selected = selected_mask(cb)
    assert torch.equal(selected, selection.per_token(spans.chosen, w, fill=False))
    token_fate = selection.per_token(fate, w, fill=1.0)
    masked = cb.input_ids == VOCAB.mask_id
    kept = cb.input_ids == batch.input_ids
    assert torch.equal(masked & selected, selected & (token_fate < 0.5))  # one draw decides the whole span
    assert (kept[selected & (token_fate >= 0.8)]).all()
    randomised = selected & (token_fate >= 0.5) & (token_fate < 0.8)
    assert not masked[randomised].any() and (cb.input_ids[randomised] >= 5).all()
    # Spans, not tokens, split 50/30/20: the [MASK] share of the spans is about 0.5.
    rows = torch.nonzero(spans.chosen)[:, 0]
    span_key, first = torch.unique(rows * 10_000 + spans.owner[spans.chosen], return_inverse=True)
    span_fate = torch.zeros(len(span_key)).scatter(0, first, fate[spans.chosen])
    share = float((span_fate < 0.5).double().mean())
    assert len(span_key) > 400 and abs(share - 0.5) < 4 * math.sqrt(0.25 / len(span_key))


def test_seeded_and_input_untouched(registry):
    batch = word_batch(32, 48, seed=12)
    objective = registry.get("span", vocab=VOCAB)
    a, b, c = (objective.corrupt(batch, torch.Generator().manual_seed(s)) for s in (1, 1, 2))
    assert all(torch.equal(x, y) for x, y in zip(a[:5], b[:5]))
    assert not torch.equal(a.labels, c.labels)
    assert torch.equal(batch.input_ids, word_batch(32, 48, seed=12).input_ids)


def test_parameter_validation(registry):
    with pytest.raises(objreg.InvalidParameterError, match="span_lower.*span_upper"):
        registry.get("span", vocab=VOCAB, span_lower=5, span_upper=3)
    with pytest.raises(objreg.InvalidParameterError, match="empirical_lengths"):
        registry.get("span", vocab=VOCAB, length_distribution="empirical")
    with pytest.raises(objreg.InvalidParameterError, match="span lengths"):
        registry.get("span", vocab=VOCAB, length_distribution="empirical", empirical_lengths="1:0.5,x")
    with pytest.raises(objreg.InvalidParameterError, match="geometric_p"):
        registry.get("span", vocab=VOCAB, geometric_p=0.0)
    with pytest.raises(objreg.InvalidParameterError, match="length_distribution"):
        registry.get("span", vocab=VOCAB, length_distribution="poisson")


def test_keeps_the_contract_with_label_smoothing_and_consistency():
    passed = check_objective_contract("span", params={"label_smoothing": 0.1, "consistency_weight": 0.5,
                                                      "mask_prob": 0.3})
    assert "per-sample dots by jvp equal the per-example loop" in passed
