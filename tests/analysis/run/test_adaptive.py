"""Adaptive weight rules: their updates against closed forms, their bounds and state, the
trainer that uses them (resumed = uninterrupted), and their options' errors."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest

import objreg
from objreg.analysis.run.adaptive import QuadraticRule, TartanRule, adaptive_summary, make_rule, resolved_first

LR = 0.1
START = {"mlm": 1.0, "sop": 1.0}


def sgd_record(dots, s=(0.0, 0.0, 0.0), weights=START, half_widths=None):
    """A probe record with what the SGD model reads: each ``c_k`` and ``S``, and with
    ``half_widths`` each dot's 95% interval over its batch."""
    alignment = {n: {"dot": d} for n, d in zip(START, dots)}
    for (n, d), h in zip(zip(START, dots), half_widths or ()):
        alignment[n]["ci95"] = [d - h, d + h]
    return {"weights": dict(weights), "alignment": alignment,
            "second_order": {"mlm,mlm": s[0], "mlm,sop": s[1], "sop,sop": s[2]}}


def test_quadratic_rule_moves_to_the_edge_of_the_trust_region_under_a_linear_model():
    rule = QuadraticRule(START, optimizer="sgd", lr=LR, radius=0.25, smoothing=0.0)
    assert rule.update(sgd_record([2.0, -1.0])) == pytest.approx({"mlm": 1.5, "sop": 0.5})
    assert rule.update(sgd_record([2.0, -1.0])) == pytest.approx({"mlm": 2.0, "sop": 0.0})  # 0 bounds it


def test_quadratic_rule_stops_where_the_curvature_balances_the_gain():
    # Improvement per step η(2α₀ − α₁) − ½η²·400(α₀² + α₁²) on α₀ + α₁ = 2: α₀ − α₁ = 3/(400η) = 0.075.
    rule = QuadraticRule(START, optimizer="sgd", lr=LR, radius=0.25, smoothing=0.0)
    weights = rule.update(sgd_record([2.0, -1.0], s=(400.0, 0.0, 400.0)))
    assert weights == pytest.approx({"mlm": 1.0375, "sop": 0.9625}, abs=1e-12)


def test_smoothing_averages_the_models_of_the_probes():
    rule = QuadraticRule(START, optimizer="sgd", lr=LR, radius=0.25, smoothing=0.75)
    rule.update(sgd_record([2.0, -1.0]))
    rule.update(sgd_record([-2.0, 3.0]))
    assert list(rule.model.first) == pytest.approx([-LR * (0.75 * 2 - 0.25 * 2), -LR * (-0.75 + 0.25 * 3)])


def test_tartan_rule_is_a_multiplicative_update_rescaled_to_the_total():
    rule = TartanRule(START, optimizer="sgd", lr=LR, rate=0.5, smoothing=0.0)
    weights = rule.update(sgd_record([2.0, -1.0]))
    # α ∝ exp(rate · c / max|c|) = (e^0.5, e^-0.25), scaled to a total of 2.
    up, down = math.exp(0.5), math.exp(-0.25)
    assert weights == pytest.approx({"mlm": 2 * up / (up + down), "sop": 2 * down / (up + down)}, rel=1e-12)


@pytest.mark.parametrize("name", ["quadratic", "tartan"])
def test_rules_hold_still_on_dots_their_batches_cannot_tell_apart(name):
    """Single-batch dots that flip sign within their noise: unshrunk, the rules chase each flip
    (the quadratic rule from bound to bound); shrunk by the batches' intervals, they hold."""
    flips = [sgd_record([d, -d], half_widths=[3.0, 3.0]) for d in (1.0, -1.0, 1.2, -0.8, 1.0, -1.1)]
    noisy = make_rule(name, START, optimizer="sgd", lr=LR, smoothing=0.0)
    chased = make_rule(name, START, optimizer="sgd", lr=LR, smoothing=0.0)
    held = [noisy.update(r) for r in flips]
    chasing = [chased.update({**r, "alignment": {n: {"dot": a["dot"]} for n, a in r["alignment"].items()}})
               for r in flips]
    assert all(w == pytest.approx(START) for w in held)
    assert adaptive_summary(name, list(START), [START, *held], _counterfactual())["oscillating"] == []
    summary = adaptive_summary(name, list(START), [START, *chasing], _counterfactual())
    assert summary["oscillating"] == ["mlm", "sop"] and summary["reversals"]["mlm"] >= 4
    assert "oscillated (mlm reversed" in summary["warning"]


def test_a_resolved_signal_still_moves_the_weights():
    # The same dots with intervals that exclude each other: the quadratic rule moves as unshrunk.
    rule = QuadraticRule(START, optimizer="sgd", lr=LR, radius=0.25, smoothing=0.0)
    assert rule.update(sgd_record([2.0, -1.0], half_widths=[0.5, 0.5])) == pytest.approx({"mlm": 1.5, "sop": 0.5})
    # The shrinkage is soft thresholding of each coefficient's difference from their mean by its error.
    # Mean −0.2, differences (−1.8, 1.2, 0.6) shrunk by (0.5, 2.0, 0.1) to (−1.3, 0, 0.5).
    assert resolved_first(np.array([-2.0, 1.0, 0.4]), np.array([0.5, 2.0, 0.1])) == pytest.approx([-1.5, -0.2, 0.3])


def _counterfactual(used=0.1, best=0.2):
    return {"used": {"first_plus_second_order": used}, "best": {"first_plus_second_order": best},
            "constant_mean_weights": {"first_plus_second_order": best}}


