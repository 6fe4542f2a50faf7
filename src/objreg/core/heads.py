"""The heads objectives and tasks declare (:class:`objreg.HeadSpec`), for any backbone.

A model plugin builds them from the specs with :func:`build_heads`, giving its hidden size and
vocabulary size, then ties every ``lm`` head to its input embeddings with :func:`tie_lm_heads`.
The default Transformer and the Hugging Face adapter both do, so an objective gets the same head
whatever the backbone.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from objreg.core.errors import InvalidParameterError
from objreg.core.types import HeadSpec


class LMHead(nn.Module):
    """BERT's MLM head: dense, GELU, LayerNorm, then a decoder whose weight is the token embedding.

    ``decoder.weight`` is replaced by the backbone's embedding Parameter (:func:`tie_lm_heads`), so
    only ``dense``, ``norm`` and ``decoder.bias`` belong to the head.
    """

    def __init__(self, hidden_size: int, vocab_size: int, layer_norm_eps: float):
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        self.decoder = nn.Linear(hidden_size, vocab_size)

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


HEAD_KINDS = ("lm", "classifier", "span", "token_classifier", "projection")


def build_head(spec: HeadSpec, hidden_size: int, vocab_size: int, layer_norm_eps: float = 1e-5) -> nn.Module:
    """The head module for ``spec``; see :class:`objreg.HeadSpec` for the kinds."""
    if spec.kind not in HEAD_KINDS:
        raise InvalidParameterError(
            f"head {spec.name!r} has unknown kind {spec.kind!r}; allowed: {', '.join(HEAD_KINDS)}"
        )
    if spec.kind in ("classifier", "token_classifier", "projection") and spec.num_outputs < 1:
        raise InvalidParameterError(
            f"head {spec.name!r} of kind {spec.kind!r} needs num_outputs >= 1, got {spec.num_outputs}"
        )
    if spec.kind == "span" and spec.num_outputs not in (0, 2):
        raise InvalidParameterError(
            f"head {spec.name!r} of kind 'span' has 2 outputs (start, end), got num_outputs={spec.num_outputs}"
        )
    if spec.kind == "lm":
        return LMHead(hidden_size, vocab_size, layer_norm_eps)
    if spec.kind == "classifier":
        return ClassifierHead(hidden_size, spec.num_outputs)
    if spec.kind == "span":
        return nn.Linear(hidden_size, 2)  # (B, T, H) -> (B, T, 2) start/end logits
    if spec.kind == "token_classifier":
        return nn.Linear(hidden_size, spec.num_outputs)  # (..., H) -> (..., n)
    return FirstTokenProjection(hidden_size, spec.num_outputs)


def build_heads(
    heads: Sequence[HeadSpec], hidden_size: int, vocab_size: int, layer_norm_eps: float = 1e-5
) -> nn.ModuleDict:
    """All heads, keyed by name; names must be unique, non-empty and free of ``.``."""
    names = [spec.name for spec in heads]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise InvalidParameterError(f"head name(s) declared more than once: {', '.join(duplicates)}")
    for name in names:
        if not name or "." in name:  # nn.ModuleDict keys become parameter-name segments
            raise InvalidParameterError(f"head name {name!r} must be non-empty and contain no '.'")
    return nn.ModuleDict({spec.name: build_head(spec, hidden_size, vocab_size, layer_norm_eps) for spec in heads})


def tie_lm_heads(heads: nn.ModuleDict, embedding: nn.Parameter) -> None:
    """Make every ``lm`` head decode with the input embedding matrix (one Parameter, counted once,
    owned by the backbone)."""
    for head in heads.values():
        if isinstance(head, LMHead):
            if tuple(head.decoder.weight.shape) != tuple(embedding.shape):
                raise InvalidParameterError(
                    f"cannot tie the LM head ({tuple(head.decoder.weight.shape)}) to the input embeddings "
                    f"({tuple(embedding.shape)}): the vocabulary and the model disagree in size"
                )
            head.decoder.weight = embedding


@torch.no_grad()
def init_weights(module: nn.Module, generator: torch.Generator) -> None:
    """BERT's init from ``generator``: normal(0, 0.02) weights, zero biases, LayerNorm ones/zeros.

    Modules are visited in registration order and a shared Parameter only once, so the draws (and
    hence the weights) depend on nothing but the architecture and the generator state.
    """
    seen: set[int] = set()
    for sub in module.modules():
        for name, param in sub.named_parameters(recurse=False):
            if id(param) in seen:
                continue
            seen.add(id(param))
            if isinstance(sub, nn.LayerNorm):
                param.fill_(1.0 if name == "weight" else 0.0)
            elif name == "bias":
                param.zero_()
            else:
                param.normal_(0.0, 0.02, generator=generator)
