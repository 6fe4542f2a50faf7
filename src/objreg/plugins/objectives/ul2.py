"""UL2 mixture of denoisers: each row is corrupted by one of several R/X/S denoisers, announced by
a mode token.

* R (regular) and X (extreme) denoisers are T5 span corruption with mean span length ``μ`` and
  noise density ``r`` (:mod:`objreg.toolkit.seq2seq`, shared with ``t5``); R rows start with ``[NLU]``, X rows
  with ``[NLG]``. Rows with more spans than the vocabulary has sentinels reuse them in turn, as ``t5``.
* The S (sequential) denoiser is a prefix LM whose continuation holds about ``r`` of the text (T5's
  ``random_prefix_noise_mask``, shared with ``prefix_lm``); its rows start with ``[S2S]``.

Each row draws its denoiser from the generator with probability proportional to its weight
(``tf.data.experimental.sample_from_datasets`` in the paper's appendix code). Default mixture, as
the objectives survey records it (UL2 paper; community reproductions): R(3, 0.15), R(8, 0.15),
X(3, 0.5), X(8, 0.5), X(64, 0.15), X(64, 0.5) and S(0.25), with the S-denoiser at about 20%
(weights 0.13 each and 0.22, as nanoGPT-UL2 encodes "the paper says ~20% for S-denoisers"). The
paper appendix samples uniformly when no rates are given; pass equal weights for that.

All rows run on the shared backbone as a prefix LM over ``[mode ; corrupted input ; target]``:
bidirectional over the mode token and the input, causal over the target, loss on the target only.
The mode token is a real vocabulary token (``vocab.named_ids``); the paper code never published its
``prepend_prompt`` (google-research#1405, t5x#939) and NeMo reuses ``<extra_id_*>`` sentinels,
which collide with the span sentinels. ``extras["denoiser"]`` records each row's choice.

Written like a third-party plugin: it imports only ``objreg``, its toolkit and ``torch``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch

import objreg
from objreg.toolkit import seq2seq

DEFAULT_DENOISERS = "R:3:0.15, R:8:0.15, X:3:0.5, X:8:0.5, X:64:0.15, X:64:0.5, S:0.25"
DEFAULT_WEIGHTS = "0.13, 0.13, 0.13, 0.13, 0.13, 0.13, 0.22"
MODE_TOKENS = {"R": "[NLU]", "X": "[NLG]", "S": "[S2S]"}


@dataclass(frozen=True)
class Denoiser:
    """One denoiser: ``kind`` R, X or S; mean span length ``mean`` (1.0 for S, unused); ``density``
    the share of the text it hides (S: the continuation's expected share)."""

    kind: str
    mean: float
    density: float


@objreg.hookimpl
def objreg_objective_info() -> objreg.ObjectiveInfo:
    return objreg.ObjectiveInfo(
        name="ul2",
        description="UL2 mixture of denoisers: R/X span corruption and S prefix LM per row, with mode tokens.",
        kind="pretrain",
        attention="prefix",
        heads=(objreg.HeadSpec("lm", "lm"),),
        params=(
            objreg.Param(
                "denoisers", DEFAULT_DENOISERS, "Comma-separated denoisers: R:mean_span:density and "
                "X:mean_span:density (T5 span corruption; mode [NLU] / [NLG]) or S:density (prefix LM, mode "
                "[S2S]).", str,
            ),
            objreg.Param(
                "weights", DEFAULT_WEIGHTS, "Comma-separated mixing weights, one per denoiser (normalised; "
                "non-negative, not all zero).", str,
            ),
            objreg.Param(
                "mode_tokens", True, "Prepend the mode token ([NLU], [NLG], [S2S]) to each row.", bool,
            ),
        ),
        references=(
            "Tay et al. 2023, UL2: Unifying Language Learning Paradigms (mixture of denoisers, mode switching)",
            "UL2 paper appendix ul2_objective (sample_from_datasets over span-corruption and prefix-LM shards)",
            "google-research/text-to-text-transfer-transformer t5/data/preprocessors.py (span_corruption, "
            "prefix_lm)",
            "google-research/google-research#1405, google-research/t5x#939 (mode tokens, missing prepend_prompt)",
        ),
        min_seq_len=4,
    )


@objreg.hookimpl
def objreg_check_params(params: Mapping[str, Any], vocab: objreg.Vocabulary | None) -> None:
    denoisers, weights = mixture(params["denoisers"], params["weights"])
    used = [d for d, w in zip(denoisers, weights) if w > 0]
    modes = tuple(dict.fromkeys(MODE_TOKENS[d.kind] for d in used)) if params["mode_tokens"] else ()
    spans = any(d.kind != "S" and d.density > 0 for d in used)
    seq2seq.require_tokens(vocab, modes, spans, "ul2")  # before the model loads, with the fix


@objreg.hookimpl
def objreg_corrupt(
    batch: objreg.TokenBatch, generator: torch.Generator, params: Mapping[str, Any], vocab: objreg.Vocabulary
) -> objreg.CorruptedBatch:
    denoisers, weights = mixture(params["denoisers"], params["weights"])
    ids, device = batch.input_ids, batch.input_ids.device
    B = ids.shape[0]
    mix = torch.tensor(weights, dtype=torch.float64, device=generator.device)
    choice = torch.multinomial(mix, B, replacement=True, generator=generator).to(device)  # (B,): each row's denoiser
    is_sequential = torch.tensor([d.kind == "S" for d in denoisers], device=device)
    sequential = is_sequential[choice]  # (B,): S rows
    density = torch.tensor([d.density for d in denoisers], dtype=torch.float64, device=device)[choice]
    mean = torch.tensor([d.mean for d in denoisers], dtype=torch.float64, device=device)[choice]

    # R/X rows: span corruption; S rows get density 0 here, so no spans.
    corrupted = seq2seq.span_corruption_parts(batch, torch.where(sequential, 0.0, density), mean, generator, vocab,
                                              "ul2")
    prefixed = seq2seq.prefix_lm_parts(batch, density, generator, vocab.pad_id)  # S rows: prefix LM
    parts = seq2seq.choose_parts(sequential, prefixed, corrupted, vocab.pad_id)

    if params["mode_tokens"]:
        table = torch.tensor([seq2seq.named_id(vocab, MODE_TOKENS[d.kind], "ul2") for d in denoisers], device=device)
        source, source_len = seq2seq.prepend_tokens(parts[0], parts[1], table[choice])
        parts = (source, source_len, parts[2], parts[3])
    return seq2seq.seq2seq_batch(parts, seq2seq.row_document(batch), vocab.pad_id, extras={"denoiser": choice})


@objreg.hookimpl
def objreg_loss(outputs: objreg.ModelOutputs, batch: objreg.CorruptedBatch) -> torch.Tensor:
    return seq2seq.seq2seq_loss(outputs, batch)  # (B,)


# -- the mixture specification ------------------------------------------------------------------


@lru_cache(maxsize=32)
def mixture(denoisers: str, weights: str) -> tuple[tuple[Denoiser, ...], tuple[float, ...]]:
    """Parse the ``denoisers`` and ``weights`` parameters.

    Raises:
        objreg.InvalidParameterError: naming the entry that is wrong and the allowed form.
    """
    form = "R:mean_span:density, X:mean_span:density or S:density"
    parsed = []
    for entry in (e.strip() for e in denoisers.split(",")):
        fields = [f.strip() for f in entry.split(":")]
        kind = fields[0].upper()
        try:
            numbers = [float(f) for f in fields[1:]]
        except ValueError:
            numbers = []
        if kind in ("R", "X") and len(numbers) == 2:
            mean, density = numbers
        elif kind == "S" and len(numbers) == 1:
            mean, density = 1.0, numbers[0]
        else:
            raise objreg.InvalidParameterError(f"ul2: denoiser {entry!r} is not of the form {form}")
        if not (math.isfinite(mean) and mean >= 1.0 and 0.0 <= density <= 1.0):
            raise objreg.InvalidParameterError(
                f"ul2: denoiser {entry!r} needs a mean span length >= 1 and a density in [0, 1]"
            )
        parsed.append(Denoiser(kind, mean, density))
    try:
        values = tuple(float(w) for w in weights.split(","))
    except ValueError:
        raise objreg.InvalidParameterError(f"ul2: weights {weights!r} must be comma-separated numbers") from None
    if len(values) != len(parsed):
        raise objreg.InvalidParameterError(
            f"ul2: {len(values)} weights for {len(parsed)} denoisers; give one weight per denoiser"
        )
    if not all(math.isfinite(w) and w >= 0 for w in values) or sum(values) <= 0:
        raise objreg.InvalidParameterError(f"ul2: weights {weights!r} must be non-negative and not all zero")
    return tuple(parsed), values
