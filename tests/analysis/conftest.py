"""A tiny float64 model with real objectives, shared by the analysis tests."""

from __future__ import annotations

import pytest
import torch

import objreg
from objreg.analysis.functional import ObjectiveFunction, detached, shared_parameters
from objreg.core.registry import merge_heads

TINY = {"hidden_size": 16, "num_layers": 2, "num_heads": 2, "intermediate_size": 32}


@pytest.fixture(scope="session")
def registry():
    return objreg.Registry.load(load_entrypoints=False)


@pytest.fixture
def build(registry, tokenizer, texts):
    """``build(name, attention="math")`` → ``(function, shared params)`` for objective ``name``
    on a float64 tiny model with a real corrupted batch."""

    def make(name, attention="math", seed=0):
        return _build(registry, tokenizer, texts, name, attention, seed)

    return make


@pytest.fixture
def direction():
    return random_direction


def _build(registry, tokenizer, texts, name, attention, seed):
    objective = registry.get(name, vocab=tokenizer.vocab)
    batch = objective.corrupt(tokenizer.batch_from_texts(texts, 40), torch.Generator().manual_seed(seed))
    model = registry.load_model(
        "default", tokenizer.vocab, merge_heads([objective.info]), {**TINY, "attention": attention},
        torch.Generator().manual_seed(seed),
    ).double()
    return ObjectiveFunction(model, objective, batch), detached(shared_parameters(model))


def random_direction(shared, seed=1):
    generator = torch.Generator().manual_seed(seed)
    return {n: torch.randn(t.shape, generator=generator, dtype=t.dtype) for n, t in shared.items()}
