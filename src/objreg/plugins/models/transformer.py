"""The default backbone: a small pre-LN Transformer encoder (``objreg.toolkit.layers``).

Model names: ``default`` (small, sized for the CPU run of ``objreg analyze``) and ``bert-base``
(BERT-base size: 768 hidden, 12 layers, 12 heads), both randomly initialised from the generator
the host passes in. The ``config`` mapping overrides :class:`~objreg.toolkit.layers.TransformerConfig`
fields, e.g. ``{"num_layers": 4, "attention": "sdpa"}``. The host adds the heads.

Written like a third-party plugin: it imports only the public ``objreg`` facade and its toolkit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import objreg
from objreg import InvalidParameterError, Vocabulary
from objreg.toolkit.heads import init_weights
from objreg.toolkit.layers import Block, TransformerConfig, check_inputs, prepare_attention

#: Field overrides per model name; everything else keeps the TransformerConfig default.
PRESETS: dict[str, dict[str, Any]] = {
    "default": {},
    "bert-base": {"hidden_size": 768, "num_layers": 12, "num_heads": 12, "intermediate_size": 3072},
}

#: Keys the user's config may set (vocab_size always comes from the tokenizer's vocabulary).
CONFIG_KEYS = tuple(f.name for f in dataclasses.fields(TransformerConfig) if f.name != "vocab_size")


def _coerce(name: str, value: Any, default: Any) -> Any:
    """Turn a CLI string (or an integral float) into the type of the field's default."""
    kind = type(default)
    try:
        if kind is int and isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str) and kind in (int, float):
            return kind(value)
    except ValueError:
        raise InvalidParameterError(f"model config {name!r} must be {kind.__name__}, got {value!r}") from None
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value  # anything else is checked by TransformerConfig.__post_init__


def build_config(model: str, vocab_size: int, overrides: Mapping[str, Any]) -> TransformerConfig:
    """The preset of ``model`` with ``overrides`` applied.

    Raises:
        InvalidParameterError: an unknown key (the message lists the allowed ones) or a bad value.
    """
    unknown = sorted(set(overrides) - set(CONFIG_KEYS))
    if unknown:
        raise InvalidParameterError(
            f"unknown model config key(s) {', '.join(map(repr, unknown))} for model {model!r}; "
            f"allowed: {', '.join(CONFIG_KEYS)}"
        )
    defaults = {f.name: f.default for f in dataclasses.fields(TransformerConfig) if f.name != "vocab_size"}
    fields = {**defaults, **PRESETS[model]}
    for key, value in overrides.items():
        fields[key] = _coerce(key, value, defaults[key])
    return TransformerConfig(vocab_size=vocab_size, **fields)


class Backbone(nn.Module):
    """Embeddings, blocks and final LayerNorm: the parameters every objective shares (an
    :class:`objreg.Backbone`). Weights are float32 on CPU, drawn only from the generator given to
    :func:`build_backbone`: the same seed gives bit-identical weights."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.config = config
        self.hidden_size = config.hidden_size
        self.vocab_size = config.vocab_size
        self.num_layers = config.num_layers
        self.max_positions = config.max_positions
        self.layer_norm_eps = config.layer_norm_eps
        self.token_embedding = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embedding = nn.Embedding(config.max_positions, config.hidden_size)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.num_layers))
        self.final_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def input_embeddings(self) -> nn.Parameter:
        return self.token_embedding.weight

    def position_embeddings(self) -> nn.Parameter:
        return self.position_embedding.weight

    def encode(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | objreg.AttentionMask, position_ids: torch.Tensor
    ) -> torch.Tensor:
        """Hidden states ``[B, T, H]``; ``attention_mask`` bool ``[B, T, T]`` or structured.

        A dense mask runs the configured attention (``math``: every derivative the analysis
        takes). A structured :class:`objreg.AttentionMask` runs fused attention without any
        ``[B, T, T]`` tensor (:class:`objreg.toolkit.layers.StructuredAttention`: memory linear
        in ``T``, for training on long rows), except under a ``torch.func`` transform or
        forward-mode AD, where it is densified and runs like a dense mask."""
        check_inputs(input_ids, attention_mask, position_ids, self.config.max_positions)
        x = self.token_embedding(input_ids) + self.position_embedding(position_ids)  # (B, T, H)
        x = F.dropout(x, p=self.config.dropout if self.training else 0.0)
        bias = prepare_attention(attention_mask, x.dtype)  # once, not once per layer
        for block in self.blocks:
            x = block(x, bias)  # (B, T, H)
        return self.final_norm(x)  # (B, T, H)

    forward = encode


def build_backbone(config: TransformerConfig, generator: torch.Generator) -> Backbone:
    # Build on the meta device: layer constructors would otherwise draw their own init from the
    # global RNG (a side effect, and bert-base would be initialised twice).
    with torch.device("meta"):
        backbone = Backbone(config)
    backbone.to_empty(device="cpu")
    backbone.float()
    init_weights(backbone, generator)
    return backbone


def _load(model: str, vocab: Vocabulary, config: Mapping[str, Any], generator: torch.Generator) -> Backbone:
    return build_backbone(build_config(model, vocab.size, config), generator)


@objreg.hookimpl
def objreg_register_models(register: Callable[[objreg.Provider], None]) -> None:
    register(objreg.Provider(
        "model", "default", "small pre-LN Transformer (hidden 128, 2 layers, 4 heads), random init", _load,
    ))
    register(objreg.Provider(
        "model", "bert-base", "BERT-base-sized pre-LN Transformer (hidden 768, 12 layers, 12 heads), random init",
        _load,
    ))
