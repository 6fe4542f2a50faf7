"""Replaced-token detection (ELECTRA): a small generator fills in masked tokens, the backbone
(the discriminator) tells original tokens from replaced ones at every position.

Corruption (as ``pretrain_helpers.mask`` in google-research/electra): ``max(1, round(n ×
mask_prob))`` of a row's ``n`` ordinary tokens are selected uniformly without replacement (special
tokens and padding never are); ``mask_replace_prob`` (ELECTRA: 85%) of them become ``[MASK]`` in
the generator's input, the rest stay as they are.

Loss, per row: the generator (a ``generator`` head: a Transformer 1/4 the backbone's width on the
backbone's shared token and position embeddings, ELECTRA-small's ``generator_hidden_size=0.25``)
predicts the selected tokens (MLM, mean over the row's selected positions). A token is sampled
from its softmax at every selected position; the backbone encodes the row with the samples in
place (a second pass, ``outputs.model.encode``) and a ``token_classifier`` head scores every real
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

Written exactly like a third-party plugin: it imports only ``objreg`` and ``torch``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

import objreg
from objreg import IGNORE_INDEX, masks

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
    )


@objreg.hookimpl
def objreg_corrupt(
    batch: objreg.TokenBatch, generator: torch.Generator, params: Mapping[str, Any], vocab: objreg.Vocabulary
) -> objreg.CorruptedBatch:
    ids, device = batch.input_ids, batch.input_ids.device
    B = ids.shape[0]
    selected = _select(batch, generator, params["mask_prob"])  # (B, T) bool
    to_mask = selected & (objreg.uniform(tuple(ids.shape), generator, device) < params["mask_replace_prob"])
    positions, weights = _selection_lists(selected)  # (B, K), (B, K)
    noise = objreg.uniform(tuple(positions.shape), generator, device)  # (B, K): one draw per sample
    hard = bool(params["hard_negatives"])
    if hard and int(vocab.normal_token_weights().sum()) < 2:
        raise objreg.DataError("rtd: hard_negatives needs at least 2 ordinary tokens in the vocabulary")
    scale = (1.0 + params["hard_negative_beta"] if hard else 1.0) / params["temperature"]

    def per_row(value: float, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        # Settings travel to the loss as per-row tensors (the loss hook sees only outputs and batch);
        # float64, cast to the model's dtype there.
        return torch.full((B,), value, dtype=dtype, device=device)

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
            "special_ids": vocab.special_id_tensor(device).expand(B, -1).clone(),  # never sampled
            "sampling_scale": per_row(scale),
            "exclude_original": per_row(hard, torch.bool),
            "generator_weight": per_row(params["generator_weight"]),
            "discriminator_weight": per_row(params["discriminator_weight"]),
        },
    )


@objreg.hookimpl
def objreg_attention_mask(batch: objreg.CorruptedBatch) -> torch.Tensor:
    return masks.bidirectional(batch.is_padding) & masks.same_document(batch.document_ids)  # (B, T, T)


@objreg.hookimpl
def objreg_loss(outputs: objreg.ModelOutputs, batch: objreg.CorruptedBatch) -> torch.Tensor:
    parts = loss_parts(outputs, batch)
    dtype = parts["generator"].dtype
    return (batch.extras["generator_weight"].to(dtype) * parts["generator"]
            + batch.extras["discriminator_weight"].to(dtype) * parts["discriminator"])  # (B,)


def loss_parts(outputs: objreg.ModelOutputs, batch: objreg.CorruptedBatch) -> dict[str, torch.Tensor]:
    """The two per-row losses ``generator`` and ``discriminator`` ``[B]``, and the ``replaced``
    input ``[B, T]`` and ``is_replaced`` targets ``[B, T]`` the discriminator saw. Pure."""
    model, extras = outputs.model, batch.extras
    mask = objreg_attention_mask(batch)  # (B, T, T); the loss hook is not handed the mask
    positions = extras["masked_positions"]  # (B, K)
    real = extras["masked_weights"] > 0  # (B, K): False at list padding
    targets = batch.labels.gather(1, positions).clamp(min=0)  # (B, K); list padding -> 0, weight 0

    logits = model.heads["generator"](batch.input_ids, mask, batch.position_ids, positions)  # (B, K, V)
    weights = real.to(logits.dtype)
    nll = -torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (B, K)
    generator_loss = (nll * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1)  # (B,)

    sampled = sample_replacements(logits.detach(), targets, extras)  # (B, K): no gradient path
    current = batch.input_ids.gather(1, positions)  # (B, K)
    # List padding points at position 0 ([CLS]) and writes back what is there.
    replaced = batch.input_ids.scatter(1, positions, torch.where(real, sampled, current))  # (B, T)
    is_fake = torch.zeros_like(batch.is_padding).scatter(1, positions, real & (sampled != targets))  # (B, T)

    hidden = model.encode(replaced, mask, batch.position_ids)  # (B, T, H): the discriminator's pass
    scores = model.heads["discriminator"](hidden).squeeze(-1)  # (B, T)
    # Sigmoid cross-entropy, softplus(x) - y·x, over every real token.
    bce = F.softplus(scores) - is_fake.to(scores.dtype) * scores  # (B, T)
    tokens = (~batch.is_padding).to(scores.dtype)  # (B, T)
    discriminator_loss = (bce * tokens).sum(dim=1) / tokens.sum(dim=1).clamp(min=1)  # (B,)
    return {"generator": generator_loss, "discriminator": discriminator_loss, "replaced": replaced,
            "is_replaced": is_fake}


def sample_replacements(
    logits: torch.Tensor, targets: torch.Tensor, extras: Mapping[str, torch.Tensor]
) -> torch.Tensor:
    """One token per selected position, ``[B, K]`` long, from the generator's ``logits``
    ``[B, K, V]``: ``softmax(logits × sampling_scale)`` without special tokens (and without the
    original ``targets`` token when ``exclude_original``), drawn by inverting its CDF at
    ``sample_noise``. Deterministic and pure."""
    B, K, V = logits.shape
    vocabulary = torch.arange(V, device=logits.device)
    allowed = torch.ones(B, V, dtype=torch.bool, device=logits.device).scatter(
        1, extras["special_ids"], torch.zeros_like(extras["special_ids"], dtype=torch.bool))  # (B, V)
    original = (vocabulary == targets.unsqueeze(-1)) & extras["exclude_original"][:, None, None]  # (B, K, V)
    scaled = logits * extras["sampling_scale"].to(logits.dtype)[:, None, None]
    scaled = torch.where(allowed[:, None, :] & ~original, scaled, float("-inf"))
    cdf = torch.softmax(scaled, dim=-1).cumsum(dim=-1)  # (B, K, V)
    # Scaling by the last entry keeps u below it, so the index lands on a token of non-zero
    # probability even when rounding leaves the CDF short of 1.
    u = extras["sample_noise"].to(logits.dtype) * cdf[..., -1]  # (B, K)
    return (cdf <= u.unsqueeze(-1)).sum(dim=-1)  # (B, K): first index whose CDF exceeds u


# -- corruption steps ---------------------------------------------------------------------------


def _select(batch: objreg.TokenBatch, generator: torch.Generator, mask_prob: float) -> torch.Tensor:
    """ELECTRA's count: ``max(1, round(n × mask_prob))`` of a row's ``n`` ordinary tokens, chosen
    uniformly without replacement as the smallest of random keys."""
    B, T = batch.input_ids.shape
    device = batch.input_ids.device
    maskable = ~(batch.is_special | batch.is_padding)  # (B, T)
    n = maskable.sum(dim=1)  # (B,)
    count = torch.where(n > 0, torch.round(n * mask_prob).long().clamp(min=1), 0)  # (B,)
    keys = torch.where(maskable, objreg.uniform((B, T), generator, device), 2.0)  # (B, T)
    rank = keys.argsort(dim=1).argsort(dim=1)  # (B, T): rank of each key within its row
    return (rank < count[:, None]) & maskable


def _selection_lists(selected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Selected positions as fixed-size lists: ``positions`` [B, K] long (ascending, padded with
    0) and ``weights`` [B, K] float (1.0 real, 0.0 padding), K = most selections in a row (>= 1)."""
    B, T = selected.shape
    count = selected.sum(dim=1)  # (B,)
    K = max(1, int(count.max())) if B else 1
    index = torch.arange(T, device=selected.device).expand(B, T)
    order = torch.where(selected, index, index + T).argsort(dim=1)[:, :K]  # (B, K): selected first, in order
    real = torch.arange(K, device=selected.device)[None, :] < count[:, None]  # (B, K)
    return torch.where(real, order, 0), real.float()
