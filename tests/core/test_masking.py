"""objreg.masking: words, selection budgets, policies, loss pieces, span lengths, character noise."""

from __future__ import annotations

import json
import math
import re
from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import objreg
from objreg import IGNORE_INDEX, masking

SPECIAL = 5  # ids 0..4: [PAD] [UNK] [CLS] [SEP] [MASK]
RANKS = 20  # ordinary ids 5..24, id 5 the most frequent
VOCAB = objreg.Vocabulary(size=SPECIAL + RANKS, pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4,
                          special_ids=tuple(range(SPECIAL)))


@pytest.fixture(scope="module")
def registry():
    return objreg.Registry.load(load_entrypoints=False)


def zipf_batch(B: int, T: int, seed: int = 0) -> objreg.TokenBatch:
    """``[CLS] ... [SEP]`` rows of one-token words drawn from a Zipf law over the ordinary ids, with a
    surprisal per token drawn from U(0.5, 4.5)."""
    g = torch.Generator().manual_seed(seed)
    zipf = 1 / torch.arange(1, RANKS + 1).double()
    ids = SPECIAL + torch.multinomial(zipf / zipf.sum(), B * T, replacement=True, generator=g).view(B, T)
    ids[:, 0], ids[:, -1] = VOCAB.cls_id, VOCAB.sep_id
    special = torch.isin(ids, torch.arange(SPECIAL))
    words = torch.where(special, -1, torch.arange(T).expand(B, T))
    surprisal = 0.5 + 4 * torch.rand(B, T, generator=g, dtype=torch.float64)
    return objreg.TokenBatch(ids, torch.zeros(B, T, dtype=torch.bool), special, words,
                             torch.where(special, -1, 0), torch.zeros(B, T, dtype=torch.long), surprisal.float())


# -- words --------------------------------------------------------------------------------------


def test_words_follow_word_id_changes_for_any_tokenizer():
    # A SentencePiece-like row: "▁The ▁cat s ▁sat [MASK] ▁on ▁it" with arbitrary, non-contiguous word
    # ids and a literal special token inside the text; no "##" anywhere. Then padding.
    ids = torch.tensor([[2, 10, 11, 12, 13, 4, 14, 15, 3, 0, 0]])
    word_ids = torch.tensor([[-1, 7, 9, 9, 4, -1, 4, 30, -1, -1, -1]])
    padding = torch.arange(11)[None] >= 9
    special = torch.isin(ids, torch.arange(SPECIAL)) | padding
    batch = objreg.TokenBatch(ids, padding, special, word_ids, torch.zeros_like(ids), torch.zeros_like(ids))
    w = masking.words(batch)
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
    assert masking.per_token(w.size, w, fill=0)[0].tolist() == [0, 1, 2, 2, 1, 0, 1, 1, 0, 0, 0]


# -- selection ----------------------------------------------------------------------------------


def test_inclusion_probabilities_water_filling_matches_bisection():
    g = torch.Generator().manual_seed(0)
    weights = torch.rand(6, 30, generator=g, dtype=torch.float64) ** 4 * 100  # very skewed
    sizes = torch.randint(1, 4, (6, 30), generator=g)
    target = torch.tensor([[3.0], [10.0], [20.0], [35.0], [50.0], [1.0]], dtype=torch.float64)
    pi = masking.inclusion_probabilities(weights, target, sizes).double()
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
    taken = masking.greedy_fill(sizes, keys, budget)
    for b in range(B):
        assert taken[b].tolist() == bert_greedy(sizes[b].tolist(), keys[b].tolist(), int(budget[b])), b


def test_pareto_keys_select_with_the_target_probabilities():
    weights = torch.tensor([[5.0, 3, 2, 1, 1, 1, 0.5, 0.5, 0.2, 0.1] * 2])
    pi = masking.inclusion_probabilities(weights, torch.tensor([[6.0]]))  # two capped at 1
    N = 40_000
    keys = masking.pareto_keys(pi.expand(N, -1), torch.ones(N, 20, dtype=torch.bool), torch.Generator().manual_seed(2))
    included = torch.zeros(N, 20).scatter(1, keys.topk(6, dim=1).indices, 1.0).mean(dim=0)
    sigma = (pi[0] * (1 - pi[0]) / N).sqrt()
    assert ((included - pi[0]).abs() <= 5 * sigma + 2e-3).all(), (included, pi)


