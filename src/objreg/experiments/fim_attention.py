"""FIM attention: the fill-in-the-middle mask in original order conserves the causal count of
attention connections and moves them to the middle.

**Claim.** Fill-in-the-middle trains a causal model on ``prefix, suffix, middle`` (PSM; SPM:
``suffix, prefix, middle``). Kept in the original token order, its attention mask is a permuted
causal mask, so a row of ``n`` tokens has exactly the causal count ``n(n+1)/2`` of (query, key)
connections; what changes is who gets them: middle tokens see the suffix as well as the prefix,
and suffix tokens lose sight of the middle. Source: Bavarian et al. 2022 (Efficient Training of
Language Models to Fill in the Middle); the mask formulation is ``objreg``'s ``fim`` objective
(DESIGN §4), as stated in issue 9.

**Setting.** Synthetic rows ``[CLS] x₁ … x_m [SEP]`` of random ordinary tokens, each row's length
drawn uniformly from 2 … ``max_len`` (so empty fragments and empty rows occur), corrupted by the
``fim`` objective itself with ``fim_rate`` 1 (every row is FIM) and ``fim_spm_rate`` 0.5: each
corruption draws fresh split points and a fresh PSM/SPM choice per row. Quick: 100 batches of 64
rows, ``max_len`` 128; full: 1,000 batches of 64 rows, ``max_len`` 256 (64,000 splits).

**Measured.** For every row, from the objective's own ``attention_mask``: the number of allowed
(query, key) pairs against ``n(n+1)/2``, ``n`` the row's real tokens (three sentinels included).
Where the connections go, in original order: each query's number of visible keys ``k_p``
against the ``p + 1`` a causal mask over the original order gives it; its *gain* is
``k_p − (p + 1)``. Per fragment (prefix, middle, suffix text tokens) and mode: the mean keys per
token under FIM and under causal, and the share of all connections whose query lies in the
fragment. "Moved to the middle" is measured as the mean gain of a middle token, with a
Student-t 95% interval over rows that have a non-empty middle. The profile plot shows the mean
``k/n`` against the position within each fragment (fragments stretched to equal width).

**Verdict.** ``confirmed`` when every row conserves the count exactly *and* the mean gain of a
middle token has its whole interval above 0; ``refuted`` when some row does not conserve the
count or the interval lies wholly below 0; ``inconclusive`` otherwise.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch

from objreg import CorruptedBatch, Registry, TokenBatch, Vocabulary
from objreg.analysis.stats import mean_ci95
from objreg.experiments.base import (
    CONFIRMED,
    INCONCLUSIVE,
    REFUTED,
    ExperimentResult,
    Setting,
    save_figure,
    verdict_from_interval,
)

NAME = "fim-attention"
CLAIM = ("The fill-in-the-middle mask in original order keeps the causal count n(n+1)/2 of attention connections "
         "while moving them to the middle.")
SPECIAL = 8  # [PAD] [UNK] [CLS] [SEP] [MASK] [FIM_PREFIX] [FIM_MIDDLE] [FIM_SUFFIX]
VOCAB = Vocabulary(size=SPECIAL + 100, pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4,
                   special_ids=tuple(range(SPECIAL)),
                   named_ids={"[FIM_PREFIX]": 5, "[FIM_MIDDLE]": 6, "[FIM_SUFFIX]": 7})
#: Text fragments, as the ``fim`` objective numbers its segments in original order.
FRAGMENTS = {"prefix": 2, "middle": 4, "suffix": 6}
MODES = {"psm": 1, "spm": 2}
PROFILE_BINS = 10


@dataclass(frozen=True)
class Config:
    """Sizes of the experiment."""

    batches: int
    rows: int
    max_len: int


QUICK = Config(batches=100, rows=64, max_len=128)
FULL = Config(batches=1000, rows=64, max_len=256)


def run(setting: Setting) -> ExperimentResult:
    return _run(QUICK if setting.quick else FULL, setting)


def _run(config: Config, setting: Setting) -> ExperimentResult:
    objective = Registry.load().get("fim", vocab=VOCAB, fim_rate=1.0, fim_spm_rate=0.5)
    data = torch.Generator().manual_seed(setting.seed * 7919 + 1)
    corruption = torch.Generator().manual_seed(setting.seed * 7919 + 2)
    tally = Tally()
    setting.status(f"counting connections over {config.batches * config.rows} random splits")
    for _ in range(config.batches):
        batch = random_rows(config.rows, config.max_len, data)
        corrupted = objective.corrupt(batch, corruption)
        tally.add(corrupted, objective.attention_mask(corrupted))
    figures = tally.figures()
    verdict, reason = decide(figures)
    plots = [_plot(figures, setting)] if setting.out_dir is not None else []
    return ExperimentResult(NAME, CLAIM, verdict, reason, figures,
                            {**asdict(config), "seed": setting.seed, "quick": setting.quick,
                             "fim_rate": 1.0, "fim_spm_rate": 0.5}, plots)


def random_rows(rows: int, max_len: int, generator: torch.Generator) -> TokenBatch:
    """``[CLS] x₁ … x_m [SEP]`` rows of random ordinary tokens, lengths uniform in 2 … ``max_len``,
    right-padded; each row its own document."""
    lengths = torch.randint(2, max_len + 1, (rows,), generator=generator)
    T = int(lengths.max())
    p = torch.arange(T)[None, :]
    ids = torch.randint(SPECIAL, VOCAB.size, (rows, T), generator=generator)
    ids = torch.where(p == 0, VOCAB.cls_id, ids)
    ids = torch.where(p == lengths[:, None] - 1, VOCAB.sep_id, ids)
    padding = p >= lengths[:, None]
    ids = torch.where(padding, VOCAB.pad_id, ids)
    special = padding | (p == 0) | (p == lengths[:, None] - 1)
    return TokenBatch(
        input_ids=ids, is_padding=padding, is_special=special, word_ids=torch.where(special, -1, p.expand(rows, T)),
        sentence_ids=torch.where(special, -1, 0), document_ids=torch.where(padding, -1, torch.arange(rows)[:, None]),
    )


def segments(batch: CorruptedBatch) -> torch.Tensor:
    """``[B, W]``: the segment of each position of a FIM row in original order (0 [CLS], 1
    [FIM_PREFIX], 2 prefix, 3 [FIM_MIDDLE], 4 middle, 5 [FIM_SUFFIX], 6 suffix, 7 [SEP]; 8 at
    padding), from ``fim_cuts``."""
    B, W = batch.input_ids.shape
    length = (~batch.is_padding).sum(dim=1)
    fim = (batch.extras["fim_mode"] > 0).long()
    text = (length - 2 - 3 * fim).clamp(min=0)
    start, end = batch.extras["fim_cuts"][:, 0], batch.extras["fim_cuts"][:, 1]
    one = torch.ones_like(length)
    last = (length >= 2).long()
    sizes = torch.stack([one.clamp(max=length), fim, start, fim, end - start, fim, text - end, last], dim=1)
    ends = sizes.cumsum(dim=1)  # (B, 8)
    p = torch.arange(W)[None, :, None]
    segment = (ends[:, None, :] <= p).sum(dim=2)  # (B, W)
    return torch.where(batch.is_padding, 8, segment.clamp(max=7))


class Tally:
    """Running sums over batches of what the figures need."""

    def __init__(self) -> None:
        self.rows = 0
        self.conserved = 0
        self.worst_gap = 0
        # Per mode and fragment: tokens, keys they see under FIM, keys under causal.
        self.by_mode = {mode: {name: np.zeros(3) for name in FRAGMENTS} for mode in MODES}
        self.connections = dict.fromkeys(MODES, 0.0)  # all connections of the mode's rows
        self.middle_gain: list[float] = []
        self.profile = {mode: np.zeros((3, 3 * PROFILE_BINS)) for mode in MODES}  # count, fim k/n, causal k/n

    def add(self, batch: CorruptedBatch, mask: torch.Tensor) -> None:
        n = (~batch.is_padding).sum(dim=1).long()  # (B,)
        count = mask.sum(dim=(1, 2)).long()
        gap = count - n * (n + 1) // 2
        self.rows += len(n)
        self.conserved += int((gap == 0).sum())
        self.worst_gap = max(self.worst_gap, int(gap.abs().max()))
        keys = mask.sum(dim=2).double()  # (B, W): keys each query sees
        W = keys.shape[1]
        causal = (torch.arange(W)[None, :] + 1).double().expand_as(keys)
        segment = segments(batch)
        mode = batch.extras["fim_mode"]
        gain = keys - causal
        real = n[:, None].double()
        for mode_name, mode_id in MODES.items():
            rows = (mode == mode_id)[:, None]
            self.connections[mode_name] += float(torch.where(rows, keys, 0.0).sum())
            for name, seg in FRAGMENTS.items():
                here = rows & (segment == seg)
                self.by_mode[mode_name][name] += [float(here.sum()), float(keys[here].sum()), float(causal[here].sum())]
            self._profile(mode_name, rows, segment, keys / real, causal / real)
        middle = segment == FRAGMENTS["middle"]
        has_middle = middle.any(dim=1)
        per_row = torch.where(middle, gain, 0.0).sum(dim=1) / middle.sum(dim=1).clamp(min=1)
        self.middle_gain.extend(per_row[has_middle].tolist())

    def _profile(
        self, mode: str, rows: torch.Tensor, segment: torch.Tensor, fim: torch.Tensor, causal: torch.Tensor
    ) -> None:
        """Accumulate ``k/n`` by fragment and relative position within the fragment."""
        for f, seg in enumerate(FRAGMENTS.values()):
            here = rows & (segment == seg)
            if not bool(here.any()):
                continue
            offset = (here.long().cumsum(dim=1) - 1).double()  # position within the fragment
            size = here.sum(dim=1, keepdim=True).double()
            relative = ((offset + 0.5) / size.clamp(min=1))[here]
            column = f * PROFILE_BINS + (relative * PROFILE_BINS).long().clamp(max=PROFILE_BINS - 1)
            table = self.profile[mode]
            np.add.at(table[0], column.numpy(), 1.0)
            np.add.at(table[1], column.numpy(), fim[here].numpy())
            np.add.at(table[2], column.numpy(), causal[here].numpy())

    def figures(self) -> dict:
        mean, low, high = mean_ci95(self.middle_gain) if self.middle_gain else (0.0, 0.0, 0.0)
        figures: dict = {
            "rows": self.rows, "conserved_rows": self.conserved,
            "conserved_fraction": self.conserved / max(self.rows, 1),
            "largest_count_gap": self.worst_gap,
            "middle_gain_per_token": {"mean": mean, "ci95": [low, high], "rows": len(self.middle_gain)},
        }
        for mode in MODES:
            fragments = {}
            total = max(self.connections[mode], 1.0)
            for name, (tokens, fim, causal) in self.by_mode[mode].items():
                fragments[name] = {"tokens": int(tokens), "keys_per_token_fim": fim / max(tokens, 1),
                                   "keys_per_token_causal": causal / max(tokens, 1),
                                   "connection_share_fim": fim / total, "connection_share_causal": causal / total}
            table = self.profile[mode]
            counts = np.maximum(table[0], 1)
            figures[mode] = {"fragments": fragments,
                             "profile_fim": (table[1] / counts).tolist(),
                             "profile_causal": (table[2] / counts).tolist()}
        return figures


def decide(figures: dict) -> tuple[str, str]:
    gain = figures["middle_gain_per_token"]
    moved = verdict_from_interval(*gain["ci95"], threshold=0.0, claim="above")
    conserved = figures["conserved_rows"] == figures["rows"]
    if not conserved or moved == REFUTED:
        verdict = REFUTED
    elif moved == CONFIRMED:
        verdict = CONFIRMED
    else:
        verdict = INCONCLUSIVE
    psm, spm = figures["psm"]["fragments"], figures["spm"]["fragments"]
    reason = (
        f"{figures['conserved_rows']} of {figures['rows']} random splits keep exactly n(n+1)/2 connections "
        f"(largest gap {figures['largest_count_gap']}); a middle token sees {gain['mean']:+.2f} "
        f"[{gain['ci95'][0]:+.2f}, {gain['ci95'][1]:+.2f}] more keys than under a causal mask; middle share of "
        f"connections {psm['middle']['connection_share_fim']:.3f} vs causal "
        f"{psm['middle']['connection_share_causal']:.3f} "
        f"(PSM), {spm['middle']['connection_share_fim']:.3f} vs {spm['middle']['connection_share_causal']:.3f} (SPM); "
        f"suffix keys per token {psm['suffix']['keys_per_token_fim']:.1f} vs causal "
        f"{psm['suffix']['keys_per_token_causal']:.1f} (PSM)"
    )
    return verdict, reason


def _plot(figures: dict, setting: Setting) -> str:
    """Mean visible keys / n along the prefix, middle and suffix (each stretched to width 1)."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 4))
    ax = figure.add_subplot()
    x = (np.arange(3 * PROFILE_BINS) + 0.5) / PROFILE_BINS
    for mode, color in (("psm", "tab:red"), ("spm", "tab:green")):
        ax.plot(x, figures[mode]["profile_fim"], "o-", markersize=3, color=color, label=f"FIM {mode.upper()}")
    ax.plot(x, figures["psm"]["profile_causal"], "--", color="black", label="causal (original order)")
    for edge in (1, 2):
        ax.axvline(edge, color="grey", linewidth=0.5)
    ax.set_xticks([0.5, 1.5, 2.5], ["prefix", "middle", "suffix"])
    ax.set_ylabel("visible keys / n")
    ax.set_title("Where the FIM mask's connections go (same total as causal)")
    ax.legend(fontsize=8)
    figure.tight_layout()
    return save_figure(figure, setting.out_dir / f"{NAME}.png")
