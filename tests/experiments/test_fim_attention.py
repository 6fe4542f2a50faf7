"""fim-attention: the infilling positions against the written-out FIM order, a tiny run of the twins."""

from __future__ import annotations

import json

import pytest
import torch

from objreg import IGNORE_INDEX
from objreg.experiments import fim_attention as fa
from objreg.experiments.base import Setting
from objreg.testing import TINY_MODEL
from objreg.toolkit import seq2seq


def test_middle_positions_are_those_that_predict_the_middle_and_its_end(registry, tokenizer, texts):
    vocab = tokenizer.vocab
    objective = registry.get("fim", vocab=vocab, fim_rate=1.0, fim_spm_rate=0.0)
    rows = tokenizer.batch_from_texts(texts, seq_len=40)
    batch = objective.corrupt(rows, torch.Generator().manual_seed(3))
    middle_id = seq2seq.named_id(vocab, "[FIM_MIDDLE]", "fim")
    got = fa.middle_positions(batch, middle_id)
    for b in range(batch.input_ids.shape[0]):
        # Walk the row in FIM order: everything after [FIM_MIDDLE] (and the marker itself) predicts
        # a middle token or the final [SEP]; the last position has no label.
        order = sorted(range(batch.input_ids.shape[1]), key=lambda p: int(batch.position_ids[b, p]))
        order = [p for p in order if not batch.is_padding[b, p]]
        seen_marker, expected = False, set()
        for p in order:
            seen_marker = seen_marker or int(batch.input_ids[b, p]) == middle_id
            if seen_marker and int(batch.labels[b, p]) != IGNORE_INDEX:
                expected.add(p)
        assert set(torch.nonzero(got[b]).flatten().tolist()) == expected
        predicted = [int(batch.labels[b, p]) for p in sorted(expected, key=lambda p: int(batch.position_ids[b, p]))]
        assert predicted[-1] == vocab.sep_id  # the middle ends with [SEP]


def test_tiny_run_is_reproducible(tiny_text, tmp_path):
    config = fa.Config(steps=3, batch_size=4, seq_len=32, rows=6)
    result = fa._run(config, Setting(quick=True, seed=1, out_dir=tmp_path, device="cpu"), tiny_text, dict(TINY_MODEL))
    figures = result.figures
    l2r, infilling = figures["left_to_right_loss"], figures["infilling_loss"]
    assert figures["effect"] == pytest.approx(l2r["fim"] - l2r["left_to_right"])
    assert figures["parts"]["infilling_gain"] == pytest.approx(infilling["left_to_right"] - infilling["fim"])
    assert figures["middle_positions"] >= 6
    json.dumps(result.to_dict(), allow_nan=False)
    assert (tmp_path / "fim-attention.png").stat().st_size > 1000
    assert fa._run(config, Setting(quick=True, seed=1, device="cpu"), tiny_text, dict(TINY_MODEL)).figures == figures
