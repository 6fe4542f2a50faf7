"""objreg.toolkit.replacement: BERT's 80/10/10 among the selected positions, against a loop over
the same draws, for a vocabulary whose ordinary ids are one range and one where they are not."""

from __future__ import annotations

import pytest
import torch

import objreg
from objreg.toolkit import replacement

PARAMS = {"mask_replace_prob": 0.5, "random_replace_prob": 0.3}


@pytest.mark.parametrize("special_ids", [tuple(range(6)), (0, 1, 2, 3, 4, 11, 17, 29)], ids=["one range", "gaps"])
def test_replace_selected_is_mask_random_or_kept_by_fate(special_ids):
    vocab = objreg.Vocabulary(size=30, pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4, special_ids=special_ids)
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 30, (9, 40), generator=g)
    selected = torch.rand(9, 40, generator=g) < 0.6
    fate = torch.rand(9, 40, generator=g)
    out = replacement.replace_selected(ids, selected, fate, torch.Generator().manual_seed(7), PARAMS, vocab)
    # The same draw by hand: one index into the ordinary ids per position.
    pool = [i for i in range(30) if i not in special_ids]
    picks = torch.randint(len(pool), ids.shape, generator=torch.Generator().manual_seed(7))
    for b in range(9):
        for t in range(40):
            f = float(fate[b, t])
            if not selected[b, t] or f >= 0.8:
                expected = int(ids[b, t])
            elif f < 0.5:
                expected = vocab.mask_id
            else:
                expected = pool[int(picks[b, t])]
            assert int(out[b, t]) == expected, (b, t)
    assert not torch.equal(out, ids)
