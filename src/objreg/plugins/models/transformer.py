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
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import objreg
from objreg import HeadSpec, InvalidParameterError, ProviderInfo, Vocabulary

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


def math_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, dropout: float
) -> torch.Tensor:
    """Softmax attention from plain ops: differentiable by grad, vmap, jvp and double backward.

    q, k, v: ``(B, nh, T, hs)``; mask: bool, broadcastable to ``(B, nh, T, T)``.
    Masked scores become finfo.min rather than -inf: a query row with no allowed key (a padding
    query) then gets a uniform softmax instead of NaN (-inf everywhere would give 0/0).
    """
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))  # (B, nh, T, T)
    scores = torch.where(mask, scores, torch.finfo(scores.dtype).min)
    probs = F.dropout(scores.softmax(dim=-1), p=dropout)  # (B, nh, T, T)
    return probs @ v  # (B, nh, T, hs)


def sdpa_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, dropout: float
) -> torch.Tensor:
    """The same attention through ``F.scaled_dot_product_attention`` (fused kernels where available).

    Faster for plain training on GPU, but the fused kernels (flash, memory-efficient, CPU flash)
    have no forward-mode derivative: ``jvp`` raises NotImplementedError (torch 2.13), and ``vmap``
    falls back to a slow per-example loop. Use ``"math"`` for the analysis.
    """
    # Kernels disagree on a row with no allowed key (NaN or 0); let such rows see every key so no
    # kernel meets one (SelfAttention zeroes their output anyway).
    mask = mask | ~mask.any(dim=-1, keepdim=True)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)  # (B, nh, T, hs)


class SelfAttention(nn.Module):
    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.num_heads = config.num_heads
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size)  # one fused projection
        self.out = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = config.dropout
        self.attend = math_attention if config.attention == "math" else sdpa_attention

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        B, T, H = x.shape  # batch size, sequence length, hidden size
        q, k, v = self.qkv(x).split(H, dim=-1)  # (B, T, H) each
        q = q.reshape(B, T, self.num_heads, H // self.num_heads).transpose(1, 2)  # (B, nh, T, hs)
        k = k.reshape(B, T, self.num_heads, H // self.num_heads).transpose(1, 2)  # (B, nh, T, hs)
        v = v.reshape(B, T, self.num_heads, H // self.num_heads).transpose(1, 2)  # (B, nh, T, hs)
        dropout = self.dropout if self.training else 0.0
        mask = mask[:, None]  # (B, 1, T, T), the same for every head
        y = self.attend(q, k, v, mask, dropout)  # (B, nh, T, hs)
        # A query with no allowed key (a padding query) attends to nothing: its output is zero,
        # the same in both paths whatever the softmax made of its row.
        has_key = mask.any(dim=-1, keepdim=True)  # (B, 1, T, 1)
        y = torch.where(has_key, y, 0.0)
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

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
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
        for block in self.blocks:
            x = block(x, attention_mask)  # (B, T, H)
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


class LMHead(nn.Module):
    """BERT's MLM head: dense, GELU, LayerNorm, then a decoder whose weight is the token embedding.

    ``decoder.weight`` is assigned the backbone's embedding Parameter after construction (see
    :class:`ObjregTransformer`), so only ``dense``, ``norm`` and ``decoder.bias`` belong to the head.
    """

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        x = self.norm(F.gelu(self.dense(hidden)))  # (..., H)
        return self.decoder(x)  # (..., V)


class ClassifierHead(nn.Module):
    """BERT's pooler (dense + tanh on the first token) followed by a linear classifier."""

    def __init__(self, config: TransformerConfig, num_outputs: int):
        super().__init__()
        self.pooler = nn.Linear(config.hidden_size, config.hidden_size)
        self.classifier = nn.Linear(config.hidden_size, num_outputs)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        pooled = torch.tanh(self.pooler(hidden[:, 0]))  # (B, H)
        return self.classifier(pooled)  # (B, num_outputs)


class FirstTokenProjection(nn.Module):
    """A linear map of the first token's hidden state: a pooled embedding (contrastive)."""

    def __init__(self, config: TransformerConfig, num_outputs: int):
        super().__init__()
        self.proj = nn.Linear(config.hidden_size, num_outputs)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.proj(hidden[:, 0])  # (B, num_outputs)


HEAD_KINDS = ("lm", "classifier", "span", "token_classifier", "projection")


def build_head(spec: HeadSpec, config: TransformerConfig) -> nn.Module:
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
        return LMHead(config)
    if spec.kind == "classifier":
        return ClassifierHead(config, spec.num_outputs)
    if spec.kind == "span":
        return nn.Linear(config.hidden_size, 2)  # (B, T, H) -> (B, T, 2) start/end logits
    if spec.kind == "token_classifier":
        return nn.Linear(config.hidden_size, spec.num_outputs)  # (..., H) -> (..., n)
    return FirstTokenProjection(config, spec.num_outputs)


def _check_head_names(heads: Sequence[HeadSpec]) -> None:
    names = [spec.name for spec in heads]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise InvalidParameterError(f"head name(s) declared more than once: {', '.join(duplicates)}")
    for name in names:
        if not name or "." in name:  # nn.ModuleDict keys become parameter-name segments
            raise InvalidParameterError(f"head name {name!r} must be non-empty and contain no '.'")


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

    def __init__(self, config: TransformerConfig, heads: Sequence[HeadSpec], generator: torch.Generator):
        super().__init__()
        _check_head_names(heads)
        self.config = config
        self.hidden_size = config.hidden_size
        # Build on the meta device: layer constructors would otherwise draw their own init from the
        # global RNG (a side effect, and bert-base would be initialised twice).
        with torch.device("meta"):
            self.backbone = Backbone(config)
            self.heads = nn.ModuleDict({spec.name: build_head(spec, config) for spec in heads})
        self.to_empty(device="cpu")
        self.float()
        # Tie after to_empty: moving off meta creates a fresh Parameter per module and would untie.
        for head in self.heads.values():
            if isinstance(head, LMHead):
                head.decoder.weight = self.backbone.token_embedding.weight
        init_weights(self, generator)

    def encode(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
    ) -> torch.Tensor:
        """Hidden states ``[B, T, H]`` for ``input_ids`` ``[B, T]`` long, ``attention_mask``
        ``[B, T, T]`` bool (True: query ``i`` may attend key ``j``) and ``position_ids`` ``[B, T]``."""
        return self.backbone(input_ids, attention_mask, position_ids)

    forward = encode


@torch.no_grad()
def init_weights(model: nn.Module, generator: torch.Generator) -> None:
    """BERT's init from ``generator``: normal(0, 0.02) weights, zero biases, LayerNorm ones/zeros.

    Modules are visited in registration order and a shared Parameter only once, so the draws (and
    hence the weights) depend on nothing but the architecture and the generator state.
    """
    seen: set[int] = set()
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            if id(param) in seen:
                continue
            seen.add(id(param))
            if isinstance(module, nn.LayerNorm):
                param.fill_(1.0 if name == "weight" else 0.0)
            elif name == "bias":
                param.zero_()
            else:
                param.normal_(0.0, 0.02, generator=generator)


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
