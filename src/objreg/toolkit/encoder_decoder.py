"""The ``[source ; target]`` rows of :mod:`objreg.toolkit.seq2seq` on a real encoder-decoder.

An encoder-decoder objective (``t5``, ``bart``, ``ul2``, ``prefix_lm``) lays each row out as its
source followed by its target, with a prefix mask: bidirectional over the source, causal over the
target. On one shared stack that row runs as a prefix LM. On an encoder-decoder model it is split
back (:func:`split`): the source goes to the encoder, the target, shifted right behind the model's
decoder start token, to the decoder, which attends to the encoded source. :func:`merge` puts the
decoder's states where the prefix-LM layout has the states that predict the target: row position
``L - 1 + k`` (``L`` the source length) holds the decoder's state at step ``k``, which has read
the start token and the target's first ``k`` tokens and predicts target token ``k``. So the
objectives' losses (``seq2seq_loss``) read an encoder-decoder exactly as they read a prefix LM.

A row whose mask is bidirectional (no target: ``mlm``, the downstream tasks) runs on the encoder
alone. Everything has fixed shapes (gathers of width ``T``), so it is safe under ``vmap``,
``jvp`` and double backward. The source length is read from the dense mask: query 0 of a prefix
row attends exactly the source.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class Split(NamedTuple):
    """The inputs of one encoder-decoder pass, all of width ``T``.

    Attributes:
        encoder_mask: ``[B, T, T]`` bool: every query attends the source keys (``j < L``); a
            row with no target keeps its own (bidirectional) mask.
        decoder_ids: ``[B, T]`` long: the start token, then the target shifted right.
        decoder_mask: ``[B, T, T]`` bool: causal over the ``target_length + 1`` real steps.
        cross_mask: ``[B, T, T]`` bool: decoder step ``k`` attends encoder key ``j < L``.
        source_length: ``[B]``: ``L``.
        uses_decoder: ``[B, T]`` bool: row positions whose state comes from the decoder.
    """

    encoder_mask: torch.Tensor
    decoder_ids: torch.Tensor
    decoder_mask: torch.Tensor
    cross_mask: torch.Tensor
    source_length: torch.Tensor
    uses_decoder: torch.Tensor


def split(input_ids: torch.Tensor, mask: torch.Tensor, start_id: int) -> Split:
    """The encoder and decoder inputs of ``[source ; target]`` rows (``input_ids`` ``[B, T]``) with
    their dense prefix ``mask`` ``[B, T, T]`` (bidirectional rows: the encoder alone)."""
    B, T = input_ids.shape
    positions = torch.arange(T, device=input_ids.device)
    total = mask.any(dim=1).sum(dim=1)  # (B,): real tokens (every real key is seen by someone)
    source = mask[:, 0, :].sum(dim=1)  # (B,): query 0 of a prefix row sees exactly the source
    last_query = mask.gather(1, (total - 1).clamp(min=0)[:, None, None].expand(B, 1, T))[:, 0]  # (B, T)
    # A prefix row's last token sees the whole row; a row of several documents, bidirectional in
    # each, is no prefix row although its first token sees only the first document.
    has_target = (source < total) & (last_query.sum(dim=1) == total)  # (B,)
    steps = torch.where(has_target, total - source + 1, 0)  # (B,): start + target, less the last token's successor
    # Decoder step k reads row position L - 1 + k (the start token at k = 0).
    read = (source[:, None] - 1 + positions[None, :]).clamp(0, T - 1)  # (B, T)
    decoder_ids = input_ids.gather(1, read)
    decoder_ids = torch.where(positions[None, :] == 0, torch.full_like(decoder_ids, start_id), decoder_ids)
    real_step = positions[None, :] < steps[:, None]  # (B, T) over decoder steps
    lower = torch.ones(T, T, dtype=torch.bool, device=input_ids.device).tril()
    decoder_mask = lower[None] & real_step[:, None, :]
    in_source = positions[None, :] < source[:, None]  # (B, T) over keys
    cross_mask = in_source[:, None, :].expand(B, T, T)
    encoder_mask = torch.where(has_target[:, None, None], cross_mask, mask)  # bidirectional rows: as given
    uses_decoder = has_target[:, None] & (positions[None, :] >= (source - 1)[:, None])
    return Split(encoder_mask, decoder_ids, decoder_mask, cross_mask, source, uses_decoder)


def merge(encoder_states: torch.Tensor, decoder_states: torch.Tensor, parts: Split) -> torch.Tensor:
    """Hidden states ``[B, T, H]`` in the prefix-LM layout: the decoder's step ``p - (L - 1)`` at
    the positions it predicts from, the encoder's elsewhere."""
    T, H = encoder_states.shape[1], encoder_states.shape[2]
    positions = torch.arange(T, device=encoder_states.device)
    step = (positions[None, :] - (parts.source_length - 1)[:, None]).clamp(0, T - 1)  # (B, T)
    from_decoder = decoder_states.gather(1, step[:, :, None].expand(-1, -1, H))
    return torch.where(parts.uses_decoder[:, :, None], from_decoder, encoder_states)
