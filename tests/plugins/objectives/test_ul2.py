"""UL2: per-row denoiser choice matches the weights, mode token matches the denoiser, R/X rows are
exact T5 span corruption with their own (mean span, density), S rows are a prefix LM."""

from __future__ import annotations

import math

import pytest
import torch

import objreg
from objreg.toolkit import spans

SENTINELS = tuple(range(5, 69))
NAMED = {"[EOS]": 69, "[NLU]": 70, "[NLG]": 71, "[S2S]": 72}
VOCAB = objreg.Vocabulary(size=200, pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4, special_ids=tuple(range(80)),
                          sentinel_ids=SENTINELS, named_ids=NAMED)
DEFAULT = [("R", 3, 0.15), ("R", 8, 0.15), ("X", 3, 0.5), ("X", 8, 0.5), ("X", 64, 0.15), ("X", 64, 0.5),
           ("S", 1, 0.25)]
MODE = {"R": 70, "X": 71, "S": 72}


def corrupt(registry, batch, seed=0, vocab=VOCAB, **params):
    return registry.get("ul2", vocab=vocab, **params).corrupt(batch, torch.Generator().manual_seed(seed))


def split_row(cb, b):
    p = int(cb.extras["prefix_length"][b])
    real = cb.input_ids[b][~cb.is_padding[b]].tolist()
    return real[:p], real[p:]


def reconstruct(source: list[int], target: list[int]) -> list[int]:
    """The ``k``-th span of the target in place of the ``k``-th sentinel of the source (by order, so
    reused sentinels pair up too)."""
    assert target[-1] == NAMED["[EOS]"]
    sentinels, pieces = set(SENTINELS), []
    for token in target[:-1]:
        if token in sentinels:
            pieces.append([token])
        else:
            pieces[-1].append(token)
    spans_in_source = [t for t in source if t in sentinels]
    assert spans_in_source == [p[0] for p in pieces], "source and target sentinels differ"
    filled = iter(pieces)
    return [t for token in source for t in (next(filled)[1:] if token in sentinels else [token])]


def test_defaults_follow_the_survey(registry):
    defaults = registry.info("ul2").defaults()
    assert defaults["weights"].replace(" ", "") == "0.13,0.13,0.13,0.13,0.13,0.13,0.22"
    assert defaults["denoisers"].replace(" ", "") == ",".join(
        f"{k}:{r}" if k == "S" else f"{k}:{m}:{r}" for k, m, r in DEFAULT
    )
    assert defaults["mode_tokens"] is True


def test_the_empirical_mix_matches_the_weights(registry, synthetic_batch):
    N = 6000
    batch = synthetic_batch(VOCAB, [20] * N, seed=1)
    for weights in ("0.13,0.13,0.13,0.13,0.13,0.13,0.22", "1,0,2,0,0,0,1"):
        cb = corrupt(registry, batch, weights=weights)
        counts = torch.bincount(cb.extras["denoiser"], minlength=7).tolist()
        w = [float(x) for x in weights.split(",")]
        for count, share in zip(counts, (x / sum(w) for x in w)):
            assert abs(count - N * share) <= 4 * math.sqrt(N * share * (1 - share)) + 1e-9, counts


def test_mode_token_and_corruption_match_each_rows_denoiser(registry, synthetic_batch):
    lengths = [126, 60, 90, 126, 33] * 40
    batch = synthetic_batch(VOCAB, lengths, seed=2)
    cb = corrupt(registry, batch, seed=3)
    seen = set()
    for b, n in enumerate(lengths):
        kind, mean, density = DEFAULT[int(cb.extras["denoiser"][b])]
        seen.add(kind)
        source, target = split_row(cb, b)
        original = batch.input_ids[b][~batch.is_padding[b]].tolist()
        assert source[0] == MODE[kind]
        if kind == "S":
            assert not set(source + target) & set(SENTINELS)
            assert source[1:] + target == original
            k = len(source) - 2  # text tokens in the prefix
            assert round((1 - 2 * density) * (n - 1)) <= k <= n - 1
        else:
            noise, num_spans = (int(x) for x in spans.noise_counts(torch.tensor([n]), density, mean))
            assert [t for t in source if t in SENTINELS] == list(SENTINELS[:num_spans])
            assert len(target) == noise + num_spans + 1
            assert reconstruct(source[1:], target) == original
    assert seen == {"R", "X", "S"}