# -- masking policies (statistical, fixed seeds) -------------------------------------------------


def masked_per_rank(cb: objreg.CorruptedBatch, batch: objreg.TokenBatch) -> torch.Tensor:
    selected = cb.labels != IGNORE_INDEX
    return torch.bincount(batch.input_ids[selected] - SPECIAL, minlength=RANKS).double()


def chi_square_flat(counts: torch.Tensor) -> float:
    return float(((counts - counts.mean()) ** 2 / counts.mean()).sum())


@pytest.mark.parametrize("name", ["mlm", "wwm"])
def test_inverse_frequency_flattens_the_masked_ranks(registry, name):
    batch = zipf_batch(256, 256)
    vocab = masking.vocab_with_counts(VOCAB, batch)
    flat = masked_per_rank(registry.get(name, vocab=vocab, masking_policy="inverse_frequency")
                           .corrupt(batch, torch.Generator().manual_seed(3)), batch)
    zipfian = masked_per_rank(registry.get(name, vocab=vocab).corrupt(batch, torch.Generator().manual_seed(3)), batch)
    # 19 degrees of freedom: chi-square above 50 has probability < 1e-4 for a flat distribution.
    assert chi_square_flat(flat) < 50, flat
    assert chi_square_flat(zipfian) > 1000 and zipfian[0] / zipfian[-1] > 10  # uniform masking follows Zipf


@pytest.mark.parametrize("name", ["mlm", "wwm"])
def test_entropy_policy_masks_in_proportion_to_surprisal(registry, name):
    batch = zipf_batch(256, 256, seed=4)
    cb = registry.get(name, vocab=VOCAB, masking_policy="entropy").corrupt(batch, torch.Generator().manual_seed(5))
    selected = cb.labels != IGNORE_INDEX
    s = batch.surprisal[~batch.is_special].double()
    mu, var = float(s.mean()), float(s.var(unbiased=False))
    expected = (var + mu**2) / mu  # size-biased mean: E[s | masked] when P(masked) ∝ s
    masked = batch.surprisal[selected].double()
    standard_error = float(masked.std()) / math.sqrt(len(masked))
    assert abs(float(masked.mean()) - expected) < 5 * standard_error + 0.01, (float(masked.mean()), expected)
    assert expected - mu > 0.5  # the test can tell the policy from uniform masking


def test_span_policies_shift_which_spans_are_masked(registry):
    # A span brings its neighbours along, so the policy weighs spans, not single tokens: masked
    # tokens are flatter across ranks and more surprising than under uniform span masking.
    batch = zipf_batch(256, 256, seed=6)
    vocab = masking.vocab_with_counts(VOCAB, batch)
    policies = ("uniform", "inverse_frequency", "entropy")
    objectives = {policy: registry.get("span", vocab=vocab, masking_policy=policy) for policy in policies}
    runs = {policy: o.corrupt(batch, torch.Generator().manual_seed(7)) for policy, o in objectives.items()}
    ratio = {p: float((c := masked_per_rank(cb, batch))[0] / c[-1]) for p, cb in runs.items()}
    assert ratio["inverse_frequency"] < 0.7 * ratio["uniform"]
    mean = {p: float(batch.surprisal[cb.labels != IGNORE_INDEX].mean()) for p, cb in runs.items()}
    assert mean["entropy"] > mean["uniform"] + 0.08


@pytest.mark.parametrize("name", ["mlm", "wwm", "span"])
def test_policies_without_their_data_raise_a_clear_error(registry, name):
    batch = zipf_batch(2, 16)
    with pytest.raises(objreg.DataError, match="token_counts"):
        registry.get(name, vocab=VOCAB, masking_policy="inverse_frequency").corrupt(batch, torch.Generator())
    entropy = registry.get(name, vocab=VOCAB, masking_policy="entropy")
    with pytest.raises(objreg.DataError, match="surprisal.*token_surprisal"):
        entropy.corrupt(batch._replace(surprisal=None), torch.Generator())
    with pytest.raises(objreg.DataError, match="shape"):
        entropy.corrupt(batch._replace(surprisal=torch.ones(2, 3)), torch.Generator())
    with pytest.raises(objreg.DataError, match="non-negative"):
        entropy.corrupt(batch._replace(surprisal=-batch.surprisal), torch.Generator())
    with pytest.raises(objreg.InvalidParameterError, match="masking_policy"):
        registry.get(name, vocab=VOCAB, masking_policy="loudest")


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


