"""weight-tying: the gradient at the decoder input, untying, the verdict, determinism."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from objreg.experiments import _support
from objreg.experiments import weight_tying as wt
from objreg.experiments.base import Setting
from objreg.testing import TINY_MODEL


@pytest.fixture(scope="module")
def setup(registry, tokenizer, texts):
    mlm = registry.get("mlm", vocab=tokenizer.vocab)
    batch = mlm.corrupt(tokenizer.batch_from_texts(texts[:4], seq_len=24), torch.Generator().manual_seed(0))
    return mlm, batch


def model(registry, mlm, tied: bool):
    built = _support.mlm_model(registry, mlm, 0, dict(TINY_MODEL)).double()
    if not tied:
        _support.untie_lm_head(built, torch.Generator().manual_seed(1))
    return built


def test_untying_gives_the_decoder_its_own_matrix(registry, setup):
    mlm, _ = setup
    tied, untied = model(registry, mlm, True), model(registry, mlm, False)
    assert tied.heads["lm"].decoder.weight is tied.backbone.token_embedding.weight
    assert untied.heads["lm"].decoder.weight is not untied.backbone.token_embedding.weight
    count = sum(p.numel() for p in tied.parameters())
    assert sum(p.numel() for p in untied.parameters()) == count + untied.heads["lm"].decoder.weight.numel()
    assert 0.015 < float(untied.heads["lm"].decoder.weight.detach().std()) < 0.025


@pytest.mark.parametrize("tied", [True, False])
def test_cosines_against_a_per_position_loop(registry, setup, tied):
    mlm, batch = setup
    net = model(registry, mlm, tied)
    measured = wt.gradient_cosines(net, mlm, batch, 4, torch.Generator().manual_seed(2))
    assert measured["identity_max_relative_error"] < 1e-10  # float64: exact up to rounding
    # One masked token at a time: its own loss through the head, differentiated by autograd.
    head = net.heads["lm"]
    embedding = net.backbone.token_embedding.weight.detach()
    positions, real = batch.extras["masked_positions"], batch.extras["masked_weights"] > 0
    with torch.no_grad():
        hidden = net.encode(batch.input_ids, mlm.attention_mask(batch), batch.position_ids)
    for b in range(positions.shape[0]):
        for k in range(positions.shape[1]):
            if not real[b, k]:
                continue
            h = hidden[b, positions[b, k]].clone().requires_grad_(True)
            x = head.norm(F.gelu(head.dense(h)))
            target = batch.labels[b, positions[b, k]]
            g_x, g_h = torch.autograd.grad(F.cross_entropy(head.decoder(x)[None], target[None]), [x, h])
            expected_x = F.cosine_similarity(-g_x, embedding[target], dim=0)
            expected_h = F.cosine_similarity(-g_h, embedding[target], dim=0)
            assert float(measured["decoder_input"]["target_embedding"][b, k]) == pytest.approx(float(expected_x))
            assert float(measured["backbone_output"]["target_embedding"][b, k]) == pytest.approx(float(expected_h))
    decoder_input = measured["decoder_input"]
    if tied:
        assert torch.equal(decoder_input["target_embedding"], decoder_input["target_decoder_row"])
        # At init p is nearly uniform, so -dl/dx is nearly W[y] - mean(W): close to the target row.
        assert float(decoder_input["target_embedding"][real].min()) > 0.9
    else:
        assert float(decoder_input["target_decoder_row"][real].min()) > 0.9
        assert float(decoder_input["target_embedding"][real].abs().max()) < 0.9


def test_summary_and_verdict(registry, setup):
    mlm, batch = setup
    measured = wt.gradient_cosines(model(registry, mlm, True), mlm, batch, 4, torch.Generator().manual_seed(2))
    summary = wt.summarise(measured)
    real = measured["real"]
    diff = measured["decoder_input"]["target_embedding"] - measured["decoder_input"]["random_embedding"]
    rows = [float(diff[b][real[b]].mean()) for b in range(real.shape[0]) if real[b].any()]
    assert summary["decoder_input"]["target_minus_random"]["mean"] == pytest.approx(sum(rows) / len(rows))
    # The verdict reads the final hidden state, not the decoder input (where the claim is an identity).
    def at_hidden_state(ci):
        return {**summary, "backbone_output": {**summary["backbone_output"],
                                               "target_minus_random": {"mean": sum(ci) / 2, "ci95": ci, "rows": 3}}}

    positive, flat, away = at_hidden_state([0.1, 0.2]), at_hidden_state([-0.1, 0.1]), at_hidden_state([-0.4, -0.2])
    assert wt.seed_verdict({t: {"init": positive, "trained": positive} for t in wt.TYINGS})[0] == "confirmed"
    assert wt.seed_verdict({t: {"init": positive, "trained": flat} for t in wt.TYINGS})[0] == "inconclusive"
    assert wt.seed_verdict({t: {"init": positive, "trained": away} for t in wt.TYINGS})[0] == "refuted"
    # At initialisation the alignment is reported, not tested: the head's random transform sits before E.
    assert wt.seed_verdict({t: {"init": away, "trained": positive} for t in wt.TYINGS})[0] == "confirmed"


def test_small_run_is_reproducible(tiny_text, tmp_path):
    text = tiny_text
    config = wt.Config(train_steps=2, rows=4, batch_size=4, seq_len=32, random_tokens=4)
    result = wt._run(config, Setting(quick=True, seed=1, out_dir=tmp_path, device="cpu"), text, dict(TINY_MODEL))
    json.dumps(result.to_dict(), allow_nan=False)
    assert (tmp_path / "weight-tying.png").stat().st_size > 1000
    again = wt._run(config, Setting(quick=True, seed=1, device="cpu"), text, dict(TINY_MODEL))
    assert again.figures == result.figures
    assert result.figures["tied"]["init"]["decoder_input"]["cos_target_embedding"] > 0.9
    tied = result.figures["tied"]
    assert result.figures["parts"] == {"at_init": tied["init"]["backbone_output"]["target_minus_random"]["mean"],
                                       "after_training": result.figures["effect"]}
    assert result.figures["effect"] == tied["trained"]["backbone_output"]["target_minus_random"]["mean"]


def test_combine_tests_the_trained_part_and_reports_the_one_at_init():
    from objreg.experiments.base import ExperimentResult

    def seed(at_init, trained):
        return ExperimentResult(wt.NAME, wt.CLAIM, "inconclusive", "r",
                                {"effect": trained, "parts": {"at_init": at_init, "after_training": trained}})

    at_init, trained = [-0.3, 0.01, 0.2], [0.06, 0.05, 0.07]
    result = wt.combine([seed(a, t) for a, t in zip(at_init, trained)], Setting(seed=0))
    assert result.verdict == "confirmed" and list(result.figures["parts"]) == ["after_training"]
    reported = result.figures["at_init_reported"]
    mean = sum(at_init) / 3
    sd = (sum((a - mean) ** 2 for a in at_init) / 2) ** 0.5
    half = 4.302652729911275 * sd / 3 ** 0.5  # t_0.975 with 2 degrees of freedom, from a printed table
    assert reported["mean"] == pytest.approx(mean) and reported["ci95_between_seeds"] == pytest.approx(
        [mean - half, mean + half])
