"""Random numbers for ``objreg_corrupt``, the only hook allowed randomness, and the named
streams the analysis and the experiments seed their generators from.

One run seed feeds several independent streams (training rows, their corruption, a held-out
batch…), so that drawing more from one never shifts another. Each stream is a name in
:data:`STREAMS`; :func:`stream` gives its generator, seeded ``seed * 7919 + number`` (7919, a prime above every
number below, keeps the streams of different seeds apart):

====================================  ======  ==============================================================
name                                  number  what it feeds
====================================  ======  ==============================================================
``data``                              1       training rows (the analyzer's loop, experiments' training loops)
``corruption``                        2       the corruption of training rows
``heldout_rows``                      3       the held-out rows an experiment measures every model on
``char_noise``                        3       ``objreg analyze --char-noise`` on the pre-training text
``heldout_corruption``                4       the corruption of those held-out rows
``second_heldout_corruption``         5       a second objective's corruption of the same held-out rows
``replacements``                      5       hard negatives' replacement tokens
``new_weights``                       5       weights an experiment adds to a model (an untied LM head, a projector)
``permutations``                      5       the Shapley split's sampled permutations of many objectives
``misspellings``                      6       character noise of the noise-robustness experiment
``random_tokens``                     6       tokens drawn at random to compare gradients with
``resolution``                        7       the direction along which a probe measures ``D``'s resolution
``paired_rows``                       11      the rows every condition of the span-length experiment shares
``downstream_head``                   12      the downstream task's head under ``--downstream-head refit``
``moment_rounding``                   13      stochastic rounding of bfloat16 Adam coalition moments
``screen_random_order``               20      ``objreg screen``'s random-order baseline
``entropy_heldout_corruption``        30      entropy-masking's held-out masks drawn by the entropy policy
``finetune``                          40      a fine-tune's batch order (``objreg finetune``; the SST-2 fine-tune's head init too)
``finetune_split``                    41      ``objreg finetune``'s cross-validation folds
``data_split``                        42      ``objreg split``: a task file's training and held-out rows
``collapse_views``                    45      consistency-collapse's split of each training row into its two views
``screen_mixtures``                   46      screen-validity's drawn mixtures (of seed 0: one list for every seed)
``screen_validity_bootstrap``         47      screen-validity's bootstrap over candidates and seeds
====================================  ======  ==============================================================

Names sharing a number are never drawn together in one run: each reads right where it is used,
and the numbers are those the recorded results were computed with.
"""

from __future__ import annotations

import torch

from objreg.core.errors import InvalidParameterError

#: Stream name → its number (the table above).
STREAMS: dict[str, int] = {
    "data": 1,
    "corruption": 2,
    "heldout_rows": 3,
    "char_noise": 3,
    "heldout_corruption": 4,
    "second_heldout_corruption": 5,
    "replacements": 5,
    "new_weights": 5,
    "permutations": 5,
    "misspellings": 6,
    "random_tokens": 6,
    "resolution": 7,
    "paired_rows": 11,
    "downstream_head": 12,
    "moment_rounding": 13,
    "screen_random_order": 20,
    "entropy_heldout_corruption": 30,
    "finetune": 40,
    "finetune_split": 41,
    "data_split": 42,
    "collapse_views": 45,
    "screen_mixtures": 46,
    "screen_validity_bootstrap": 47,
}


def stream_seed(seed: int, name: str) -> int:
    """The seed of stream ``name`` of run seed ``seed``: ``seed * 7919 + STREAMS[name]``."""
    if name not in STREAMS:
        raise InvalidParameterError(f"unknown random stream {name!r}; the streams are {', '.join(STREAMS)}")
    return seed * 7919 + STREAMS[name]


def stream(seed: int, name: str) -> torch.Generator:
    """A fresh CPU generator for stream ``name`` of run seed ``seed`` (:func:`stream_seed`)."""
    return torch.Generator().manual_seed(stream_seed(seed, name))


def uniform(shape: tuple[int, ...], generator: torch.Generator, device: torch.device | str | None = None) -> torch.Tensor:
    """U[0, 1) of ``shape`` drawn from ``generator`` on the generator's own device, then moved to
    ``device``: a CPU generator can drive a batch on any device, and the same seed gives the same
    corruption on CPU and GPU."""
    values = torch.rand(shape, generator=generator, device=generator.device)
    return values if device is None else values.to(device)
