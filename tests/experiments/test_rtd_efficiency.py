"""rtd-efficiency: the probe, the sentence features, a tiny run, SST-2 (ELECTRA 15%, the\n``discriminator_positions="selected"`` setting of rtd, is tested in tests/plugins/objectives/test_rtd.py)."""

from __future__ import annotations

import json

import pytest
import torch

import objreg
from objreg.experiments import _support
from objreg.experiments import rtd_efficiency as re
from objreg.experiments.base import Setting
from objreg.testing import TINY_MODEL


@pytest.mark.e2e
def test_tiny_run_is_reproducible(registry, tokenizer, texts, tmp_path):
    corpus = objreg.Corpus("tiny", tuple(tuple(objreg.split_sentences(t)) for t in texts * 6))
    train, heldout = corpus.split(heldout_every=3)
    text = _support.DefaultText(registry, objreg.TokenizedCorpus(tokenizer, train, 32),
                                objreg.TokenizedCorpus(tokenizer, heldout, 32))
    data = (texts * 5, torch.tensor([i % 2 for i in range(30)]))
    config = re.Config(steps=6, seq_len=32, batch_size=4, probe_seq_len=32, finetune_epochs=1)
    result = re._run(config, Setting(quick=True, seed=1, out_dir=tmp_path, device="cpu"), text, dict(TINY_MODEL),
                     data)
    json.dumps(result.to_dict(), allow_nan=False)
    assert (tmp_path / "rtd-efficiency.png").stat().st_size > 1000
    figures = result.figures
    assert figures["checkpoints"] == [2, 4, 6]
    # The frozen probe at every checkpoint, beside the fine-tune (the reading) after the last step.
    assert all(len(figures["probe_accuracy"][arm]) == 3 for arm in re.ARMS)
    acc = figures["accuracy"]
    assert all(0.0 <= acc[arm] <= 1.0 for arm in (*re.ARMS, "untrained"))
    assert figures["effect"] == pytest.approx(min(acc["rtd"] - acc["mlm"], acc["rtd"] - acc["rtd15"]))
    assert re.PRECONDITIONS[0].measure(figures, None) == min(acc[arm] for arm in re.ARMS)
    again = re._run(config, Setting(quick=True, seed=1, device="cpu"), text, dict(TINY_MODEL), data)
    assert again.figures == figures
