"""The built-in head kinds, registered through the same hook as a plugin's own kinds.

Written like a third-party plugin: it imports only the public ``objreg`` facade and torch.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

import objreg
from objreg.toolkit.heads import ClassifierHead, FirstTokenProjection, LMHead


@objreg.hookimpl
def objreg_register_heads(register: Callable[[objreg.HeadKind], None]) -> None:
    register(objreg.HeadKind(
        "lm", "tied language-model head (BERT's transform, decoder = input embeddings): [..., H] -> [..., V]",
        lambda spec, backbone: LMHead(backbone.hidden_size, backbone.vocab_size, backbone.layer_norm_eps),
    ))
    register(objreg.HeadKind(
        "classifier", "tanh pooler on the first token, then a linear layer: [B, T, H] -> [B, num_outputs]",
        lambda spec, backbone: ClassifierHead(backbone.hidden_size, spec.num_outputs), needs_outputs=True,
        linear=("classifier.weight", "classifier.bias"),  # the pooler stays as drawn
    ))
    register(objreg.HeadKind(
        "span", "start and end logits per token (extractive QA): [B, T, H] -> [B, T, 2]", _span,
        linear=("weight", "bias"),
    ))
    register(objreg.HeadKind(
        "token_classifier", "a linear layer per token: [..., H] -> [..., num_outputs]",
        lambda spec, backbone: nn.Linear(backbone.hidden_size, spec.num_outputs), needs_outputs=True,
        linear=("weight", "bias"),
    ))
    register(objreg.HeadKind(
        "projection", "a linear map of the first token (pooled embedding): [B, T, H] -> [B, num_outputs]",
        lambda spec, backbone: FirstTokenProjection(backbone.hidden_size, spec.num_outputs), needs_outputs=True,
        linear=("proj.weight", "proj.bias"),
    ))


def _span(spec: objreg.HeadSpec, backbone: objreg.Backbone) -> nn.Module:
    if spec.num_outputs not in (0, 2):
        raise objreg.InvalidParameterError(
            f"head {spec.name!r} of kind 'span' has 2 outputs (start, end), got num_outputs={spec.num_outputs}"
        )
    return nn.Linear(backbone.hidden_size, 2)  # (B, T, H) -> (B, T, 2) start/end logits
