"""The report's closing lists (:mod:`objreg.cli.assessment`) on reports made by hand."""

from __future__ import annotations

from objreg.cli.assessment import assess


def report(names, architecture="encoder", attention="bidirectional"):
    alignment = {n: {"ci95": [-1.0, 1.0], "conflict_fraction": 0.5} for n in names}
    return {
        "pretrain": list(names), "downstream": "qa", "steps": [],
        "config": {"steps": 6, "seed": 0, "model": "gpt2-dir", "downstream_data": None, "lr": 0.005,
                   "optimizer": "sgd", "head_fit_size": 256, "downstream_examples": 64, "downstream_head": "refit",
                   "architecture": architecture, "objective_attention": {n: attention for n in names}},
        "summary": {"initial_downstream_loss": 3.0, "final_downstream_loss": 2.9, "alignment": alignment,
                    "probes": 6, "taylor_regime": {"inside": True}, "taylor_relative_error": 0.01},
    }


def cannot(given):
    return dict(assess(given))["What it cannot tell"]


def test_a_bidirectional_objective_on_a_decoder_is_said_to_run_bidirectionally():
    (line,) = [x for x in cannot(report(["mlm"], "decoder")) if "bidirectional" in x]
    assert line.startswith("How mlm runs on this decoder") and "not causally" in line
    assert not any("bidirectional" in x for x in cannot(report(["mlm"], "encoder")))
    assert not any("bidirectional" in x for x in cannot(report(["clm"], "decoder", "causal")))


def test_one_objective_transfers_two_transfer():
    assert any(x.startswith("How clm transfers to a real qa benchmark") for x in cannot(report(["clm"])))
    assert any(x.startswith("How mlm and sop transfer to a real qa benchmark") for x in cannot(report(["mlm", "sop"])))
