"""fim-attention: connection counts and where they go, against a loop over the FIM order."""

from __future__ import annotations

import json

import pytest
import torch

import objreg
from objreg.experiments import fim_attention as fa
from objreg.experiments.base import Setting

# Segments in original order: [CLS] [PRE] prefix [MID] middle [SUF] suffix [SEP].
CLS, PRE, PREFIX, MID, MIDDLE, SUF, SUFFIX, SEP = range(8)
FIM_ORDER = {1: (CLS, PRE, PREFIX, SUF, SUFFIX, MID, MIDDLE, SEP), 2: (CLS, PRE, SUF, SUFFIX, MID, PREFIX, MIDDLE, SEP)}


@pytest.fixture(scope="module")
def corrupted():
    objective = objreg.Registry.load(load_entrypoints=False).get("fim", vocab=fa.VOCAB, fim_rate=1.0, fim_spm_rate=0.5)
    batch = fa.random_rows(24, 12, torch.Generator().manual_seed(0))
    cb = objective.corrupt(batch, torch.Generator().manual_seed(1))
    return batch, cb, objective.attention_mask(cb)


def loop_layout(cb, b: int) -> list[tuple[int, int]]:
    """(segment, visible keys) of each real position of row ``b``, by walking the FIM order."""
    mode = int(cb.extras["fim_mode"][b])
    n = int((~cb.is_padding[b]).sum())
    start, end = (int(v) for v in cb.extras["fim_cuts"][b])
    text = n - 5
    sizes = [1, 1, start, 1, end - start, 1, text - end, 1]
    first_rank, used = {}, 0
    for segment in FIM_ORDER[mode]:
        first_rank[segment] = used
        used += sizes[segment]
    layout = []
    for segment in range(8):
        for offset in range(sizes[segment]):
            layout.append((segment, first_rank[segment] + offset + 1))  # sees every rank up to its own
    assert len(layout) == n
    return layout


def test_random_rows_are_cls_text_sep_then_padding():
    batch = fa.random_rows(50, 9, torch.Generator().manual_seed(3))
    lengths = (~batch.is_padding).sum(dim=1)
    assert lengths.min() >= 2 and lengths.max() <= 9
    for b in range(50):
        n = int(lengths[b])
        row = batch.input_ids[b].tolist()
        assert row[0] == fa.VOCAB.cls_id and row[n - 1] == fa.VOCAB.sep_id
        assert all(t >= fa.SPECIAL for t in row[1:n - 1]) and all(t == fa.VOCAB.pad_id for t in row[n:])


def test_segments_and_visible_keys_match_the_loop(corrupted):
    _, cb, mask = corrupted
    segment = fa.segments(cb)
    keys = mask.sum(dim=2)
    for b in range(cb.input_ids.shape[0]):
        layout = loop_layout(cb, b)
        n = len(layout)
        assert segment[b, :n].tolist() == [s for s, _ in layout]
        assert keys[b, :n].tolist() == [k for _, k in layout]
        assert int(mask[b].sum()) == n * (n + 1) // 2


def test_tally_against_the_loop(corrupted):
    _, cb, mask = corrupted
    tally = fa.Tally()
    tally.add(cb, mask)
    expected = {mode: {name: [0.0, 0.0, 0.0] for name in fa.FRAGMENTS} for mode in fa.MODES}
    gains = []
    for b in range(cb.input_ids.shape[0]):
        mode = {1: "psm", 2: "spm"}[int(cb.extras["fim_mode"][b])]
        middle_gain = []
        for p, (segment, k) in enumerate(loop_layout(cb, b)):
            for name, seg in fa.FRAGMENTS.items():
                if segment == seg:
                    expected[mode][name] = [a + v for a, v in zip(expected[mode][name], (1, k, p + 1))]
            if segment == MIDDLE:
                middle_gain.append(k - (p + 1))
        if middle_gain:
            gains.append(sum(middle_gain) / len(middle_gain))
    for mode in fa.MODES:
        for name in fa.FRAGMENTS:
            assert tally.by_mode[mode][name].tolist() == pytest.approx(expected[mode][name])
    assert tally.middle_gain == pytest.approx(gains)
    figures = tally.figures()
    assert figures["conserved_rows"] == figures["rows"] == 24 and figures["largest_count_gap"] == 0


def test_verdict(corrupted):
    _, cb, mask = corrupted
    tally = fa.Tally()
    tally.add(cb, mask)
    figures = tally.figures()
    assert fa.decide(figures)[0] == "confirmed"
    broken = {**figures, "conserved_rows": figures["rows"] - 1}
    assert fa.decide(broken)[0] == "refuted"
    unclear = {**figures, "middle_gain_per_token": {"mean": 0.1, "ci95": [-0.2, 0.4], "rows": 3}}
    assert fa.decide(unclear)[0] == "inconclusive"
    away = {**figures, "middle_gain_per_token": {"mean": -1.0, "ci95": [-1.5, -0.5], "rows": 3}}
    assert fa.decide(away)[0] == "refuted"


def test_small_run_is_reproducible(tmp_path):
    config = fa.Config(batches=5, rows=16, max_len=20)
    result = fa._run(config, Setting(quick=True, seed=4, out_dir=tmp_path))
    assert result.figures["conserved_fraction"] == 1.0 and result.verdict == "confirmed"
    psm = result.figures["psm"]["fragments"]
    assert psm["prefix"]["keys_per_token_fim"] == pytest.approx(psm["prefix"]["keys_per_token_causal"])
    assert psm["middle"]["keys_per_token_fim"] > psm["middle"]["keys_per_token_causal"]
    assert psm["suffix"]["keys_per_token_fim"] < psm["suffix"]["keys_per_token_causal"]
    json.dumps(result.to_dict(), allow_nan=False)
    assert (tmp_path / "fim-attention.png").stat().st_size > 1000
    assert fa._run(config, Setting(quick=True, seed=4)).figures == result.figures
    assert fa._run(config, Setting(quick=True, seed=5)).figures != result.figures
