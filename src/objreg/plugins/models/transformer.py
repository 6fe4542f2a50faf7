"""The default backbone: a small pre-LN Transformer encoder plus the heads objectives declare.

Model names: ``default`` (small, sized for the one-minute CPU run of ``objreg analyze``) and
``bert-base`` (BERT-base size: 768 hidden, 12 layers, 12 heads), both randomly initialised from
the generator the host passes in. The ``config`` mapping overrides :class:`TransformerConfig`
fields, e.g. ``{"num_layers": 4, "attention": "sdpa"}``.

The attention mask is an argument of every forward pass (bool ``[B, T, T]``, True = query ``i``
may attend key ``j``), because each objective brings its own mask. The default ``"math"``
attention is written with plain ops so that ``torch.func`` can take per-sample gradients
(``vmap(grad)``), forward-mode products (``jvp``) and Hessian-vector products through it.

Written like a third-party plugin: it imports only the public ``objreg`` facade.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

import objreg
from objreg import HeadSpec, InvalidParameterError, ProviderInfo, Vocabulary, heads

ATTENTION_IMPLEMENTATIONS = ("math", "sdpa")


@dataclass(frozen=True)
class TransformerConfig:
    """Hyperparameters of :class:`ObjregTransformer`; the defaults are the ``default`` model."""

    vocab_size: int
    # Sized for the default `objreg analyze` (batch 16, seq_len 128, ~15 training steps plus
    # gradient probes), which should take about a minute on a 2-core CPU.
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    intermediate_size: int = 512  # 4 x hidden, as in BERT and GPT-2
    max_positions: int = 512  # BERT's limit; position ids must stay below it
    # 0: the analysis needs deterministic forward passes (the Taylor prediction is compared with
    # the loss change actually measured, and vmap/jvp need a pure function). Dropout > 0 draws from
    # torch's global RNG (F.dropout takes no generator), so use it for plain training only.
    dropout: float = 0.0
    layer_norm_eps: float = 1e-5
    # "math": plain ops, supports grad, vmap, jvp and double backward (what the analysis needs).
    # "sdpa": F.scaled_dot_product_attention, faster for plain training on GPU, no forward mode.
    attention: str = "math"

    def __post_init__(self) -> None:
        sizes = ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size", "max_positions")
        for name in sizes:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidParameterError(f"model config {name!r} must be a positive integer, got {value!r}")
        if self.hidden_size % self.num_heads != 0:
            raise InvalidParameterError(
                f"model config hidden_size={self.hidden_size} must be divisible by num_heads={self.num_heads}"
            )
        if not _is_real(self.dropout) or not 0.0 <= self.dropout < 1.0:
            raise InvalidParameterError(f"model config 'dropout' must lie in [0, 1), got {self.dropout!r}")
        if not _is_real(self.layer_norm_eps) or not self.layer_norm_eps > 0.0:
            raise InvalidParameterError(f"model config 'layer_norm_eps' must be positive, got {self.layer_norm_eps!r}")
        if self.attention not in ATTENTION_IMPLEMENTATIONS:
            allowed = ", ".join(ATTENTION_IMPLEMENTATIONS)
            raise InvalidParameterError(f"model config 'attention' must be one of {allowed}, got {self.attention!r}")


def _is_real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


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


# -- backbone ---------------------------------------------------------------------------------------


class AttentionBias(NamedTuple):
    """A bool ``[B, T, T]`` attention mask prepared once per forward pass and shared by every layer.

    Attributes:
        bias: ``(B, 1, T, T)`` in the model's dtype: 0 where query ``i`` may attend key ``j``,
            finfo.min where not. Added to the scores, it masks with one ``add`` (its derivatives
            are trivial in every mode); finfo.min rather than -inf gives a query row with no allowed
            key (a padding query) a uniform softmax instead of NaN (-inf everywhere is 0/0).
        has_key: ``(B, 1, T, 1)`` bool: the query may attend at least one key.
    """

    bias: torch.Tensor
    has_key: torch.Tensor


def attention_bias(mask: torch.Tensor, dtype: torch.dtype) -> AttentionBias:
    """The :class:`AttentionBias` of a bool ``[B, T, T]`` mask (pure: safe under vmap and jvp)."""
    mask = mask[:, None]  # (B, 1, T, T), the same for every head
    allowed = torch.zeros((), dtype=dtype, device=mask.device)
    masked = torch.full((), torch.finfo(dtype).min, dtype=dtype, device=mask.device)
    return AttentionBias(torch.where(mask, allowed, masked), mask.any(dim=-1, keepdim=True))


def math_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, dropout: float
) -> torch.Tensor:
    """Softmax attention from plain ops: differentiable by grad, vmap, jvp and double backward.

    q, k, v: ``(B, nh, T, hs)``; bias: additive, broadcastable to ``(B, nh, T, T)`` (see
    :class:`AttentionBias`). The scale goes on ``q`` (``T/hs`` times fewer elements than the scores).
    """
    scores = (q * (1.0 / math.sqrt(q.shape[-1]))) @ k.transpose(-2, -1) + bias  # (B, nh, T, T)
    probs = F.dropout(scores.softmax(dim=-1), p=dropout)  # (B, nh, T, T)
    return probs @ v  # (B, nh, T, hs)


def sdpa_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, dropout: float
) -> torch.Tensor:
    """The same attention through ``F.scaled_dot_product_attention`` (fused kernels where available).

    Faster for plain training on GPU, but the fused kernels (flash, memory-efficient, CPU flash)
    have no forward-mode derivative: ``jvp`` raises NotImplementedError (torch 2.13), and ``vmap``
    falls back to a slow per-example loop. The analysis still gets exact per-sample dots through
    them (ghost dot products need first derivatives only); HVPs need ``"math"``.
    """
    # The finite bias keeps a row with no allowed key NaN-free in every kernel (SelfAttention
    # zeroes its output anyway).
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout)  # (B, nh, T, hs)


class SelfAttention(nn.Module):
    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.num_heads = config.num_heads
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size)  # one fused projection
        self.out = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = config.dropout
        self.attend = math_attention if config.attention == "math" else sdpa_attention

    def forward(self, x: torch.Tensor, mask: torch.Tensor | AttentionBias) -> torch.Tensor:
        """``mask``: bool ``[B, T, T]``, or the :class:`AttentionBias` the backbone made of it once."""
        B, T, H = x.shape  # batch size, sequence length, hidden size
        if isinstance(mask, torch.Tensor):
            mask = attention_bias(mask, x.dtype)
        q, k, v = self.qkv(x).split(H, dim=-1)  # (B, T, H) each
        q = q.reshape(B, T, self.num_heads, H // self.num_heads).transpose(1, 2)  # (B, nh, T, hs)
        k = k.reshape(B, T, self.num_heads, H // self.num_heads).transpose(1, 2)  # (B, nh, T, hs)
        v = v.reshape(B, T, self.num_heads, H // self.num_heads).transpose(1, 2)  # (B, nh, T, hs)
        dropout = self.dropout if self.training else 0.0
        y = self.attend(q, k, v, mask.bias, dropout)  # (B, nh, T, hs)
        # A query with no allowed key (a padding query) attends to nothing: its output is zero,
        # the same in both paths whatever the softmax made of its row.
        y = torch.where(mask.has_key, y, 0.0)
        y = y.transpose(1, 2).reshape(B, T, H)  # (B, T, H)
        return F.dropout(self.out(y), p=dropout)


class MLP(nn.Module):
    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.up = nn.Linear(config.hidden_size, config.intermediate_size)
        self.down = nn.Linear(config.intermediate_size, config.hidden_size)
        self.dropout = config.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.gelu(self.up(x))  # (B, T, I); exact erf GELU, as in BERT
        return F.dropout(self.down(x), p=self.dropout if self.training else 0.0)  # (B, T, H)


class Block(nn.Module):
    """Pre-LN block (GPT-2 style): normalising before each sublayer keeps training stable
    without a learning-rate warm-up, which matters for a run of a few dozen steps."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.norm1 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.attention = SelfAttention(config)
        self.norm2 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | AttentionBias) -> torch.Tensor:
        x = x + self.attention(self.norm1(x), mask)  # (B, T, H)
        return x + self.mlp(self.norm2(x))  # (B, T, H)


