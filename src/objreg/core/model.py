"""What a model is to objreg: the :class:`Backbone` a model provider builds, the :class:`Model`
an objective's loss sees, and :class:`ObjregModel`, the host's composition of the two.

A model provider (``objreg_register_models``) builds only the backbone: the shared parameters
and ``encode``. The host adds the heads the objectives and the task declare, built by the head
kinds plugins register (``objreg_register_heads``), so every head works on every backbone: an
objective gets the same ``lm`` head, or rtd the same generator, on the default Transformer and on
a Hugging Face checkpoint.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

import torch
from torch import nn


@runtime_checkable
class Backbone(Protocol):
    """What a model provider returns: an ``nn.Module`` whose parameters are the shared ones.

    Attributes:
        hidden_size: ``H``.
        vocab_size: Rows of the input embedding.
        num_layers: Transformer layers (a head kind may size itself from it, e.g. rtd's generator).
        max_positions: Longest row the position embedding allows (0: no limit).
        layer_norm_eps: The backbone's LayerNorm epsilon, for heads that normalise.
        architecture: Optional (``"encoder"`` when absent): ``"encoder"`` (bidirectional stack),
            ``"decoder"`` (a decoder-only causal LM that honours any mask it is given) or
            ``"encoder-decoder"``, whose ``encode`` takes the ``[source ; target]`` rows of
            ``objreg.toolkit.seq2seq`` with their prefix mask, runs the source through the encoder
            and the target through the decoder, and returns the states in the prefix-LM layout
            (``objreg.toolkit.encoder_decoder``); rows with a bidirectional mask run on the encoder
            alone. See docs/models.md.
    """

    hidden_size: int
    vocab_size: int
    num_layers: int
    max_positions: int
    layer_norm_eps: float

    def encode(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
    ) -> torch.Tensor:
        """Hidden states ``[B, T, H]`` for ``input_ids`` ``[B, T]`` long, a bool ``[B, T, T]``
        ``attention_mask`` (True: query ``i`` may attend key ``j``) and ``position_ids`` ``[B, T]``.
        Must be pure and transform-safe: the analysis runs it under ``vmap``, ``jvp`` and double
        backward."""
        ...

    def input_embeddings(self) -> nn.Parameter:
        """The token-embedding matrix ``[V, H]`` (tied LM heads decode with it)."""
        ...

    def position_embeddings(self) -> nn.Parameter | None:
        """The learned position-embedding matrix ``[P, H]``, or None (rotary, sinusoidal, ...)."""
        ...


#: The architectures a backbone can declare (``Backbone.architecture``).
ARCHITECTURES = ("encoder", "decoder", "encoder-decoder")


def architecture_of(backbone: object) -> str:
    """``backbone.architecture``, ``"encoder"`` where it declares none."""
    value = getattr(backbone, "architecture", "encoder")
    if value not in ARCHITECTURES:
        raise ValueError(f"backbone architecture must be one of {', '.join(ARCHITECTURES)}, got {value!r}")
    return value


class Model(Protocol):
    """What ``objreg_loss`` sees as ``outputs.model``: the heads, the backbone's architecture and
    another backbone pass."""

    heads: Mapping[str, nn.Module]
    hidden_size: int
    architecture: str

    def encode(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
    ) -> torch.Tensor:
        """Hidden states ``[B, T, H]``: the same backbone pass the host ran, on other inputs
        (e.g. ELECTRA's discriminator on the replaced tokens). Transform-safe."""
        ...


class ObjregModel(nn.Module):
    """The backbone plus the named heads.

    Attributes:
        backbone: The provider's :class:`Backbone`: the shared parameters (``backbone.*``), which
            the analysis measures alignment on.
        heads: ``nn.ModuleDict`` keyed by head name (``heads.*``). A head that shares a backbone
            Parameter (a tied LM decoder) holds the same object, listed once, under ``backbone.``.
    """

    def __init__(self, backbone: nn.Module, heads: nn.ModuleDict):
        super().__init__()
        self.backbone = backbone
        self.heads = heads
        self.hidden_size = int(backbone.hidden_size)
        self.architecture = architecture_of(backbone)

    def encode(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
    ) -> torch.Tensor:
        return self.backbone.encode(input_ids, attention_mask, position_ids)

    forward = encode
