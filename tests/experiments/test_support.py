"""experiments._support: the pieces the experiments share."""

from __future__ import annotations

import torch

from objreg.core.types import Corpus
from objreg.experiments import _support
from objreg.toolkit.tokenizer import TokenizedCorpus, split_sentences


def test_fitting_the_lm_head_changes_the_head_alone(registry, tokenizer, texts):
    corpus = TokenizedCorpus(tokenizer, Corpus("t", tuple(tuple(split_sentences(t)) for t in texts)), 32)
    mlm = registry.get("mlm", vocab=corpus.vocab)
    model = _support.mlm_model(registry, mlm, 0, {"hidden_size": 16, "num_layers": 1, "num_heads": 2,
                                                  "intermediate_size": 32})
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    losses = _support.fit_lm_head(model, mlm, corpus, steps=3, batch_size=4, lr=1e-2, seed=0,
                                  device=torch.device("cpu"))
    assert len(losses) == 3
    changed = {name for name, p in model.named_parameters() if not torch.equal(p, before[name])}
    assert changed and all(name.startswith("heads.") for name in changed)
    assert all(p.requires_grad for p in model.parameters())  # the backbone is trainable again