class Backbone(nn.Module):
    """Embeddings, blocks and final LayerNorm: the parameters every objective shares."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.config = config
        self.token_embedding = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embedding = nn.Embedding(config.max_positions, config.hidden_size)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.num_layers))
        self.final_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
    ) -> torch.Tensor:
        _check_inputs(input_ids, attention_mask, position_ids, self.config.max_positions)
        x = self.token_embedding(input_ids) + self.position_embedding(position_ids)  # (B, T, H)
        x = F.dropout(x, p=self.config.dropout if self.training else 0.0)
        bias = attention_bias(attention_mask, x.dtype)  # once, not once per layer
        for block in self.blocks:
            x = block(x, bias)  # (B, T, H)
        return self.final_norm(x)  # (B, T, H)


def _check_inputs(
    input_ids: torch.Tensor, mask: torch.Tensor, position_ids: torch.Tensor, max_positions: int
) -> None:
    # Shape and dtype checks only: they are static, so they are safe under vmap, grad and jvp.
    B, T = input_ids.shape
    if mask.dtype != torch.bool or tuple(mask.shape) != (B, T, T):
        raise InvalidParameterError(
            f"attention_mask must be bool [B, T, T] = [{B}, {T}, {T}], got {mask.dtype} {tuple(mask.shape)}"
        )
    if tuple(position_ids.shape) != (B, T):
        raise InvalidParameterError(f"position_ids must have shape [{B}, {T}], got {tuple(position_ids.shape)}")
    if T > max_positions:
        raise InvalidParameterError(f"sequence length {T} exceeds the model's max_positions={max_positions}")


# -- heads ------------------------------------------------------------------------------------------


class GeneratorHead(nn.Module):
    """ELECTRA's generator: a small Transformer on the backbone's token and position embeddings
    with an MLM output tied to the token embeddings.

    Sized as ``get_generator_config`` in google-research/electra: width ``hidden_size // divisor``
    (ELECTRA-small 1/4, base 1/3), as many layers as the backbone, ``max(1, width // 64)`` heads,
    FFN ``4 × width``. The shared ``H``-wide embeddings are projected to the width (ELECTRA's
    ``embeddings_project``) and the output goes back to ``H`` before the tied decoder (its
    ``dense`` to ``embedding_size``). ``token_embedding``, ``position_embedding`` and
    ``decoder.weight`` are replaced by the backbone's Parameters (see :class:`ObjregTransformer`),
    so only the projection, blocks, norms and biases belong to the head.

    ``forward(input_ids [B, T], attention_mask [B, T, T], position_ids [B, T], positions [B, K])``
    returns MLM logits ``[B, K, V]`` at ``positions`` only.
    """

    def __init__(self, config: TransformerConfig, divisor: int):
        super().__init__()
        width = max(1, config.hidden_size // divisor)
        num_heads = max(1, width // 64)
        width -= width % num_heads  # the heads must divide the width
        small = dataclasses.replace(config, hidden_size=width, num_heads=num_heads, intermediate_size=4 * width)
        self.max_positions = config.max_positions
        self.token_embedding = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embedding = nn.Embedding(config.max_positions, config.hidden_size)
        self.project_in = nn.Linear(config.hidden_size, small.hidden_size)
        self.blocks = nn.ModuleList(Block(small) for _ in range(config.num_layers))
        self.final_norm = nn.LayerNorm(small.hidden_size, eps=config.layer_norm_eps)
        self.dense = nn.Linear(small.hidden_size, config.hidden_size)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size)

    def tie(self, backbone: Backbone) -> None:
        """Share the backbone's token and position embeddings (input and tied output), as ELECTRA does."""
        self.token_embedding.weight = backbone.token_embedding.weight
        self.position_embedding.weight = backbone.position_embedding.weight
        self.decoder.weight = backbone.token_embedding.weight

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
        positions: torch.Tensor,
    ) -> torch.Tensor:
        _check_inputs(input_ids, attention_mask, position_ids, self.max_positions)
        x = self.token_embedding(input_ids) + self.position_embedding(position_ids)  # (B, T, H)
        x = self.project_in(x)  # (B, T, h)
        bias = attention_bias(attention_mask, x.dtype)  # once, not once per layer
        for block in self.blocks:
            x = block(x, bias)  # (B, T, h)
        x = self.final_norm(x)
        picked = x.gather(1, positions.unsqueeze(-1).expand(-1, -1, x.shape[-1]))  # (B, K, h)
        return self.decoder(self.norm(F.gelu(self.dense(picked))))  # (B, K, V)


