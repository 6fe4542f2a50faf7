"""Replaced-token detection (ELECTRA): a small generator fills in masked tokens, the backbone
(the discriminator) tells original tokens from replaced ones at every position.

Corruption (as ``pretrain_helpers.mask`` in google-research/electra): ``max(1, round(n ×
mask_prob))`` of a row's ``n`` ordinary tokens are selected uniformly without replacement (special
tokens and padding never are); ``mask_replace_prob`` (ELECTRA: 85%) of them become ``[MASK]`` in
the generator's input, the rest stay as they are.

Loss, per row: the generator (a ``generator`` head, a kind this plugin registers: a Transformer
1/4 the backbone's width on the backbone's shared token and position embeddings, ELECTRA-small's
``generator_hidden_size=0.25``, built the same way on every backbone) predicts the selected
tokens (MLM, mean over the row's selected positions). A token is sampled from its softmax at every
selected position; the backbone encodes the row with the samples in place (the objective runs the
backbone itself, ``runs_backbone``: the host's pass on the masked input would be unused) and a
``token_classifier`` head scores every real
token, ``[CLS]``/``[SEP]`` included as in ELECTRA (its ``input_mask``), as replaced or original
(sigmoid cross-entropy, mean over the row). A sample equal to the original token counts as
original (ELECTRA's ``is_fake = masked & (sampled != original)``). The loss is
``generator_weight × MLM + discriminator_weight × discriminator`` (ELECTRA: 1 and 50).

No gradient flows from the discriminator into the generator: the sample is a discrete token
(ELECTRA stops the gradient explicitly); the generator learns from its MLM loss alone. The
shared embeddings get gradients from both, as in ELECTRA.

Randomness: the loss must be a deterministic function of (parameters, batch), so corruption
draws one uniform number per selected position (``sample_noise``) and the loss samples by
inverting the CDF of the generator's distribution at it, an exact draw of the categorical that
needs ``[B, K]`` numbers instead of ELECTRA's ``[B, K, V]`` Gumbel noise. Special tokens are never
sampled (ELECTRA's generator can emit ``[CLS]``, ``[SEP]`` or ``[MASK]`` as "replacements").

Hard negatives (``hard_negatives=true``): replacements are drawn from the generator's
distribution tilted toward the tokens it finds most plausible in context, ``q(w) ∝
p_G(w)^(1 + hard_negative_beta)`` over ``w ≠`` the original token. This is the hard-negative
sampler of Robinson et al. 2021 (``q_β(x⁻) ∝ exp(β·s(x, x⁻))·p(x⁻)``) with the generator's
log-probability as the similarity ``s``; excluding the original (ELECTRA's ``disallow_correct``)
removes the one false negative. Plausible-in-context replacements are the ones closest to the
real token and the hardest to detect.

Written exactly like a third-party plugin: it imports only ``objreg``, its toolkit and ``torch``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import objreg
from objreg import IGNORE_INDEX, masks
from objreg.toolkit import losses, masked_lm, selection
from objreg.toolkit.layers import Block, TransformerConfig, check_inputs, prepare_attention

#: The backbone's width divided by the generator's: ELECTRA-small's generator_hidden_size=0.25.
GENERATOR_DIVISOR = 4


@objreg.hookimpl
def objreg_objective_info() -> objreg.ObjectiveInfo:
    return objreg.ObjectiveInfo(
        name="rtd",
        description="Replaced-token detection (ELECTRA): a small MLM generator replaces tokens, the "
        "backbone detects them.",
        kind="pretrain",
        attention="bidirectional",
        heads=(
            objreg.HeadSpec("generator", "generator", GENERATOR_DIVISOR),
            objreg.HeadSpec("discriminator", "token_classifier", 1),
        ),
        params=(
            objreg.Param(
                "mask_prob", 0.15, "Share of each row's ordinary tokens the generator predicts and replaces "
                "(max(1, round(n × mask_prob)) per row; ELECTRA-large uses 0.25).", float, 0.0, 1.0,
            ),
            objreg.Param(
                "mask_replace_prob", 0.85, "Share of the selected tokens shown to the generator as [MASK]; "
                "the rest stay unchanged.", float, 0.0, 1.0,
            ),
            objreg.Param("generator_weight", 1.0, "Weight of the generator's MLM loss.", float, 0.0, None),
            objreg.Param(
                "discriminator_weight", 50.0, "Weight of the discriminator's replaced-token loss.", float, 0.0, None,
            ),
            objreg.Param(
                "temperature", 1.0, "Temperature of the generator's softmax when sampling replacements.",
                float, 1e-3, None,
            ),
            objreg.Param(
                "discriminator_positions", "all", "Tokens the discriminator's loss averages over: every real "
                "token ('all', ELECTRA) or only the selected ones ('selected', the ELECTRA 15% ablation of "
                "Clark et al. 2020, table 5).", str, choices=("all", "selected"),
            ),
            objreg.Param(
                "hard_negatives", False, "Sample harder replacements: never the original token, and drawn "
                "from p_G^(1 + hard_negative_beta), concentrated on tokens the generator finds plausible.", bool,
            ),
            objreg.Param(
                "hard_negative_beta", 1.0, "Concentration β of the hard-negative sampler (0: the generator's "
                "own distribution without the original token). Used only with hard_negatives.", float, 0.0, None,
            ),
        ),
        references=(
            "Clark et al. 2020, ELECTRA: Pre-training Text Encoders as Discriminators Rather Than Generators",
            "google-research/electra configure_pretraining.py (mask_prob 0.15, gen_weight 1, disc_weight 50, "
            "generator_hidden_size 0.25, temperature 1), pretrain/pretrain_helpers.py (mask: 85% [MASK])",
            "Robinson et al. 2021, Contrastive Learning with Hard Negative Samples (q_β ∝ exp(β·s)·p)",
        ),
        min_seq_len=3,
        runs_backbone=True,
    )


@objreg.hookimpl
def objreg_register_heads(register: Callable[[objreg.HeadKind], None]) -> None:
    register(objreg.HeadKind(
        "generator", "ELECTRA's generator: a small Transformer (width H / num_outputs) on the backbone's "
        "embeddings with a tied MLM output: (input_ids, mask, position_ids, positions [B, K]) -> [B, K, V]",
        lambda spec, backbone: GeneratorHead(backbone, spec.num_outputs), needs_outputs=True,
    ))


@objreg.hookimpl
def objreg_check_params(vocab: objreg.Vocabulary | None) -> None:
    masked_lm.require_mask_token(vocab, "rtd")  # before the model loads, with the fix


@objreg.hookimpl
def objreg_corrupt(
    batch: objreg.TokenBatch, generator: torch.Generator, params: Mapping[str, Any], vocab: objreg.Vocabulary
) -> objreg.CorruptedBatch:
    ids, device = batch.input_ids, batch.input_ids.device
    selected = _select(batch, generator, params["mask_prob"])  # (B, T) bool
    to_mask = selected & (objreg.uniform(tuple(ids.shape), generator, device) < params["mask_replace_prob"])
    positions, weights = selection.selection_lists(selected)  # (B, K), (B, K)
    noise = objreg.uniform(tuple(positions.shape), generator, device)  # (B, K): one draw per sample
    if params["hard_negatives"] and int(vocab.normal_token_weights().sum()) < 2:
        raise objreg.DataError("rtd: hard_negatives needs at least 2 ordinary tokens in the vocabulary")
    return objreg.CorruptedBatch(
        input_ids=torch.where(to_mask, vocab.mask_id, ids),
        labels=torch.where(selected, ids, IGNORE_INDEX),
        is_padding=batch.is_padding.clone(),
        position_ids=masks.positions_within_documents(batch.document_ids),
        document_ids=batch.document_ids.clone(),
        extras={
            "masked_positions": positions,
            "masked_weights": weights,
            "sample_noise": noise,
        },
    )


@objreg.hookimpl
def objreg_loss(
    outputs: objreg.ModelOutputs, batch: objreg.CorruptedBatch, params: Mapping[str, Any], mask: torch.Tensor,
    vocab: objreg.Vocabulary,
) -> torch.Tensor:
    parts = loss_parts(outputs.model, batch, params, mask, vocab)
    return params["generator_weight"] * parts["generator"] + params["discriminator_weight"] * parts["discriminator"]


def loss_parts(
    model: objreg.Model, batch: objreg.CorruptedBatch, params: Mapping[str, Any], mask: torch.Tensor,
    vocab: objreg.Vocabulary,
) -> dict[str, torch.Tensor]:
    """The two per-row losses ``generator`` and ``discriminator`` ``[B]``, and the ``replaced``
    input ``[B, T]`` and ``is_replaced`` targets ``[B, T]`` the discriminator saw. Pure."""
    extras = batch.extras
    positions = extras["masked_positions"]  # (B, K)
    real = extras["masked_weights"] > 0  # (B, K): False at list padding
    targets = batch.labels.gather(1, positions).clamp(min=0)  # (B, K); list padding -> 0, weight 0

    logits = model.heads["generator"](batch.input_ids, mask, batch.position_ids, positions)  # (B, K, V)
    generator_loss = losses.weighted_mean(losses.smoothed_nll(logits, targets), real)  # (B,)

    sampled = sample_replacements(logits.detach(), targets, extras["sample_noise"], params, vocab)  # (B, K)
    current = batch.input_ids.gather(1, positions)  # (B, K)
    # List padding points at position 0 ([CLS]) and writes back what is there.
    replaced = batch.input_ids.scatter(1, positions, torch.where(real, sampled, current))  # (B, T)
    is_fake = torch.zeros_like(batch.is_padding).scatter(1, positions, real & (sampled != targets))  # (B, T)

    hidden = model.encode(replaced, mask, batch.position_ids)  # (B, T, H): the discriminator's pass
    scores = model.heads["discriminator"](hidden).squeeze(-1)  # (B, T)
    # Sigmoid cross-entropy, softplus(x) - y·x, over every real token.
    bce = F.softplus(scores) - is_fake.to(scores.dtype) * scores  # (B, T)
    if params["discriminator_positions"] == "selected":
        counted = torch.zeros_like(batch.is_padding).scatter(1, positions, real)  # (B, T)
    else:
        counted = ~batch.is_padding
    discriminator_loss = losses.weighted_mean(bce, counted)  # (B,)
    return {"generator": generator_loss, "discriminator": discriminator_loss, "replaced": replaced,
            "is_replaced": is_fake}


def sample_replacements(
    logits: torch.Tensor, targets: torch.Tensor, noise: torch.Tensor, params: Mapping[str, Any],
    vocab: objreg.Vocabulary,
) -> torch.Tensor:
    """One token per selected position, ``[B, K]`` long, from the generator's ``logits``
    ``[B, K, V]``: ``softmax(logits × scale)`` without special tokens (and without the original
    ``targets`` token with ``hard_negatives``), drawn by inverting its CDF at ``noise`` ``[B, K]``;
    ``scale = (1 + hard_negative_beta if hard_negatives else 1) / temperature``. Deterministic
    and pure."""
    hard = bool(params["hard_negatives"])
    scale = (1.0 + params["hard_negative_beta"] if hard else 1.0) / params["temperature"]
    B, K, V = logits.shape
    vocabulary = torch.arange(V, device=logits.device)
    allowed = vocab.normal_token_weights(logits.device) > 0  # (V,): never a special token
    original = (vocabulary == targets.unsqueeze(-1)) & hard  # (B, K, V)
    scaled = logits * scale
    scaled = torch.where(allowed & ~original, scaled, float("-inf"))
    cdf = torch.softmax(scaled, dim=-1).cumsum(dim=-1)  # (B, K, V)
    # Scaling by the last entry keeps u below it, so the index lands on a token of non-zero
    # probability even when rounding leaves the CDF short of 1.
    u = noise.to(logits.dtype) * cdf[..., -1]  # (B, K)
    return (cdf <= u.unsqueeze(-1)).sum(dim=-1)  # (B, K): first index whose CDF exceeds u


# -- corruption steps ---------------------------------------------------------------------------


def _select(batch: objreg.TokenBatch, generator: torch.Generator, mask_prob: float) -> torch.Tensor:
    """ELECTRA's count: ``max(1, round(n × mask_prob))`` of a row's ``n`` ordinary tokens, chosen
    uniformly without replacement as the smallest of random keys."""
    B, T = batch.input_ids.shape
    device = batch.input_ids.device
    can = selection.maskable(batch)  # (B, T)
    n = can.sum(dim=1)  # (B,)
    count = torch.where(n > 0, torch.round(n * mask_prob).long().clamp(min=1), 0)  # (B,)
    keys = torch.where(can, objreg.uniform((B, T), generator, device), 2.0)  # (B, T)
    return selection.smallest_keys(keys, count) & can  # the count smallest keys, as their argsort ranks them


# -- the generator head -------------------------------------------------------------------------


class GeneratorHead(nn.Module):
    """ELECTRA's generator: a small Transformer on the backbone's token (and, where it has them,
    position) embeddings with an MLM output tied to the token embeddings; the same on every backbone.

    Sized as ``get_generator_config`` in google-research/electra: width ``hidden_size // divisor``
    (ELECTRA-small 1/4, base 1/3), as many layers as the backbone, ``max(1, width // 64)`` heads,
    FFN ``4 × width``. The shared ``H``-wide embeddings are projected to the width (ELECTRA's
    ``embeddings_project``) and the output goes back to ``H`` before the tied decoder (its
    ``dense`` to ``embedding_size``). :meth:`tie` shares the backbone's Parameters, so only the
    projection, blocks, norms and biases belong to the head (and the position embedding, for a
    backbone without learned positions).

    ``forward(input_ids [B, T], attention_mask [B, T, T], position_ids [B, T], positions [B, K])``
    returns MLM logits ``[B, K, V]`` at ``positions`` only.
    """

    def __init__(self, backbone: objreg.Backbone, divisor: int):
        super().__init__()
        H, V = backbone.hidden_size, backbone.vocab_size
        width = max(1, H // divisor)
        num_heads = max(1, width // 64)
        width -= width % num_heads  # the heads must divide the width
        self.max_positions = backbone.max_positions or 512
        small = TransformerConfig(
            vocab_size=V, hidden_size=width, num_layers=backbone.num_layers, num_heads=num_heads,
            intermediate_size=4 * width, max_positions=self.max_positions, layer_norm_eps=backbone.layer_norm_eps,
        )
        self.token_embedding = nn.Embedding(V, H)
        self.position_embedding = nn.Embedding(self.max_positions, H)
        self.project_in = nn.Linear(H, width)
        self.blocks = nn.ModuleList(Block(small) for _ in range(backbone.num_layers))
        self.final_norm = nn.LayerNorm(width, eps=backbone.layer_norm_eps)
        self.dense = nn.Linear(width, H)
        self.norm = nn.LayerNorm(H, eps=backbone.layer_norm_eps)
        self.decoder = nn.Linear(H, V)

    def tie(self, backbone: objreg.Backbone) -> None:
        """Share the backbone's token and position embeddings (input and tied output), as ELECTRA does."""
        self.token_embedding.weight = backbone.input_embeddings()
        self.decoder.weight = backbone.input_embeddings()
        positions = backbone.position_embeddings()
        if positions is not None and positions.shape[1] == self.position_embedding.weight.shape[1]:
            self.position_embedding.weight = positions
            self.max_positions = positions.shape[0]

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
        positions: torch.Tensor,
    ) -> torch.Tensor:
        check_inputs(input_ids, attention_mask, position_ids, self.max_positions)
        x = self.token_embedding(input_ids) + self.position_embedding(position_ids)  # (B, T, H)
        x = self.project_in(x)  # (B, T, h)
        bias = prepare_attention(attention_mask, x.dtype)  # once, not once per layer (dense or structured)
        for block in self.blocks:
            x = block(x, bias)  # (B, T, h)
        x = self.final_norm(x)
        picked = losses.gather_positions(x, positions)  # (B, K, h)
        return self.decoder(self.norm(F.gelu(self.dense(picked))))  # (B, K, V)
