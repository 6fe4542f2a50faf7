"""The downstream set in length-sorted, trimmed chunks gives the same D as the padded set."""

from __future__ import annotations

import copy

import pytest
import torch

from objreg.analysis.math.downstream import Downstream, trimmed
from objreg.analysis.math.functional import ObjectiveFunction, detached, shared_parameters
from objreg.core.registry import merge_heads
from objreg.core.types import CorruptedBatch
from objreg.toolkit.tokenizer import split_sentences

TINY = {"hidden_size": 16, "num_layers": 2, "num_heads": 2, "intermediate_size": 32}


@pytest.fixture
def qa(registry, tokenizer, texts):
    task = registry.get_task("qa")
    documents = [split_sentences(t) for t in texts]
    batch, heads = task.task_data(None, documents, tokenizer, 64, 12)
    model = registry.load_model("default", tokenizer.vocab, merge_heads({"qa": heads}), TINY,
                                torch.Generator().manual_seed(0)).double()
    return task, batch, model


def test_trimming_cuts_trailing_padding_and_sequence_extras_only():
    padding = torch.tensor([[False, False, True, True], [False, True, True, True]])
    batch = CorruptedBatch(
        torch.arange(8).reshape(2, 4), torch.zeros(2, 4, dtype=torch.long), padding,
        torch.arange(4).repeat(2, 1), torch.zeros(2, 4, dtype=torch.long),
        {"per_token": torch.ones(2, 4, 3), "per_row": torch.tensor([1, 2]), "indices": torch.zeros(2, 5)},
    )
    cut = trimmed(batch)
    assert cut.input_ids.tolist() == [[0, 1], [4, 5]] and cut.is_padding.shape == (2, 2)
    assert cut.extras["per_token"].shape == (2, 2, 3)
    assert cut.extras["per_row"].tolist() == [1, 2] and cut.extras["indices"].shape == (2, 5)
    assert trimmed(cut) is cut  # nothing left to trim


def test_compact_chunks_give_the_padded_sets_loss_gradient_and_order(qa):
    task, batch, model = qa
    downstream = Downstream(task, batch, chunk_size=4)
    assert downstream.check(model) and downstream.compact
    assert downstream.tokens < batch.input_ids.numel()
    assert [c.batch_size for c in downstream.chunks] == [4, 4, 4]
    shared = detached(shared_parameters(model))
    padded = ObjectiveFunction(model, task, batch)
    assert downstream.loss(model) == pytest.approx(float(padded(shared).mean()), rel=1e-12)
    # Gradient of D through the chunks equals that of the padded set.
    params = {n: t.clone().requires_grad_(True) for n, t in shared.items()}
    expected = torch.autograd.grad(padded(params).mean(), list(params.values()), allow_unused=True)
    params = {n: t.clone().requires_grad_(True) for n, t in shared.items()}
    total = sum(f(params).sum() for f in downstream.functions(model)) / batch.batch_size
    got = torch.autograd.grad(total, list(params.values()), allow_unused=True)
    for e, g in zip(expected, got):
        if e is not None:
            assert torch.allclose(g, e, rtol=1e-9, atol=1e-13)


def test_a_task_that_trimming_breaks_falls_back_to_the_padded_set(qa):
    task, batch, model = qa
    # An extra of width T that is not along the sequence: trimming it breaks the loss's gather.
    width = batch.input_ids.shape[1]
    end = batch.extras["end_positions"]
    broken = batch._replace(extras={**batch.extras, "end_positions": torch.full_like(end, width - 1),
                                    "decoy": torch.zeros(batch.batch_size, width)})
    downstream = Downstream(task, broken, chunk_size=4)
    assert not downstream.check(model)
    assert downstream.tokens == broken.input_ids.numel()
    shared = detached(shared_parameters(model))
    expected = float(ObjectiveFunction(model, task, broken)(shared).mean())
    assert downstream.loss(model) == pytest.approx(expected, rel=1e-12)


def test_a_float32_model_is_evaluated_in_float64_at_its_current_parameters(qa):
    task, batch, model = qa
    model = model.float()
    downstream = Downstream(task, batch)

    def in_float64():  # an independent float64 copy of the model as it is now, every op in float64
        reference = copy.deepcopy(model).double()
        return float(ObjectiveFunction(reference, task, batch)(detached(shared_parameters(reference))).mean())

    expected = in_float64()
    assert downstream.loss(model) == pytest.approx(expected, rel=1e-13)
    assert downstream.unit_roundoff(model) == 2.0**-53
    # The copy follows the model: a changed weight changes D by exactly the float64 change.
    with torch.no_grad():
        next(iter(shared_parameters(model).values())).mul_(1.001)
    moved = downstream.loss(model)
    assert moved == pytest.approx(in_float64(), rel=1e-13) and moved != expected
    # In the model's own dtype the value is float32's, off by its rounding.
    own = Downstream(task, batch, evaluation_dtype=None)
    assert own.unit_roundoff(model) == 2.0**-24
    assert own.loss(model) == pytest.approx(moved, rel=1e-5) and own.loss(model) != moved


def test_a_set_with_nothing_to_trim_is_not_checked(qa):
    """Every row as long as the padded set (SQuAD's full windows): the chunks are the padded rows
    themselves, so the check evaluates nothing (a model is not even looked at)."""
    task, batch, _ = qa
    full = batch._replace(is_padding=torch.zeros_like(batch.is_padding))
    downstream = Downstream(task, full, chunk_size=4)
    assert downstream.tokens == full.input_ids.numel()
    assert downstream.check(None) and downstream.compact


def test_only_the_trimmed_chunks_are_checked(qa, monkeypatch):
    """Chunks as wide as the padded set hold its own rows and columns: the check evaluates the
    trimmed chunks' rows alone (padded and trimmed), and still uses the compact chunks."""
    task, batch, model = qa
    full = batch.is_padding.clone()
    full[: batch.batch_size // 2] = False  # the first half of the rows fill the width
    downstream = Downstream(task, batch._replace(is_padding=full), chunk_size=4)
    widths = [c.input_ids.shape[1] for c in downstream.chunks]
    short = sum(c.batch_size for c in downstream.chunks if c.input_ids.shape[1] < batch.input_ids.shape[1])
    assert 0 < short < batch.batch_size and max(widths) == batch.input_ids.shape[1]
    import objreg.analysis.math.downstream as module

    evaluated = []
    original = module.ObjectiveFunction

    def counting(model, task, chunk, **options):
        evaluated.append(chunk.batch_size)
        return original(model, task, chunk, **options)

    monkeypatch.setattr(module, "ObjectiveFunction", counting)
    assert downstream.check(model) and downstream.compact
    assert sum(evaluated) == 2 * short  # those rows padded, then in their trimmed chunks