def build_heads(specs: Sequence[HeadSpec], config: TransformerConfig) -> nn.ModuleDict:
    """The declared heads (:mod:`objreg.heads`), plus this backbone's own ``generator`` kind."""
    generators = {spec.name: spec for spec in specs if spec.kind == "generator"}
    for spec in generators.values():
        if spec.num_outputs < 1:
            raise InvalidParameterError(
                f"head {spec.name!r} of kind 'generator' needs num_outputs >= 1 (the width divisor), "
                f"got {spec.num_outputs}"
            )
    others = [spec for spec in specs if spec.kind != "generator"]
    built = heads.build_heads(others, config.hidden_size, config.vocab_size, config.layer_norm_eps)
    return nn.ModuleDict({
        spec.name: GeneratorHead(config, spec.num_outputs) if spec.kind == "generator" else built[spec.name]
        for spec in specs
    })


# -- the model --------------------------------------------------------------------------------------


class ObjregTransformer(nn.Module):
    """Shared backbone plus named heads, as ``objreg_load_model`` returns it.

    Attributes:
        backbone: Embeddings, blocks and final LayerNorm: the shared parameters the analysis
            measures alignment on.
        heads: ``nn.ModuleDict`` keyed by head name. An ``lm`` head's decoder weight is the
            backbone's token-embedding Parameter (one object, listed once, under ``backbone.``).
        hidden_size: ``H``.
        config: The :class:`TransformerConfig`.

    Weights are float32 on CPU, drawn only from ``generator``: the same seed gives bit-identical
    weights. The host moves the model to its device and dtype.
    """

    def __init__(self, config: TransformerConfig, specs: Sequence[HeadSpec], generator: torch.Generator):
        super().__init__()
        if len({spec.name for spec in specs}) < len(specs):
            heads.build_heads(specs, 1, 1)  # raises the duplicate-name error before any head is built
        self.config = config
        self.hidden_size = config.hidden_size
        # Build on the meta device: layer constructors would otherwise draw their own init from the
        # global RNG (a side effect, and bert-base would be initialised twice).
        with torch.device("meta"):
            self.backbone = Backbone(config)
            self.heads = build_heads(specs, config)
        self.to_empty(device="cpu")
        self.float()
        # Tie after to_empty: moving off meta creates a fresh Parameter per module and would untie.
        heads.tie_lm_heads(self.heads, self.backbone.token_embedding.weight)
        for head in self.heads.values():
            if isinstance(head, GeneratorHead):
                head.tie(self.backbone)
        heads.init_weights(self, generator)

    def encode(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
    ) -> torch.Tensor:
        """Hidden states ``[B, T, H]`` for ``input_ids`` ``[B, T]`` long, ``attention_mask``
        ``[B, T, T]`` bool (True: query ``i`` may attend key ``j``) and ``position_ids`` ``[B, T]``."""
        return self.backbone(input_ids, attention_mask, position_ids)

    forward = encode


# -- hooks ------------------------------------------------------------------------------------------


@objreg.hookimpl
def objreg_load_model(
    model: str, vocab: Vocabulary, heads: Sequence[HeadSpec], config: Mapping[str, Any], generator: torch.Generator
) -> nn.Module | None:
    if model not in PRESETS:
        return None  # another plugin may provide it
    return ObjregTransformer(build_config(model, vocab.size, config or {}), heads, generator)


@objreg.hookimpl
def objreg_providers() -> list[ProviderInfo]:
    return [
        ProviderInfo(
            kind="model",
            name="default",
            description="small pre-LN Transformer (hidden 128, 2 layers, 4 heads), random init",
        ),
        ProviderInfo(
            kind="model",
            name="bert-base",
            description="BERT-base-sized pre-LN Transformer (hidden 768, 12 layers, 12 heads), random init",
        ),
    ]
