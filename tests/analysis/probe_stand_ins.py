"""The probe tests' stand-ins (``tests/analysis/conftest.py`` puts this folder on ``sys.path``):
a bag-of-embeddings body shared by two pre-training heads and a downstream head, its per-example
losses and batches, in float64."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, WIDTH, LENGTH, BATCH = 11, 6, 5, 8
WEIGHTS = {"tokens": 1.0, "pairs": 0.5}


class Tiny(nn.Module):
    """An embedding body shared by a token head, a pair head and a downstream (task) head."""

    def __init__(self, dropout: float = 0.0):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.body = nn.Linear(WIDTH, WIDTH)
        self.drop = nn.Dropout(dropout)
        self.token_head = nn.Linear(WIDTH, VOCAB)
        self.pair_head = nn.Linear(WIDTH, 2)
        self.task_head = nn.Linear(WIDTH, 3)

    def hidden(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.body(self.drop(self.embed(ids)))).mean(1)

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.hidden(ids)
        return self.token_head(hidden), self.pair_head(hidden)


def token_loss(model: Tiny, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return F.cross_entropy(model.token_head(model.hidden(batch["ids"])), batch["y"], reduction="none")


def pair_loss(model: Tiny, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return F.cross_entropy(model.pair_head(model.hidden(batch["ids"])), batch["y"], reduction="none")


def task_loss(model: Tiny, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return F.cross_entropy(model.task_head(model.hidden(batch["ids"])), batch["y"], reduction="none")


LOSSES = {"tokens": token_loss, "pairs": pair_loss}


def batch(generator: torch.Generator, classes: int, size: int = BATCH) -> dict[str, torch.Tensor]:
    return {"ids": torch.randint(VOCAB, (size, LENGTH), generator=generator),
            "y": torch.randint(classes, (size,), generator=generator)}


def step_batches(generator: torch.Generator) -> dict[str, dict[str, torch.Tensor]]:
    return {"tokens": batch(generator, VOCAB), "pairs": batch(generator, 2)}


#: The evaluation set defining D, and the fit set of a re-fitted head.
EVAL = [batch(torch.Generator().manual_seed(99), 3, 12), batch(torch.Generator().manual_seed(98), 3, 5)]
FIT = [batch(torch.Generator().manual_seed(97), 3, 16), batch(torch.Generator().manual_seed(96), 3, 9)]


def make(optimizer: str = "sgd", dtype: torch.dtype = torch.float64, dropout: float = 0.0, lr: float = 0.05,
         cls: type | None = None, **options: Any) -> tuple[Tiny, torch.optim.Optimizer]:
    """The model (seed 0) and an optimizer over everything but the downstream head."""
    torch.manual_seed(0)
    model = Tiny(dropout).to(dtype)
    trained = [p for n, p in model.named_parameters() if not n.startswith("task_head")]
    kinds = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}
    return model, (cls or kinds[optimizer])(trained, lr=lr, **options)
