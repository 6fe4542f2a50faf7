"""token_surprisal: -log p(token | context with the token masked), in a few batched passes."""

from __future__ import annotations

import pytest
import torch

import objreg
from objreg import IGNORE_INDEX
from objreg.core.registry import merge_heads
from objreg.testing import TINY_MODEL
from objreg.toolkit.surprisal import token_surprisal


@pytest.fixture(scope="module")
def setup(tokenizer, texts):
    registry = objreg.Registry.load(load_entrypoints=False)
    heads = merge_heads({"mlm": registry.info("mlm").heads})
    model = registry.load_model("default", tokenizer.vocab, heads, dict(TINY_MODEL), torch.Generator().manual_seed(0))
    batch = tokenizer.batch_from_texts(texts[:3], seq_len=20)
    return registry, model.double().eval(), batch


def loop_surprisal(model, batch, vocab, hidden_together) -> torch.Tensor:
    """One position at a time: mask the positions ``hidden_together(t)`` names, read -log p at t."""
    B, T = batch.input_ids.shape
    out = torch.zeros(B, T, dtype=torch.float64)
    mask = objreg.masks.bidirectional(batch.is_padding) & objreg.masks.same_document(batch.document_ids)
    positions = objreg.masks.positions_within_documents(batch.document_ids)
    for b in range(B):
        for t in range(T):
            if batch.is_special[b, t]:
                continue
            ids = batch.input_ids[b : b + 1].clone()
            for u in hidden_together(t):
                if not batch.is_special[b, u]:
                    ids[0, u] = vocab.mask_id
            with torch.no_grad():
                hidden = model.encode(ids, mask[b : b + 1], positions[b : b + 1])
                log_p = torch.log_softmax(model.heads["lm"](hidden[0, t]), dim=-1)
            out[b, t] = -log_p[batch.input_ids[b, t]]
    return out


def test_one_token_at_a_time_when_groups_cover_the_row(setup, tokenizer):
    _, model, batch = setup
    T = batch.input_ids.shape[1]
    got = token_surprisal(model, batch, tokenizer.vocab, groups=T)
    torch.testing.assert_close(got.double(), loop_surprisal(model, batch, tokenizer.vocab, lambda t: [t]),
                               rtol=1e-5, atol=1e-5)
    assert (got[batch.is_special] == 0).all() and (got[~batch.is_special] > 0).all()


def test_interleaved_groups(setup, tokenizer):
    _, model, batch = setup
    T = batch.input_ids.shape[1]
    got = token_surprisal(model, batch, tokenizer.vocab, groups=3)
    expected = loop_surprisal(model, batch, tokenizer.vocab, lambda t: range(t % 3, T, 3))
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(got, token_surprisal(model, batch, tokenizer.vocab, groups=T))


def test_feeds_the_entropy_policy(setup, tokenizer):
    registry, model, batch = setup
    objective = registry.get("mlm", vocab=tokenizer.vocab, masking_policy="entropy")
    with pytest.raises(objreg.DataError, match="token_surprisal"):
        objective.corrupt(batch, torch.Generator().manual_seed(0))
    scored = batch._replace(surprisal=token_surprisal(model, batch, tokenizer.vocab))
    # The objective's own prepare hook fills the same surprisal, and leaves the model's mode alone.
    model.train()
    prepared = objective.prepare(batch, model)
    assert model.training and torch.equal(prepared.surprisal, scored.surprisal)
    model.eval()
    assert registry.get("mlm", vocab=tokenizer.vocab).prepare(batch, model) is batch  # uniform needs nothing
    cb = objective.corrupt(scored, torch.Generator().manual_seed(0))
    selected = cb.labels != IGNORE_INDEX
    assert selected.any() and not (selected & batch.is_special).any()


def test_bad_arguments(setup, tokenizer):
    _, model, batch = setup
    with pytest.raises(objreg.InvalidParameterError, match="groups"):
        token_surprisal(model, batch, tokenizer.vocab, groups=0)
    with pytest.raises(objreg.InvalidParameterError, match="LM head"):
        token_surprisal(model, batch, tokenizer.vocab, head="nope")


def test_scores_in_eval_mode_and_restores_the_mode(setup, tokenizer):
    _, model, batch = setup
    reference = token_surprisal(model, batch, tokenizer.vocab)
    model.train()
    try:
        with torch.random.fork_rng():
            torch.manual_seed(1)
            first = token_surprisal(model, batch, tokenizer.vocab)
            torch.manual_seed(2)
            second = token_surprisal(model, batch, tokenizer.vocab)
        assert model.training  # left as it was
    finally:
        model.eval()
    assert torch.equal(first, second) and torch.equal(first, reference)
