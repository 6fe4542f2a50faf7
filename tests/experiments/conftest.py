"""Stand-ins shared by the experiments' tests: a tiny corpus in the default text's shape, the same
for a Hugging Face encoder, and an ``analyze`` that records its settings and stops."""

from __future__ import annotations

import pytest

import objreg
from objreg.experiments import _support


@pytest.fixture(scope="session")
def tiny_text(registry, tokenizer, texts):
    """The six test texts three times over, rows of 32 tokens; every third document held out."""
    corpus = objreg.Corpus("tiny", tuple(tuple(objreg.split_sentences(t)) for t in texts * 3))
    train, heldout = corpus.split(heldout_every=3)
    return _support.DefaultText(registry, objreg.TokenizedCorpus(tokenizer, train, 32),
                                objreg.TokenizedCorpus(tokenizer, heldout, 32))


@pytest.fixture(scope="session")
def hf_text(tiny_bert, texts, tmp_path_factory):
    """The test texts six times over as a corpus file, read with the tiny BERT's (MiniLM's)
    tokenizer in rows of 32 tokens: the text of a MiniLM setting, in small."""
    folder = tmp_path_factory.mktemp("hf-text")
    corpus_file = folder / "corpus.txt"
    corpus_file.write_text("\n\n".join(texts * 6), encoding="utf-8")
    registry = objreg.Registry.load(load_entrypoints=False)
    return _support.default_text(32, registry, folder / "cache", model=str(tiny_bert), corpus=str(corpus_file))


@pytest.fixture
def stopping_analyze(monkeypatch):
    """``stopping_analyze(module)`` replaces ``module.analyze`` with one that records each call's
    keyword settings and raises ``RuntimeError("analyze called")``; returns the list of recorded
    settings."""

    def install(module):
        calls = []

        def analyze(*args, **settings):
            calls.append(settings)
            raise RuntimeError("analyze called")

        monkeypatch.setattr(module, "analyze", analyze)
        return calls

    return install
