"""A cross-validated fine-tune on SST-2: how well a pre-trained backbone classifies sentiment when
it is trained on the task, the protocol of the papers the SST-2 experiments test (ELECTRA reports
GLUE after fine-tuning; Pruthi et al. attack a fine-tuned BERT classifier).

Per fold, a copy of the backbone plus a linear head on its mean-pooled output is trained end to
end on the other folds' sentences and predicts the held-out fold. The folds are the frozen probe's
(:func:`objreg.analysis.run.finetune.cross_validation_folds` of the same seed), so the probe and
the fine-tune are read on the same splits.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from objreg import InvalidParameterError, Tokenizer
from objreg.analysis.run.finetune import Schedule, cross_validation_folds, train_rows
from objreg.experiments.sst2_probe import mean_pooled
from objreg.toolkit.randomness import stream

#: The fine-tune's schedule (:class:`objreg.analysis.run.finetune.Schedule`), under the name these
#: experiments registered it with.
FineTune = Schedule


class Classifier(nn.Module):
    """A backbone and a linear head on the mean of its output over each row's real tokens."""

    def __init__(self, backbone: nn.Module, hidden_size: int, classes: int, generator: torch.Generator):
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(hidden_size, classes)
        with torch.no_grad():  # BERT's init, from the caller's generator
            self.head.weight.normal_(0.0, 0.02, generator=generator)
            self.head.bias.zero_()

    def forward(self, input_ids: torch.Tensor, is_padding: torch.Tensor, document_ids: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, C]``."""
        return self.head(mean_pooled(self.backbone, input_ids, is_padding, document_ids))


def finetune_correct(model: nn.Module, tokenizer: Tokenizer, texts: Sequence[str], labels: torch.Tensor,
                     folds: int, seed: int, seq_len: int, device, schedule: FineTune = FineTune(),
                     also: Sequence[Sequence[str]] = (), chunk: int = 128) -> list[torch.Tensor]:
    """Cross-validated correctness ``[N]`` bool of fine-tuning ``model``'s backbone with a linear
    head on ``texts``: for each of ``folds`` folds (the frozen probe's,
    :func:`~objreg.analysis.run.finetune.cross_validation_folds` of ``seed``), a copy of the backbone and
    a fresh head trained on the other folds (``schedule``; the head's init and the batch order
    from the ``finetune`` stream of ``seed``), then the held-out fold predicted. Returned for
    ``texts`` and then for every text list in ``also`` (other versions of the same rows, e.g.
    misspelled, predicted by the classifier trained on ``texts``). ``model`` is left unchanged.

    Raises:
        InvalidParameterError: fewer than 2 folds or more folds than texts, or a list in ``also``
            whose length differs from ``texts``.
    """
    n = len(texts)
    if not 2 <= folds <= n:
        raise InvalidParameterError(f"folds must lie in [2, {n}] (the number of texts), got {folds}")
    if any(len(other) != n for other in also):
        raise InvalidParameterError(f"every text list in `also` must have {n} texts, one per row of `texts`")
    views = [tokenizer.batch_from_texts(list(view), seq_len) for view in (texts, *also)]
    generator = stream(seed, "finetune")
    classes = int(labels.max()) + 1
    correct = [torch.zeros(n, dtype=torch.bool) for _ in views]
    for fold, train in cross_validation_folds(n, folds, seed):
        classifier = Classifier(copy.deepcopy(model).float(), model.hidden_size, classes, generator).to(device)
        fit(classifier, views[0], labels, train.nonzero().squeeze(1), schedule, generator, device)
        classifier.eval()
        with torch.no_grad():
            for view, out in zip(views, correct):
                for part in fold.split(chunk):
                    rows = view.select(part).to(device)
                    logits = classifier(rows.input_ids, rows.is_padding, rows.document_ids)
                    out[part] = logits.argmax(dim=1).cpu() == labels[part]
    return correct


def fit(classifier: Classifier, batch, labels: torch.Tensor, rows: torch.Tensor, schedule: FineTune,
        generator: torch.Generator, device) -> list[float]:
    """Train ``classifier`` on ``rows`` of the tokenised ``batch`` (mean cross-entropy, AdamW,
    :func:`objreg.analysis.run.finetune.train_rows`); returns each step's loss."""
    classifier.train()
    return train_rows(list(classifier.parameters()),
                      lambda part: batch_loss(classifier, batch.select(part).to(device), labels[part].to(device)),
                      rows, schedule, generator)


def batch_loss(classifier: Classifier, rows, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of ``classifier`` on the tokenised ``rows`` (a ``TokenBatch``) against ``labels``."""
    return F.cross_entropy(classifier(rows.input_ids, rows.is_padding, rows.document_ids), labels)
