"""objreg_task_metrics of the built-in tasks against plain loops: classification's accuracy, and
qa's exact match and F1 of the best allowed span found by trying every (start, end) pair."""

from __future__ import annotations

import types

import pytest
import torch

import objreg
from objreg.plugins.tasks import classification, qa


def outputs(head_name: str, head, hidden: torch.Tensor) -> objreg.ModelOutputs:
    return objreg.ModelOutputs(hidden, types.SimpleNamespace(heads={head_name: head}, architecture="encoder"))


def test_classification_accuracy_is_the_argmax_against_the_label():
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(12, 5, 4, generator=g, dtype=torch.float64)
    head = torch.nn.Linear(4, 3).double()
    labels = torch.randint(3, (12,), generator=g)
    batch = objreg.CorruptedBatch(input_ids=torch.ones(12, 5, dtype=torch.long), labels=torch.zeros(12, 5, dtype=torch.long),
                                  is_padding=torch.zeros(12, 5, dtype=torch.bool), position_ids=torch.arange(5).repeat(12, 1),
                                  document_ids=torch.zeros(12, 5, dtype=torch.long), extras={"label": labels})
    scores = classification.objreg_task_metrics(outputs("classification", lambda h: head(h[:, 0]), hidden), batch)
    expected = [float(int(torch.argmax(head(hidden[b, 0]))) == int(labels[b])) for b in range(12)]
    assert scores["accuracy"].tolist() == expected


def loop_metrics(logits: torch.Tensor, context: torch.Tensor, gold: tuple[int, int]) -> tuple[float, float]:
    """Exact match and F1 of the best span of one row, by trying every pair."""
    T = logits.shape[0]
    allowed = [t == 0 or bool(context[t]) for t in range(T)]
    best, span = -float("inf"), (0, 0)
    for s in range(T):
        for e in range(T):
            ok = (s == e == 0) or (allowed[s] and allowed[e] and 0 <= e - s < qa.MAX_ANSWER_TOKENS and s > 0)
            if ok and logits[s, 0] + logits[e, 1] > best:
                best, span = float(logits[s, 0] + logits[e, 1]), (s, e)
    exact = float(span == gold)
    if span[0] == 0 or gold[0] == 0:
        return exact, exact
    overlap = max(0, min(span[1], gold[1]) - max(span[0], gold[0]) + 1)
    f1 = 0.0 if overlap == 0 else 2 * overlap / ((span[1] - span[0] + 1) + (gold[1] - gold[0] + 1))
    return exact, f1


@pytest.mark.parametrize("seed", range(6))
def test_qa_metrics_match_a_loop_over_every_span(seed):
    g = torch.Generator().manual_seed(seed)
    B, T = 8, 40
    hidden = torch.randn(B, T, 6, generator=g)
    head = torch.nn.Linear(6, 2)
    context = torch.zeros(B, T, dtype=torch.bool)
    context[:, 5:38] = True
    starts = torch.randint(5, 36, (B,), generator=g)
    ends = starts + torch.randint(0, 3, (B,), generator=g)
    starts[0] = ends[0] = 0  # a question without an answer
    with torch.no_grad():
        logits = head(hidden)
    # Make some rows' best span the gold one, so exact matches occur.
    for b in range(0, B, 3):
        logits[b, starts[b], 0] += 50
        logits[b, ends[b], 1] += 50
    batch = objreg.CorruptedBatch(input_ids=torch.ones(B, T, dtype=torch.long), labels=torch.zeros(B, T, dtype=torch.long),
                                  is_padding=torch.zeros(B, T, dtype=torch.bool), position_ids=torch.arange(T).repeat(B, 1),
                                  document_ids=torch.zeros(B, T, dtype=torch.long),
                                  extras={"start_positions": starts, "end_positions": ends, "context_mask": context})
    scores = qa.objreg_task_metrics(outputs("qa", lambda h: logits, hidden), batch)
    for b in range(B):
        exact, f1 = loop_metrics(logits[b], context[b], (int(starts[b]), int(ends[b])))
        assert float(scores["exact_match"][b]) == exact
        assert float(scores["f1"][b]) == pytest.approx(f1)
    assert float(scores["exact_match"][3]) == 1.0


def test_the_task_handle_checks_what_the_hook_returns(registry):
    assert registry.get_task("classification").has_metrics and registry.get_task("qa").has_metrics
    with pytest.raises(objreg.InvalidParameterError, match="reports no metric"):
        registry.get_task("ordering").require_metrics()
