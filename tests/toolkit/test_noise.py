"""Character noise."""

from __future__ import annotations

import math

import pytest
import torch

import objreg
from objreg.toolkit import noise

TEXTS = ["The quick brown fox jumps over the lazy dog. " * 40, "Colourless green ideas sleep furiously. " * 40]


def non_space(text: str) -> int:
    return sum(not c.isspace() for c in text)


def test_char_noise_is_seeded_and_keeps_whitespace():
    a = noise.char_noise(TEXTS, 0.1, torch.Generator().manual_seed(0))
    b = noise.char_noise(TEXTS, 0.1, torch.Generator().manual_seed(0))
    c = noise.char_noise(TEXTS, 0.1, torch.Generator().manual_seed(1))
    assert a == b and a != c and a != TEXTS
    assert [t.count(" ") for t in a] == [t.count(" ") for t in TEXTS]  # whitespace is never touched
    assert noise.char_noise(TEXTS, 0.0, torch.Generator()) == TEXTS
    alphabet = set("".join(TEXTS))
    assert set("".join(a)) <= alphabet  # random characters come from the texts' own characters


def test_char_noise_operation_rates():
    n = sum(non_space(t) for t in TEXTS)
    rate, g = 0.2, torch.Generator().manual_seed(2)
    sigma = math.sqrt(n * rate * (1 - rate))
    substituted = noise.char_noise(TEXTS, rate, g, alphabet="#", operations=("substitute",))
    assert [len(t) for t in substituted] == [len(t) for t in TEXTS]
    hits = sum(x != y for s, t in zip(substituted, TEXTS) for x, y in zip(s, t))
    assert abs(hits - n * rate) < 4 * sigma and all("#" not in t for t in TEXTS)
    deleted = noise.char_noise(TEXTS, rate, g, operations=("delete",))
    assert abs(sum(non_space(t) for t in deleted) - n * (1 - rate)) < 4 * sigma
    inserted = noise.char_noise(TEXTS, rate, g, alphabet="#", operations=("insert",))
    assert abs(sum(t.count("#") for t in inserted) - n * rate) < 4 * sigma
    assert [t.replace("#", "") for t in inserted] == TEXTS  # insertions only add characters
    mixed = noise.char_noise(TEXTS, rate, g)
    assert abs(sum(len(t) for t in mixed) - sum(len(t) for t in TEXTS)) < 6 * sigma  # inserts ≈ deletes
    with pytest.raises(objreg.InvalidParameterError, match="rate"):
        noise.char_noise(TEXTS, 1.5, g)
    with pytest.raises(objreg.InvalidParameterError, match="operations"):
        noise.char_noise(TEXTS, 0.1, g, operations=("swap",))


def test_noisy_corpus_keeps_the_document_structure():
    corpus = objreg.Corpus("c", (("One sentence here.", "Another one."), ("Third.",)), "tiny")
    noisy = noise.noisy_corpus(corpus, 0.5, torch.Generator().manual_seed(3))
    assert [len(d) for d in noisy.documents] == [2, 1] and noisy.documents != corpus.documents
    assert "character noise 0.5" in noisy.description
