"""A linear probe on SST-2: how much sentiment a backbone's frozen mean-pooled output carries.
entropy-masking reports it; rtd-efficiency and char-noise-robustness report it beside their
reading, a fine-tune on the same folds (:mod:`objreg.experiments.sst2_finetune`), since at these
model sizes the frozen probe sits near chance."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from objreg import DataError, Tokenizer, masks
from objreg.analysis.run.finetune import cross_validation_folds
from objreg.experiments._support import shared_data

SST2 = "glue/SST-2/dev.tsv"
#: A probe reads a model's sentiment only where it beats chance by a margin: chance is 0.5 on these
#: balanced labels (the majority class is 444 of 872, 0.509), and a margin of 0.1 keeps the noise of
#: one 872-sentence cross-validation (a standard error of about 0.017) far from deciding it. The
#: precondition of the experiments that read SST-2 (now through the fine-tune).
PROBE_ABOVE_CHANCE = 0.6


def sst2(path: Path | None = None) -> tuple[list[str], torch.Tensor]:
    """SST-2's sentences and 0/1 labels from ``shared/data`` (or ``path``).

    Raises:
        DataError: the file is absent.
    """
    from objreg.toolkit.classfiles import read_classification

    path = path or shared_data() / SST2
    if not path.is_file():
        raise DataError(f"{path} is absent: this experiment needs SST-2 ({SST2} under $OBJREG_SHARED_DATA or shared/data beside the checkout)")
    records, labels = read_classification(path)
    return [r.text for r in records], torch.tensor([labels.index(r.label) for r in records])


def mean_pooled(backbone: nn.Module, input_ids: torch.Tensor, is_padding: torch.Tensor,
                document_ids: torch.Tensor) -> torch.Tensor:
    """``[B, H]``: the mean of the backbone's (bidirectional) output over each row's real tokens."""
    mask = masks.AttentionMask.bidirectional(is_padding, document_ids).dense()
    hidden = backbone.encode(input_ids, mask, masks.positions_within_documents(document_ids))
    real = (~is_padding).unsqueeze(-1).to(hidden.dtype)
    return (hidden * real).sum(dim=1) / real.sum(dim=1).clamp(min=1)


@torch.no_grad()
def sentence_features(model: nn.Module, tokenizer: Tokenizer, texts: Sequence[str], seq_len: int, device,
                      chunk: int = 128) -> torch.Tensor:
    """``[N, H]`` float64: the mean of the backbone's output over each text's real tokens."""
    model.eval()
    out = []
    for start in range(0, len(texts), chunk):
        batch = tokenizer.batch_from_texts(list(texts[start:start + chunk]), seq_len).to(device)
        out.append(mean_pooled(model, batch.input_ids, batch.is_padding, batch.document_ids).double().cpu())
    return torch.cat(out)


def probe_correct(features: torch.Tensor, labels: torch.Tensor, folds: int, seed: int,
                  also: Sequence[torch.Tensor] = (), l2: float = 1e-2) -> list[torch.Tensor]:
    """Cross-validated correctness ``[N]`` bool of a logistic-regression probe on ``features``
    ``[N, H]``: for each of ``folds`` folds (:func:`cross_validation_folds`), fit on the others
    (standardised with their statistics; mean log-loss + ``l2``·‖w‖², L-BFGS in float64) and
    predict the held-out fold. Returned for ``features`` and then for every tensor in ``also``
    (other versions of the same rows, e.g. misspelled, predicted by the probe fitted on ``features``)."""
    views = [features, *also]
    correct = [torch.zeros(len(labels), dtype=torch.bool) for _ in views]
    classes = int(labels.max()) + 1
    for fold, train in cross_validation_folds(len(labels), folds, seed):
        x = features[train]
        mean, std = x.mean(dim=0), x.std(dim=0).clamp(min=1e-8)
        weight, bias = fit_logistic((x - mean) / std, labels[train], classes, l2)
        with torch.no_grad():
            for view, out in zip(views, correct):
                out[fold] = (((view[fold] - mean) / std) @ weight + bias).argmax(dim=1) == labels[fold]
    return correct


def fit_logistic(x: torch.Tensor, y: torch.Tensor, classes: int, l2: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Multinomial logistic regression on ``x`` ``[N, H]`` float64: the weight ``[H, C]`` and
    bias ``[C]`` minimising mean cross-entropy + ``l2``·‖weight‖² (L-BFGS, strong Wolfe)."""
    weight = torch.zeros(x.shape[1], classes, dtype=torch.float64, requires_grad=True)
    bias = torch.zeros(classes, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([weight, bias], max_iter=200, line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        loss = F.cross_entropy(x @ weight + bias, y) + l2 * weight.pow(2).sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    return weight.detach(), bias.detach()
