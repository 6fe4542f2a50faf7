"""Stand-ins shared by the plugins' tests."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn


class FirstToken(nn.Module):
    """The documented classifier head: [B, T, H] -> [B, n] from the first token."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.linear = linear

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.linear(hidden[:, 0])


@pytest.fixture(scope="session")
def stand_in_model():
    """``stand_in_model(head, hidden_size, num_outputs, first_token=False)``: a model that is only
    ``heads[head]``, a float64 ``nn.Linear(hidden_size, num_outputs)`` applied to every position
    or (``first_token``) to the first one; ``.head`` is that linear layer. Its weights are drawn
    after ``torch.manual_seed(0)``, so every test gets the same head and the same global stream
    after it."""

    def model(head: str, hidden_size: int, num_outputs: int, first_token: bool = False) -> SimpleNamespace:
        torch.manual_seed(0)
        linear = nn.Linear(hidden_size, num_outputs).double()
        return SimpleNamespace(heads=nn.ModuleDict({head: FirstToken(linear) if first_token else linear}), head=linear)

    return model
