"""adaptive-mixture: the verdict over seeds, and one tiny real seed."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import stats

from objreg.experiments import adaptive_mixture as am
from objreg.experiments.base import ExperimentResult, Setting

CONDITIONS = ("uniform", "best_fixed", "adaptive_quadratic", "adaptive_tartan")


def seed_result(seed, final):
    """A per-seed result with the figures ``combine`` reads."""
    figures = {
        "effect": final["best_fixed"] - final["adaptive_quadratic"],
        "final_downstream_loss": final,
        "differences": {f"{r}_vs_{b}": final[b] - final[r] for r in CONDITIONS[2:] for b in CONDITIONS[:2]},
        "overhead": {"adaptive_quadratic": 3.0 + seed, "adaptive_tartan": 3.5},
        "seconds_per_step": dict.fromkeys(CONDITIONS, 0.1),
        "grid_search": {"best_mlm_weight": 1.5},
        "adaptive_report": {rule: {"beat_best_constant": seed == 0, "oscillating": ["mlm"] if seed == 2 else []}
                            for rule in CONDITIONS[2:]},
    }
    return ExperimentResult(am.NAME, am.CLAIM, "confirmed", "", figures, {"seed": seed})


def test_combine_decides_from_the_t_interval_of_the_effect():
    finals = [dict(zip(CONDITIONS, row)) for row in ([3.0, 2.9, 2.80, 2.95], [3.1, 3.0, 2.85, 3.0],
                                                     [2.9, 2.8, 2.72, 2.9])]
    combined = am.combine([seed_result(i, f) for i, f in enumerate(finals)], Setting(quick=True))
    effects = np.array([f["best_fixed"] - f["adaptive_quadratic"] for f in finals])
    half = stats.t.ppf(0.975, 2) * effects.std(ddof=1) / np.sqrt(3)
    assert combined.figures["effect_interval"]["ci95"] == pytest.approx([effects.mean() - half,
                                                                          effects.mean() + half])
    assert combined.verdict == "confirmed"
    assert combined.figures["overhead"]["adaptive_quadratic"]["mean"] == pytest.approx(4.0)
    assert combined.figures["adaptive_report"]["adaptive_tartan"] == {"beat_best_constant": 1, "oscillated": 1,
                                                                      "seeds": 3}
    # Adaptive ending higher than the best fixed weights on every seed refutes.
    worse = [{**f, "adaptive_quadratic": f["best_fixed"] + 0.1 + 0.01 * i} for i, f in enumerate(finals)]
    assert am.combine([seed_result(i, f) for i, f in enumerate(worse)], Setting(quick=True)).verdict == "refuted"
    mixed = [{**f, "adaptive_quadratic": f["best_fixed"] + d} for f, d in zip(finals, (0.1, -0.1, 0.02))]
    assert am.combine([seed_result(i, f) for i, f in enumerate(mixed)], Setting(quick=True)).verdict == "inconclusive"
    json.dumps(combined.to_dict(), allow_nan=False)


def test_the_best_fixed_weight_is_the_grid_point_with_the_lowest_loss():
    assert am.best_weight({0.0: 2.7, 0.5: 2.6, 1.0: 2.65, 1.5: 2.61}) == 0.5
    assert am.best_weight({0.5: 2.6, 1.0: 2.6, 2.0: 2.6}) == 1.0  # a tie goes to uniform


@pytest.mark.e2e
def test_one_tiny_seed_trains_every_condition(monkeypatch):
    monkeypatch.setattr(am, "QUICK", am.Config(steps=2, probe_every=1, lr=5e-3, batch_size=4, seq_len=48,
                                               eval_size=8, head_warmup_steps=2, head_fit_size=16, grid=(0.5,)))
    result = am.run(Setting(quick=True, seed=0, device="cpu"))
    figures = result.figures
    final = figures["final_downstream_loss"]
    assert set(final) == set(CONDITIONS)
    assert figures["effect"] == pytest.approx(final["best_fixed"] - final["adaptive_quadratic"])
    search = figures["grid_search"]["final_downstream_loss_by_mlm_weight"]
    assert list(search) == ["0.5"] and figures["grid_search"]["best_mlm_weight"] == 0.5
    for rule in ("adaptive_quadratic", "adaptive_tartan"):
        weights = figures["adaptive_weights"][rule]
        assert [a + b for a, b in zip(weights["mlm"], weights["sop"])] == pytest.approx([2.0] * 2)
        assert isinstance(figures["adaptive_report"][rule]["beat_best_constant"], bool)
    json.dumps(result.to_dict(), allow_nan=False)


@pytest.mark.parametrize("head", ["refit", "frozen"])
def test_the_downstream_head_is_named_to_the_analyzer_and_recorded(stopping_analyze, head):
    calls = stopping_analyze(am)
    config = am.Config(steps=2, probe_every=1, lr=5e-3, batch_size=4, seq_len=48, eval_size=8, head_warmup_steps=2,
                       head_fit_size=16, downstream_head=head)
    with pytest.raises(RuntimeError, match="analyze called"):
        am._train(config, Setting(quick=True, seed=0, device="cpu"), None, 0, weights={"mlm": 1.0, "sop": 1.0})
    assert [c["downstream_head"] for c in calls] == [head]
    assert am._setting(config, Setting(quick=True, seed=0))["downstream_head"] == head
    assert am.FULL.downstream_head == "refit"