def test_token_batch_surprisal_is_optional():
    batch = zipf_batch(4, 8)
    bare = batch._replace(surprisal=None)
    assert bare.to("cpu").surprisal is None and bare.select(slice(1, 3)).surprisal is None
    assert torch.equal(batch.select(torch.tensor([2, 0])).surprisal, batch.surprisal[[2, 0]])
    assert objreg.TokenBatch(*bare[:6]).surprisal is None  # six fields still build a batch


# -- loss pieces ----------------------------------------------------------------------------------


@pytest.mark.parametrize("epsilon", [0.0, 0.1, 0.5])
def test_smoothed_nll_matches_the_closed_form(epsilon):
    g = torch.Generator().manual_seed(8)
    logits = torch.randn(3, 4, 11, generator=g, dtype=torch.float64) * 3
    targets = torch.randint(0, 11, (3, 4), generator=g)
    got = masking.smoothed_nll(logits, targets, epsilon)
    for b in range(3):
        for k in range(4):
            z = logits[b, k]
            log_p = z - math.log(sum(math.exp(float(v)) for v in z))
            want = -(1 - epsilon) * float(log_p[targets[b, k]]) - epsilon / 11 * float(log_p.sum())
            assert abs(float(got[b, k]) - want) < 1e-12
    torch.testing.assert_close(got, F.cross_entropy(logits.transpose(1, 2), targets, reduction="none",
                                                    label_smoothing=epsilon))
    per_row = masking.smoothed_nll(logits, targets, torch.tensor([0.0, epsilon, 1.0], dtype=torch.float64))
    torch.testing.assert_close(per_row[1], got[1])
    torch.testing.assert_close(per_row[2], -torch.log_softmax(logits[2], -1).mean(-1))


def test_consistency_kl_matches_a_loop_and_stops_the_gradient():
    g = torch.Generator().manual_seed(9)
    live = torch.randn(2, 3, 7, generator=g, dtype=torch.float64, requires_grad=True)
    stopped = torch.randn(2, 3, 7, generator=g, dtype=torch.float64, requires_grad=True)
    kl = masking.consistency_kl(live, stopped)
    values = kl.detach()
    for b in range(2):
        for k in range(3):
            p, q = torch.softmax(live[b, k], -1).tolist(), torch.softmax(stopped[b, k], -1).tolist()
            assert abs(float(values[b, k]) - sum(pi * math.log(pi / qi) for pi, qi in zip(p, q))) < 1e-12
    grad_live, grad_stopped = torch.autograd.grad(kl.sum(), [live, stopped], allow_unused=True, materialize_grads=True)
    assert torch.equal(grad_stopped, torch.zeros_like(stopped)) and grad_live.abs().sum() > 0
    # Forward mode too (the analysis uses jvp): a tangent on the stopped side changes nothing.
    _, tangent = torch.func.jvp(lambda s: masking.consistency_kl(live.detach(), s), (stopped.detach(),),
                                (torch.randn(2, 3, 7, generator=g, dtype=torch.float64),))
    assert torch.equal(tangent, torch.zeros_like(tangent))


class ViewModel(nn.Module):
    """A stand-in model: the second backbone pass returns ``other`` (a leaf we can differentiate by)."""

    def __init__(self, V: int, H: int, other: torch.Tensor):
        super().__init__()
        torch.manual_seed(0)
        self.heads = nn.ModuleDict({"lm": nn.Linear(H, V).double()})
        self.other = other

    def encode(self, input_ids, attention_mask, position_ids):
        return self.other


