"""A tiny float64 model with real objectives, and a tiny trainer on an in-memory corpus, shared by
the analysis tests."""

from __future__ import annotations

import pytest
import torch

import objreg
from objreg.analysis.math.downstream import Downstream
from objreg.analysis.math.functional import ObjectiveFunction, detached, shared_parameters
from objreg.analysis.run.loop import Trainer
from objreg.core.registry import merge_heads

TINY = {"hidden_size": 16, "num_layers": 2, "num_heads": 2, "intermediate_size": 32}
SEQ_LEN = 40


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
        "default", tokenizer.vocab, merge_heads({name: objective.info.heads}), {**TINY, "attention": attention},
        torch.Generator().manual_seed(seed),
    ).double()
    return ObjectiveFunction(model, objective, batch), detached(shared_parameters(model))


def random_direction(shared, seed=1):
    generator = torch.Generator().manual_seed(seed)
    return {n: torch.randn(t.shape, generator=generator, dtype=t.dtype) for n, t in shared.items()}


@pytest.fixture
def tiny_trainer(registry, tokenizer, texts):
    """``tiny_trainer(optimizer="sgd", probe_every=1, ...)`` → a float64 :class:`Trainer` of
    ``mlm`` and ``sop`` against ``qa`` on the tiny model and an in-memory corpus of ``texts``;
    ``model``: model config overrides; other keyword arguments: parameters per objective."""

    def make(optimizer="sgd", lr=0.05, steps=3, probe_every=1, seed=0, objectives=("mlm", "sop"), model=None,
             **params):
        corpus = objreg.Corpus("tiny", tuple(tuple(objreg.split_sentences(t)) for t in texts * 4))
        tokenized = objreg.TokenizedCorpus(tokenizer, corpus, SEQ_LEN)
        loaded = {n: registry.get(n, vocab=tokenized.vocab, **params.get(n, {})) for n in objectives}
        task = registry.get_task("qa")
        data, task_heads = task.task_data(None, corpus.documents, tokenizer, SEQ_LEN, 8)
        heads = merge_heads({**{n: o.info.heads for n, o in loaded.items()}, "qa": task_heads})
        built = registry.load_model("default", tokenizer.vocab, heads, {**TINY, **(model or {})},
                                    torch.Generator().manual_seed(seed))
        return Trainer(built.double(), loaded, dict.fromkeys(objectives, 1.0), tokenized, Downstream(task, data),
                       optimizer=optimizer, lr=lr, batch_size=4, seed=seed, device=torch.device("cpu"), steps=steps,
                       probe_every=probe_every)

    return make