@pytest.mark.parametrize("T", [2048, 8192])
@pytest.mark.parametrize("denoiser", ["R:3:0.15", "X:3:0.5"])
def test_pretraining_lengths_cycle_the_sentinels_and_reconstruct(registry, T, denoiser, synthetic_batch):
    """Span denoisers at T=2,048 and 8,192 need 102 to 1,365 sentinels of 64: span k gets sentinel
    k mod 64, and each row comes back from its source and target."""
    _, mean, density = denoiser.split(":")
    lengths = [T - 2, T // 2]
    batch = synthetic_batch(VOCAB, lengths, seed=6)
    cb = corrupt(registry, batch, denoisers=denoiser, weights="1")
    noise, num_spans = spans.noise_counts(torch.tensor(lengths), float(density), float(mean))
    for b in range(2):
        source, target = split_row(cb, b)
        k = int(num_spans[b])
        assert source[0] == MODE["R" if denoiser.startswith("R") else "X"]
        assert [t for t in source if t in SENTINELS] == [SENTINELS[i % len(SENTINELS)] for i in range(k)]
        assert len(target) == int(noise[b]) + k + 1
        assert reconstruct(source[1:], target) == batch.input_ids[b][~batch.is_padding[b]].tolist()
    assert int(num_spans[0]) > len(SENTINELS)


def test_without_mode_tokens(registry, synthetic_batch):
    batch = synthetic_batch(VOCAB, [30] * 50, seed=4)
    cb = corrupt(registry, batch, mode_tokens=False)
    assert not bool(torch.isin(cb.input_ids, torch.tensor([70, 71, 72])).any())
    assert bool((cb.input_ids[:, 0] == VOCAB.cls_id).all())


def test_the_mode_token_is_in_the_bidirectional_prefix(registry, synthetic_batch):
    objective = registry.get("ul2", vocab=VOCAB)
    cb = objective.corrupt(synthetic_batch(VOCAB, [25, 40], seed=5), torch.Generator().manual_seed(0))
    mask = objective.attention_mask(cb)
    for b in range(2):
        p, n = int(cb.extras["prefix_length"][b]), int((~cb.is_padding[b]).sum())
        assert bool(mask[b, :n, :p].all())  # everyone sees the whole source, mode token included
        assert not bool(mask[b, :p, p:].any())  # the source never sees the target
        assert torch.equal(mask[b, p:n, p:n], torch.ones(n - p, n - p, dtype=torch.bool).tril())


@pytest.mark.parametrize("params, message", [
    ({"denoisers": "R:3:0.15, Q:1"}, r"denoiser 'Q:1' is not of the form"),
    ({"denoisers": "R:0.5:0.15", "weights": "1"}, r"mean span length >= 1 and a density in \[0, 1\]"),
    ({"denoisers": "R:3:0.15, S:0.25", "weights": "1"}, "1 weights for 2 denoisers"),
    ({"weights": "1,1,1,1,1,1,-1"}, "must be non-negative and not all zero"),
    ({"weights": "a,b"}, "must be comma-separated numbers"),
])
def test_bad_mixtures_are_parameter_errors(registry, params, message):
    with pytest.raises(objreg.InvalidParameterError, match=message):
        registry.get("ul2", vocab=VOCAB, **params)


def test_missing_mode_token_is_a_data_error(registry, synthetic_batch):
    plain = objreg.Vocabulary(size=200, pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4,
                              special_ids=tuple(range(80)), sentinel_ids=SENTINELS)
    with pytest.raises(objreg.DataError, match=r"^ul2 needs \[NLU\], \[NLG\], \[S2S\], which the tokenizer lacks"):
        corrupt(registry, synthetic_batch(VOCAB, [30] * 8), vocab=plain)
    corrupt(registry, synthetic_batch(VOCAB, [30] * 8), vocab=plain, mode_tokens=False)  # fine without them