def test_masked_lm_loss_adds_smoothing_and_a_stopped_consistency_term():
    B, T, H, V = 3, 9, 4, VOCAB.size
    g = torch.Generator().manual_seed(10)
    batch = zipf_batch(B, T, seed=11)
    first = torch.rand(B, T, generator=g) < 0.6
    second = torch.rand(B, T, generator=g) < 0.6
    view = masking.MaskedView(batch.input_ids.clone(), first & ~batch.is_special)
    other_view = masking.MaskedView(batch.input_ids.flip(1), second & ~batch.is_special)
    params = {"label_smoothing": 0.2, "consistency_weight": 0.7}
    cb = masking.masked_lm_batch(batch, view, params, other_view)
    hidden = torch.randn(B, T, H, generator=g, dtype=torch.float64, requires_grad=True)
    other = torch.randn(B, T, H, generator=g, dtype=torch.float64, requires_grad=True)
    model = ViewModel(V, H, other)
    loss = masking.masked_lm_loss(objreg.ModelOutputs(hidden, model), cb)
    head = model.heads["lm"]
    for b in range(B):  # by hand, every position at a time
        picked = [t for t in range(T) if view.selected[b, t]]
        both = [t for t in range(T) if view.selected[b, t] and other_view.selected[b, t]]
        nll = [F.cross_entropy(head(hidden[b, t]), batch.input_ids[b, t], label_smoothing=0.2) for t in picked]
        kl = [F.kl_div(torch.log_softmax(head(other[b, t]), -1), torch.log_softmax(head(hidden[b, t]), -1),
                       reduction="sum", log_target=True) for t in both]
        want = sum(nll) / max(len(nll), 1) + 0.7 * sum(kl) / max(len(kl), 1)
        assert abs(float(loss[b].detach()) - float(want.detach())) < 1e-12
    grad_other, grad_hidden = torch.autograd.grad(loss.sum(), [other, hidden], allow_unused=True,
                                                  materialize_grads=True)
    assert torch.equal(grad_other, torch.zeros_like(other)) and grad_hidden.abs().sum() > 0
    assert set(cb.extras) == {"masked_positions", "masked_weights", "label_smoothing", "consistency_input_ids",
                              "consistency_positions", "consistency_weights", "consistency_weight"}


# -- span lengths -------------------------------------------------------------------------------


def test_geometric_lengths_mean_and_sampled_histogram():
    distribution = masking.geometric_lengths(0.2, 1, 10)
    q, n = 0.8, 10
    closed_form = 1 / 0.2 - n * q**n / (1 - q**n)  # mean of a geometric truncated to 1..n
    assert abs(distribution.mean - closed_form) < 1e-12 and abs(closed_form - 3.797) < 1e-3
    samples = distribution.sample((400, 500), torch.Generator().manual_seed(12))
    assert samples.min() >= 1 and samples.max() <= 10
    histogram = torch.bincount(samples.flatten(), minlength=11)[1:].double() / samples.numel()
    assert (histogram - distribution.probs).abs().max() < 0.004  # 200k draws: sigma <= 0.0009
    assert abs(float(samples.double().mean()) - closed_form) < 0.02


def test_empirical_lengths_parse_and_round_trip():
    distribution = masking.parse_lengths(" 3:1, 1:2,2:1 ")
    assert distribution.lengths.tolist() == [1, 2, 3] and distribution.probs.tolist() == [0.5, 0.25, 0.25]
    again = masking.parse_lengths(masking.format_lengths(distribution))
    assert torch.equal(again.lengths, distribution.lengths) and torch.allclose(again.probs, distribution.probs)
    for bad in ("", "1:0", "0:1", "two:1", "1=0.5", "1:-1"):
        with pytest.raises(objreg.InvalidParameterError, match="span lengths"):
            masking.parse_lengths(bad)


