"""The SST-2 fine-tune: its loss gradient against a float64 per-text loop, the fit learning a
separable task and not a shuffled one, the folds shared with the frozen probe, reproducibility
from the seed, and its errors."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from objreg import InvalidParameterError, masks
from objreg.experiments import _support
from objreg.experiments import sst2_finetune as ft
from objreg.testing import TINY_MODEL


@pytest.fixture
def model(registry, tokenizer):
    mlm = registry.get("mlm", vocab=tokenizer.vocab)
    return _support.mlm_model(registry, mlm, 0, dict(TINY_MODEL)).eval()


def test_loss_gradient_matches_a_float64_loop_over_single_texts(model, tokenizer, texts):
    classifier = ft.Classifier(copy.deepcopy(model), model.hidden_size, 2, torch.Generator().manual_seed(3))
    labels = torch.tensor([i % 2 for i in range(len(texts))])
    rows = tokenizer.batch_from_texts(texts, 40)  # padded to 40: the padding must not count
    assert rows.is_padding.any()
    ft.batch_loss(classifier, rows, labels).backward()
    # Independently: each text alone (no padding), in float64, its tokens' mean, the head, the mean loss.
    reference = copy.deepcopy(classifier).double()
    reference.zero_grad()
    total = 0.0
    for text, label in zip(texts, labels):
        one = tokenizer.batch_from_texts([text])
        mask = masks.AttentionMask.bidirectional(one.is_padding, one.document_ids).dense()
        hidden = reference.backbone.encode(one.input_ids, mask, masks.positions_within_documents(one.document_ids))
        logits = reference.head(hidden[0].mean(dim=0))
        total = total + F.cross_entropy(logits.unsqueeze(0), label.unsqueeze(0))
    (total / len(texts)).backward()
    checked = 0
    for (name, ours), theirs in zip(classifier.named_parameters(), reference.parameters()):
        if theirs.grad is None:  # the pre-training heads: not on the classifier's path
            assert ours.grad is None, name
            continue
        torch.testing.assert_close(ours.grad.double(), theirs.grad, rtol=1e-3, atol=1e-6, msg=name)
        checked += 1
    assert checked > 4 and classifier.head.weight.grad.abs().sum() > 0


def test_fine_tune_learns_a_separable_task_and_not_a_shuffled_one(model, tokenizer):
    # Sentiment carried by one word each: a bag-of-tokens task the backbone can learn end to end.
    g = torch.Generator().manual_seed(0)
    words = ["the code", "a parser", "this test", "my function", "our loop", "that module"]
    labels = torch.randint(2, (120,), generator=g)
    texts = [f"{words[int(i) % 6]} is {'good' if y else 'bad'} ." for i, y in zip(torch.randperm(120, generator=g), labels)]
    schedule = ft.FineTune(epochs=6, lr=3e-3, batch_size=8)
    [correct] = ft.finetune_correct(model, tokenizer, texts, labels, 4, 0, 16, "cpu", schedule)
    assert float(correct.double().mean()) > 0.9
    shuffled = labels[torch.randperm(120, generator=g)]
    [chance] = ft.finetune_correct(model, tokenizer, texts, shuffled, 4, 0, 16, "cpu", schedule)
    assert float(chance.double().mean()) < 0.7


def test_same_seed_same_result_and_the_model_untouched(model, tokenizer, texts):
    texts = texts * 4
    labels = torch.tensor([i % 2 for i in range(len(texts))])
    before = {k: v.clone() for k, v in model.state_dict().items()}
    schedule = ft.FineTune(epochs=2, lr=1e-3, batch_size=4)
    misspelled = [t.upper() for t in texts]
    first = ft.finetune_correct(model, tokenizer, texts, labels, 3, 5, 40, "cpu", schedule, also=[misspelled])
    again = ft.finetune_correct(model, tokenizer, texts, labels, 3, 5, 40, "cpu", schedule, also=[misspelled])
    assert len(first) == 2 and all(torch.equal(a, b) for a, b in zip(first, again))
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


def test_folds_are_the_frozen_probes(model, tokenizer, texts, monkeypatch):
    """Each fold trains on the complement of the held-out fold of sst2_probe.probe_correct's
    permutation for the same seed (``torch.randperm`` from ``seed``, chunked)."""
    texts = texts * 3
    labels = torch.tensor([i % 2 for i in range(len(texts))])
    seen = []
    monkeypatch.setattr(ft, "fit", lambda classifier, batch, labels, rows, *rest: seen.append(set(rows.tolist())))
    ft.finetune_correct(model, tokenizer, texts, labels, 3, 7, 40, "cpu")
    order = torch.randperm(len(texts), generator=torch.Generator().manual_seed(7))
    assert seen == [set(range(len(texts))) - set(fold.tolist()) for fold in order.chunk(3)]
    first = list(seen)
    seen.clear()
    ft.finetune_correct(model, tokenizer, texts, labels, 3, 8, 40, "cpu")  # another seed: other folds
    assert len(seen) == 3 and seen != first


@pytest.mark.parametrize("kwargs, match", [
    ({"folds": 1}, "folds must lie in"),
    ({"also": [["one text"]]}, "every text list in `also`"),
])
def test_bad_arguments_are_one_clear_error(model, tokenizer, texts, kwargs, match):
    args = {"folds": 3, "also": ()} | kwargs
    with pytest.raises(InvalidParameterError, match=match):
        ft.finetune_correct(model, tokenizer, texts, torch.tensor([i % 2 for i in range(len(texts))]),
                            args["folds"], 0, 40, "cpu", also=args["also"])


@pytest.mark.parametrize("field, value", [("epochs", 0), ("lr", 0.0), ("batch_size", 0)])
def test_bad_schedule_is_one_clear_error(field, value):
    with pytest.raises(InvalidParameterError, match=f"fine-tune {field}"):
        ft.FineTune(**{field: value})