def test_the_summary_says_whether_the_rule_beat_the_best_constant_weights():
    steps = [START, {"mlm": 1.5, "sop": 0.5}, {"mlm": 1.5, "sop": 0.5}, {"mlm": 2.0, "sop": 0.0}]
    beaten = adaptive_summary("quadratic", list(START), steps, _counterfactual(used=0.1, best=0.2))
    assert beaten["beat_best_constant"] is False and beaten["warning"] is None
    assert beaten["moves"] == {"mlm": 2, "sop": 2} and beaten["reversals"] == {"mlm": 0, "sop": 0}
    assert adaptive_summary("quadratic", list(START), steps, _counterfactual(used=0.3, best=0.2))[
        "beat_best_constant"] is True


def test_both_rules_keep_the_total_and_the_bounds():
    for rule in ("quadratic", "tartan"):
        adaptive = make_rule(rule, START, optimizer="sgd", lr=LR, min_weight=0.7, max_weight=1.25, rate=3.0,
                             radius=0.5)
        for _ in range(4):
            weights = adaptive.update(sgd_record([5.0, -5.0]))
            assert sum(weights.values()) == pytest.approx(2.0)
            assert all(0.7 - 1e-12 <= w <= 1.25 + 1e-12 for w in weights.values())
        assert weights["mlm"] == pytest.approx(1.25)


def test_a_rule_restored_from_its_state_continues_identically():
    records = [sgd_record([2.0, -1.0], s=(50.0, 1.0, 30.0)), sgd_record([-1.0, 0.5], s=(40.0, 2.0, 10.0))]
    for name in ("quadratic", "tartan"):
        whole = make_rule(name, START, optimizer="sgd", lr=LR)
        whole.update(records[0])
        restored = make_rule(name, START, optimizer="sgd", lr=LR)
        restored.load_state_dict(copy.deepcopy(whole.state_dict()))
        assert restored.update(records[1]) == whole.update(records[1])


def test_the_trainer_uses_the_rules_weights_and_resumes_exactly(tiny_trainer):
    def trainer():
        made = tiny_trainer("sgd", lr=1e-3, steps=4)
        made.adaptive = make_rule("quadratic", START, optimizer="sgd", lr=1e-3, radius=0.2)
        made.weights_by_step = []
        return made

    whole = trainer()
    records = whole.run()
    # The weights of step t+1 are what the rule makes of step t's record (every step probed).
    replay = make_rule("quadratic", START, optimizer="sgd", lr=1e-3, radius=0.2)
    expected = [dict(START)] + [replay.update(r) for r in records[:-1]]
    assert whole.weights_by_step == expected
    assert [r["weights"] for r in records] == expected
    assert len({tuple(w.values()) for w in expected}) > 1

    class Stop(Exception):
        pass

    def stop_after_two(step, record):
        if step == 1:
            raise Stop

    first = trainer()
    with pytest.raises(Stop):
        first.run(stop_after_two)
    state = copy.deepcopy(first.state_dict())
    resumed = trainer()
    resumed.load_state_dict(state)
    rest = resumed.run()
    assert resumed.weights_by_step == whole.weights_by_step
    assert [r["actual_delta"] for r in rest] == [r["actual_delta"] for r in records[2:]]


@pytest.mark.parametrize("settings,message", [
    ({"trust_radius": 0}, "trust_radius must be a finite number > 0"),
    ({"adaptive_rate": -1.0}, "adaptive_rate must be a finite number > 0"),
    ({"adaptive_smoothing": 1.0}, r"adaptive_smoothing must be in \[0, 1\)"),
    ({"min_weight": -0.1}, "min_weight must be a finite number ≥ 0"),
    ({"min_weight": 0.5, "max_weight": 0.5}, "max_weight must be a finite number above min_weight"),
    ({"min_weight": 1.5}, "cannot hold the total weight 2"),
    ({"schedule": "adaptive:greedy"}, "unknown adaptive rule 'greedy', expected quadratic or tartan"),
    ({"schedule": "mlm=adaptive,sop=constant"}, "an adaptive schedule sets every objective's weight"),
])
def test_bad_adaptive_settings_are_one_clear_error(settings, message):
    with pytest.raises(objreg.InvalidParameterError, match=message):
        objreg.AnalysisConfig(pretrain=("mlm", "sop"), **settings)


@pytest.mark.e2e
def test_an_interrupted_adaptive_run_resumes_to_the_uninterrupted_report(tmp_path):
    # quadratic: its second-order term moves the weights even where 4 rows a batch leave the
    # first-order signal within its noise (which holds tartan's weights still).
    settings = dict(steps=3, batch_size=4, seq_len=48, eval_size=8, head_fit_size=16,
                    optimizer="adam", lr=1e-3, schedule="adaptive:quadratic")

    class Stop(Exception):
        pass

    def stop_after_one(step, record):
        raise Stop

    whole = objreg.analyze("mlm,sop", "qa", **settings, out_dir=tmp_path / "whole")
    with pytest.raises(Stop):
        objreg.analyze("mlm,sop", "qa", **settings, out_dir=tmp_path / "cut", on_step=stop_after_one)
    resumed = objreg.analyze(resume=tmp_path / "cut")
    assert resumed.to_json() == whole.to_json()
    assert len(set(whole.summary["weights_by_step"]["mlm"])) == 3  # the rule moved the weights every probe
