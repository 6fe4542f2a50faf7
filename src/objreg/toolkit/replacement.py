"""BERT's 80/10/10 replacement of selected positions, shared by every masking objective.

Random replacements are ordinary tokens only: Hugging Face and google-research/bert can draw
special ids there; fairseq cannot, nor can this.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from objreg.core.errors import DataError, InvalidParameterError
from objreg.core.types import Param, Vocabulary


def replacement_params() -> tuple[Param, ...]:
    """The 80/10/10 parameters, declared identically by every masking objective."""
    return (
        Param("mask_replace_prob", 0.8, "Share of the selected tokens replaced by [MASK].", float, 0.0, 1.0),
        Param(
            "random_replace_prob", 0.1, "Share of the selected tokens replaced by a random ordinary token; the "
            "rest stay unchanged. mask_replace_prob + random_replace_prob must be at most 1.", float, 0.0, 1.0,
        ),
    )


def check_replacement(params: Mapping[str, Any], owner: str) -> None:
    """``mask_replace_prob + random_replace_prob <= 1`` (each is bounds-checked by its Param)."""
    total = params["mask_replace_prob"] + params["random_replace_prob"]
    if total > 1 + 1e-9:
        raise InvalidParameterError(
            f"{owner}: mask_replace_prob ({params['mask_replace_prob']}) + random_replace_prob "
            f"({params['random_replace_prob']}) = {total:g} must be at most 1 (the rest of the selected "
            f"tokens stay unchanged)"
        )


_ORDINARY_IDS: dict[tuple[int, tuple[int, ...], str], torch.Tensor] = {}


def ordinary_ids(vocab: Vocabulary, device: torch.device | str | None = None) -> torch.Tensor:
    """The ids that are not special, ``[V_ordinary]`` long. Cached per vocabulary layout and
    device, since every corruption asks for it: treat the result as read-only."""
    key = (vocab.size, vocab.special_ids, str(torch.device(device or "cpu")))
    ids = _ORDINARY_IDS.get(key)
    if ids is None:
        ids = torch.nonzero(vocab.normal_token_weights(device) > 0).flatten()
        if len(ids) == 0:
            raise DataError("the vocabulary has no ordinary token to draw random replacements from")
        if len(_ORDINARY_IDS) >= 32:
            _ORDINARY_IDS.clear()
        _ORDINARY_IDS[key] = ids
    return ids


def replace_selected(
    ids: torch.Tensor,
    selected: torch.Tensor,
    fate: torch.Tensor,
    generator: torch.Generator,
    params: Mapping[str, Any],
    vocab: Vocabulary,
) -> torch.Tensor:
    """BERT's 80/10/10 (``mask_replace_prob`` / ``random_replace_prob`` / the rest kept) among the
    ``selected`` positions. ``fate`` ``[B, T]`` in [0, 1) decides each position: draw it per token,
    or spread one draw per word or span. ``ids`` is not modified."""
    p_mask, p_random = params["mask_replace_prob"], params["random_replace_prob"]
    out = torch.where(selected & (fate < p_mask), vocab.mask_id, ids)
    if p_random > 0:
        to_random = selected & (fate >= p_mask) & (fate < p_mask + p_random)
        pool = ordinary_ids(vocab, generator.device)
        picks = torch.randint(len(pool), tuple(ids.shape), generator=generator, device=generator.device)
        low = int(pool[0])
        if int(pool[-1]) - low + 1 == len(pool):  # ordinary ids are one range (the usual layout): no lookup
            drawn = picks.add_(low)
        else:
            drawn = pool.index_select(0, picks.flatten()).view(picks.shape)  # a flat lookup: a third of pool[picks]
        out = torch.where(to_random, drawn.to(ids.device), out)
    return out


