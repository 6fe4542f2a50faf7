"""screen-validity's setting (objreg.experiments.screen_validity_setting): its candidates and their
slices into parts."""

from __future__ import annotations

import pytest
import torch

from objreg.experiments.screen_validity_setting import FULL, OBJECTIVES, candidates, draw_mixtures, parts
from objreg.toolkit.randomness import stream


def test_the_full_setting_has_at_least_24_candidates_and_12_drawn_mixtures():
    labels = candidates(FULL)
    mixtures = [c for c in labels if "+" in c]
    assert len(labels) >= 24 and len(mixtures) >= 12 and len(set(labels)) == len(labels)
    assert labels == candidates(FULL)  # one list for every seed and every part
    assert all(2 <= len(m.split("+")) <= 3 for m in mixtures)
    assert mixtures == draw_mixtures(OBJECTIVES, FULL.mixtures, stream(0, "screen_mixtures"))
    assert parts(FULL)[0] == (0, FULL.chunk) and parts(FULL)[-1][1] == len(labels)
    with pytest.raises(ValueError, match=r"only 1 mixture\(s\)"):
        draw_mixtures(("a", "b"), 3, torch.Generator().manual_seed(0))
