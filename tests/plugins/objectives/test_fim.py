"""Fill-in-the-middle: PSM/SPM rates, the original-order layout, FIM-order positions and labels,
the mask (PSM rules; n(n+1)/2 connections for random splits with empty fragments), and equivalence
with running the model on the physically reordered sequence."""

from __future__ import annotations

import math
import types

import pytest
import torch
from torch import nn

import objreg
from objreg import IGNORE_INDEX, masks

NAMED = {"[EOS]": 20, "[FIM_PREFIX]": 21, "[FIM_MIDDLE]": 22, "[FIM_SUFFIX]": 23}
PRE, MID, SUF = 21, 22, 23
VOCAB = objreg.Vocabulary(size=200, pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4, special_ids=tuple(range(30)),
                          named_ids=NAMED)


def corrupt(registry, batch, seed=0, **params):
    return registry.get("fim", vocab=VOCAB, **params).corrupt(batch, torch.Generator().manual_seed(seed))


def expected_row(text: list[int], cuts: tuple[int, int], mode: int) -> tuple[list[int], list[int]]:
    """(tokens in original order, the same tokens in FIM order), written out per Bavarian et al."""
    i, j = cuts
    prefix, middle, suffix = text[:i], text[i:j], text[j:]
    if mode == 0:
        row = [VOCAB.cls_id, *text, VOCAB.sep_id]
        return row, row
    original = [VOCAB.cls_id, PRE, *prefix, MID, *middle, SUF, *suffix, VOCAB.sep_id]
    if mode == 1:  # PSM
        ordered = [VOCAB.cls_id, PRE, *prefix, SUF, *suffix, MID, *middle, VOCAB.sep_id]
    else:  # SPM (bigcode's variant)
        ordered = [VOCAB.cls_id, PRE, SUF, *suffix, MID, *prefix, *middle, VOCAB.sep_id]
    return original, ordered


def test_defaults_and_attention(registry):
    info = registry.info("fim")
    assert info.defaults() == {"fim_rate": 0.5, "fim_spm_rate": 0.5}
    assert info.attention == "custom"  # a permuted causal mask: none of AttentionMask's patterns


def test_the_mask_is_a_dense_tensor(registry, synthetic_batch):
    objective = registry.get("fim", vocab=VOCAB, fim_rate=1.0)
    cb = objective.corrupt(synthetic_batch(VOCAB, [5, 9], seed=1), torch.Generator().manual_seed(0))
    described = objective.attention(cb)
    assert isinstance(described, torch.Tensor) and described.dtype == torch.bool
    assert described.shape == (2, cb.input_ids.shape[1], cb.input_ids.shape[1])


def test_fim_and_spm_rates(registry, synthetic_batch):
    N = 4000
    mode = corrupt(registry, synthetic_batch(VOCAB, [10] * N, seed=1)).extras["fim_mode"]
    for count, p in ((int((mode > 0).sum()), 0.5), (int((mode == 2).sum()), 0.25)):
        assert abs(count - N * p) <= 4 * math.sqrt(N * p * (1 - p))
    assert not bool(corrupt(registry, synthetic_batch(VOCAB, [10] * 50), fim_rate=0.0).extras["fim_mode"].any())


def test_layout_positions_and_labels_match_the_written_out_sequence(registry, synthetic_batch):
    lengths = [0, 1, 2, 5, 12, 30, 30, 17] * 25
    batch = synthetic_batch(VOCAB, lengths, seed=2)
    cb = corrupt(registry, batch, fim_rate=0.8)
    seen_modes = set()
    for b, n in enumerate(lengths):
        text = batch.input_ids[b, 1 : n + 1].tolist()
        mode, cuts = int(cb.extras["fim_mode"][b]), tuple(cb.extras["fim_cuts"][b].tolist())
        assert 0 <= cuts[0] <= cuts[1] <= n
        seen_modes.add(mode)
        original, ordered = expected_row(text, cuts, mode)
        m = len(original)
        assert cb.input_ids[b, :m].tolist() == original
        assert cb.is_padding[b].tolist() == [p >= m for p in range(cb.input_ids.shape[1])]
        positions = cb.position_ids[b, :m].tolist()
        assert sorted(positions) == list(range(m))
        assert [original[positions.index(r)] for r in range(m)] == ordered  # position id = place in FIM order
        # Each token predicts the next one in FIM order; the last ([SEP]) predicts nothing.
        expected = [ordered[r + 1] if r + 1 < m else IGNORE_INDEX for r in positions]
        assert cb.labels[b, :m].tolist() == expected
        assert (cb.labels[b, m:] == IGNORE_INDEX).all()
    assert seen_modes == {0, 1, 2}