def test_answer_length_distribution_from_squad(shared_file, tokenizer, tmp_path):
    path = shared_file("squad_v1.1/dev-v1.1.half-a.json")
    distribution = masking.answer_length_distribution(path, tokenizer)
    assert abs(sum(distribution.values()) - 1) < 1e-12 and min(distribution) >= 1
    # Independent count: BERT's pre-tokeniser splits on whitespace and punctuation.
    answers = [qa["answers"][0]["text"] for article in json.loads(path.read_text())["data"]
               for paragraph in article["paragraphs"] for qa in paragraph["qas"]]
    counted = Counter(len(re.findall(r"\w+|[^\w\s]", a)) for a in answers)
    total = sum(counted.values())
    lengths = set(counted) | set(distribution)
    assert max(abs(counted.get(n, 0) / total - distribution.get(n, 0)) for n in lengths) < 0.005
    assert 2.5 < sum(n * p for n, p in distribution.items()) < 4.5 and max(distribution, key=distribution.get) == 1
    short = masking.answer_length_distribution(path, tokenizer, max_length=5)
    assert max(short) == 5 and abs(sum(short.values()) - 1) < 1e-12
    with pytest.raises(objreg.DataError, match="does not exist"):
        masking.answer_length_distribution(tmp_path / "missing.json", tokenizer)
    (tmp_path / "bad.json").write_text('{"data": [{"title": "x"}]}')
    with pytest.raises(objreg.DataError, match="SQuAD"):
        masking.answer_length_distribution(tmp_path / "bad.json", tokenizer)


# -- character noise ------------------------------------------------------------------------------

TEXTS = ["The quick brown fox jumps over the lazy dog. " * 40, "Colourless green ideas sleep furiously. " * 40]


def non_space(text: str) -> int:
    return sum(not c.isspace() for c in text)


def test_char_noise_is_seeded_and_keeps_whitespace():
    a = masking.char_noise(TEXTS, 0.1, torch.Generator().manual_seed(0))
    b = masking.char_noise(TEXTS, 0.1, torch.Generator().manual_seed(0))
    c = masking.char_noise(TEXTS, 0.1, torch.Generator().manual_seed(1))
    assert a == b and a != c and a != TEXTS
    assert [t.count(" ") for t in a] == [t.count(" ") for t in TEXTS]  # whitespace is never touched
    assert masking.char_noise(TEXTS, 0.0, torch.Generator()) == TEXTS
    alphabet = set("".join(TEXTS))
    assert set("".join(a)) <= alphabet  # random characters come from the texts' own characters


def test_char_noise_operation_rates():
    n = sum(non_space(t) for t in TEXTS)
    rate, g = 0.2, torch.Generator().manual_seed(2)
    sigma = math.sqrt(n * rate * (1 - rate))
    substituted = masking.char_noise(TEXTS, rate, g, alphabet="#", operations=("substitute",))
    assert [len(t) for t in substituted] == [len(t) for t in TEXTS]
    hits = sum(x != y for s, t in zip(substituted, TEXTS) for x, y in zip(s, t))
    assert abs(hits - n * rate) < 4 * sigma and all("#" not in t for t in TEXTS)
    deleted = masking.char_noise(TEXTS, rate, g, operations=("delete",))
    assert abs(sum(non_space(t) for t in deleted) - n * (1 - rate)) < 4 * sigma
    inserted = masking.char_noise(TEXTS, rate, g, alphabet="#", operations=("insert",))
    assert abs(sum(t.count("#") for t in inserted) - n * rate) < 4 * sigma
    assert [t.replace("#", "") for t in inserted] == TEXTS  # insertions only add characters
    mixed = masking.char_noise(TEXTS, rate, g)
    assert abs(sum(len(t) for t in mixed) - sum(len(t) for t in TEXTS)) < 6 * sigma  # inserts ≈ deletes
    with pytest.raises(objreg.InvalidParameterError, match="rate"):
        masking.char_noise(TEXTS, 1.5, g)
    with pytest.raises(objreg.InvalidParameterError, match="operations"):
        masking.char_noise(TEXTS, 0.1, g, operations=("swap",))


def test_noisy_corpus_keeps_the_document_structure():
    corpus = objreg.Corpus("c", (("One sentence here.", "Another one."), ("Third.",)), "tiny")
    noisy = masking.noisy_corpus(corpus, 0.5, torch.Generator().manual_seed(3))
    assert [len(d) for d in noisy.documents] == [2, 1] and noisy.documents != corpus.documents
    assert "character noise 0.5" in noisy.description
