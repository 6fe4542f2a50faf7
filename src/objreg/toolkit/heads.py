"""The modules of the built-in head kinds (``lm``, ``classifier``, ``projection``; ``span`` and
``token_classifier`` are plain ``nn.Linear``), for any backbone. The host builds them through the
head kinds registered with ``objreg_register_heads`` (:mod:`objreg.plugins.heads`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from objreg.core.errors import InvalidParameterError
from objreg.core.handles import CAUSAL
from objreg.core.heads import init_weights

__all__ = ["ClassifierHead", "FirstTokenProjection", "LMHead", "init_weights", "summary_states"]


def summary_states(hidden: torch.Tensor, batch: object) -> torch.Tensor:
    """The states a first-token head (``classifier``, ``projection``) should read, ``[B, T', H]``:
    ``hidden`` itself, whose first token has seen the whole row under bidirectional attention;
    on rows built for a decoder-only model (``batch.extras["causal"]``, where only the last real
    token has seen the row) that token's state alone, ``[B, 1, H]``, as Hugging Face's
    ``*ForSequenceClassification`` heads on causal LMs read it. Fixed shapes (vmap-safe)."""
    if CAUSAL not in getattr(batch, "extras", {}):
        return hidden
    last = (~batch.is_padding).sum(dim=1).sub(1).clamp(min=0)  # (B,)
    index = last[:, None, None].expand(-1, 1, hidden.shape[-1])  # (B, 1, H)
    return hidden.gather(1, index)  # (B, 1, H)


class LMHead(nn.Module):
    """BERT's MLM head: dense, GELU, LayerNorm, then a decoder whose weight is the token embedding.

    ``decoder.weight`` is the backbone's embedding Parameter (:meth:`tie`), so only ``dense``,
    ``norm`` and ``decoder.bias`` belong to the head.
    """

    def __init__(self, hidden_size: int, vocab_size: int, layer_norm_eps: float):
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        self.decoder = nn.Linear(hidden_size, vocab_size)

    def tie(self, backbone: nn.Module) -> None:
        """Decode with the backbone's input embeddings (one Parameter, counted once, owned by it)."""
        embedding = backbone.input_embeddings()
        if tuple(self.decoder.weight.shape) != tuple(embedding.shape):
            raise InvalidParameterError(
                f"cannot tie the LM head ({tuple(self.decoder.weight.shape)}) to the input embeddings "
                f"({tuple(embedding.shape)}): the vocabulary and the model disagree in size"
            )
        self.decoder.weight = embedding

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        x = self.norm(F.gelu(self.dense(hidden)))  # (..., H)
        return self.decoder(x)  # (..., V)


class ClassifierHead(nn.Module):
    """BERT's pooler (dense + tanh on the first token) followed by a linear classifier."""

    def __init__(self, hidden_size: int, num_outputs: int):
        super().__init__()
        self.pooler = nn.Linear(hidden_size, hidden_size)
        self.classifier = nn.Linear(hidden_size, num_outputs)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        pooled = torch.tanh(self.pooler(hidden[:, 0]))  # (B, H)
        return self.classifier(pooled)  # (B, num_outputs)


class FirstTokenProjection(nn.Module):
    """A linear map of the first token's hidden state: a pooled embedding (contrastive)."""

    def __init__(self, hidden_size: int, num_outputs: int):
        super().__init__()
        self.proj = nn.Linear(hidden_size, num_outputs)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.proj(hidden[:, 0])  # (B, num_outputs)