def test_psm_mask_in_original_order(registry, synthetic_batch):
    """Left causal; middle sees all of left and right and the earlier middle; right sees left and
    the earlier right, never the middle."""
    batch = synthetic_batch(VOCAB, [20] * 60, seed=3)
    objective = registry.get("fim", vocab=VOCAB, fim_rate=1.0, fim_spm_rate=0.0)
    cb = objective.corrupt(batch, torch.Generator().manual_seed(4))
    mask = objective.attention_mask(cb)
    for b in range(60):
        i, j = cb.extras["fim_cuts"][b].tolist()
        # Groups in original order: [CLS] [PRE] prefix | [MID] middle | [SUF] suffix | [SEP] (ends the middle).
        group = ["L"] * (2 + i) + ["M"] * (1 + j - i) + ["R"] * (1 + 20 - j) + ["M"]
        n = len(group)
        for q in range(n):
            for k in range(n):
                if group[q] == "L":
                    allowed = group[k] == "L" and k <= q
                elif group[q] == "R":
                    allowed = group[k] == "L" or (group[k] == "R" and k <= q)
                else:  # middle: all of left and right, the earlier middle ([SEP] comes last)
                    allowed = group[k] in "LR" or k <= q
                assert bool(mask[b, q, k]) == allowed, (b, q, k)


@pytest.mark.parametrize("spm_rate", [0.0, 0.5, 1.0])
def test_connections_equal_the_causal_count_for_random_splits(registry, spm_rate, synthetic_batch):
    lengths = [0, 1, 2, 3, 4, 7, 15] * 60
    batch = synthetic_batch(VOCAB, lengths, seed=5)
    objective = registry.get("fim", vocab=VOCAB, fim_rate=1.0, fim_spm_rate=spm_rate)
    cb = objective.corrupt(batch, torch.Generator().manual_seed(6))
    n = (~cb.is_padding).sum(dim=1)
    assert torch.equal(masks.allowed_connections(objective.attention_mask(cb)), n * (n + 1) // 2)
    cuts, text = cb.extras["fim_cuts"], torch.tensor(lengths)
    empty = {"prefix": cuts[:, 0] == 0, "middle": cuts[:, 0] == cuts[:, 1], "suffix": cuts[:, 1] == text}
    assert all(bool(e[text > 0].any()) for e in empty.values())  # every kind of empty fragment occurred
    assert bool((empty["prefix"] & empty["middle"] & (text > 0)).any())


def test_empty_text_still_gets_its_markers(registry, synthetic_batch):
    cb = corrupt(registry, synthetic_batch(VOCAB, [0, 0]), fim_rate=1.0)
    assert cb.input_ids.tolist() == [[VOCAB.cls_id, PRE, MID, SUF, VOCAB.sep_id]] * 2


def test_the_mask_and_positions_reproduce_the_reordered_sequence(registry, tokenizer):
    """The tiny default backbone on [original order + FIM positions + FIM mask] gives the hidden
    states of [FIM order + positions 0.. + causal mask], token for token."""
    named = {k: tokenizer.vocab.named_ids[k] for k in ("[FIM_PREFIX]", "[FIM_MIDDLE]", "[FIM_SUFFIX]")}
    assert len(named) == 3
    objective = registry.get("fim", vocab=tokenizer.vocab, fim_rate=1.0)
    batch = tokenizer.batch_from_texts(["Bees collect nectar from flowers. They store honey in wax cells.",
                                        "Rivers carry sediment to the sea.", "The queen lays the eggs."])
    cb = objective.corrupt(batch, torch.Generator().manual_seed(7))
    model = registry.load_model("default", tokenizer.vocab, [objreg.HeadSpec("lm", "lm")],
                                {"hidden_size": 16, "num_layers": 2, "num_heads": 2, "intermediate_size": 32},
                                torch.Generator().manual_seed(0)).double()
    hidden = model.encode(cb.input_ids, objective.attention_mask(cb), cb.position_ids)
    order = torch.where(cb.is_padding, 10_000, cb.position_ids).argsort(dim=1)  # position of each FIM rank
    reordered = cb.input_ids.gather(1, order)
    padding = cb.is_padding.gather(1, order)
    causal = masks.causal(padding) & ~padding[:, :, None]
    positions = torch.arange(cb.input_ids.shape[1]).expand_as(reordered)
    expected = model.encode(reordered, causal, positions)
    real = ~padding
    got = hidden.gather(1, order[:, :, None].expand_as(hidden))
    assert torch.allclose(got[real], expected[real], atol=1e-10)


def test_loss_is_the_mean_next_token_nll(registry, synthetic_batch):
    objective = registry.get("fim", vocab=VOCAB, fim_rate=1.0)
    cb = objective.corrupt(synthetic_batch(VOCAB, [9, 4], seed=8), torch.Generator().manual_seed(9))
    torch.manual_seed(0)
    head = nn.Linear(4, VOCAB.size).double()
    hidden = torch.randn(*cb.input_ids.shape, 4, dtype=torch.float64)
    loss = objective.loss(objreg.ModelOutputs(hidden, types.SimpleNamespace(heads={"lm": head})), cb)
    for b in range(2):
        terms = [-torch.log_softmax(head(hidden[b, t]), -1)[cb.labels[b, t]]
                 for t in range(cb.input_ids.shape[1]) if cb.labels[b, t] != IGNORE_INDEX]
        assert len(terms) == int((~cb.is_padding[b]).sum()) - 1
        assert torch.allclose(loss[b], torch.stack(terms).mean())


def test_missing_markers_are_a_data_error_when_the_objective_is_created(registry):
    plain = objreg.Vocabulary(size=200, pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4, special_ids=(0, 1, 2, 3, 4))
    with pytest.raises(objreg.DataError, match=r"^fim needs \[FIM_PREFIX\], \[FIM_MIDDLE\], \[FIM_SUFFIX\].*add_tokens"):
        registry.get("fim", vocab=plain)
