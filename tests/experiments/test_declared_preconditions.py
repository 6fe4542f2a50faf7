"""The preconditions the experiments declare read the figures they name, and a failed one turns a
verdict the claim's figures would give into an inconclusive one (checked on hand-made seeds)."""

from __future__ import annotations

import pytest

from objreg.experiments import char_noise_robustness as cn
from objreg.experiments import consistency_collapse as cc
from objreg.experiments import entropy_masking as em
from objreg.experiments import rtd_efficiency as rtd
from objreg.experiments import weight_tying as wt
from objreg.experiments.base import ExperimentResult, Setting
from objreg.experiments.replication import conclude


def _seed(module, effect: float, figures: dict, seed: int) -> ExperimentResult:
    # A claim of several parts reads each from figures["parts"]: every part ``effect`` beyond its threshold.
    parts = {key: threshold + effect for key, (threshold, _) in getattr(module, "PARTS", {}).items()}
    if module is wt:
        parts["at_init"] = 0.0  # reported, not tested
    figures = {"effect": effect, **figures, **({"parts": parts} if parts else {})}
    return ExperimentResult(module.NAME, module.CLAIM, "confirmed", "r", figures, {"seed": seed})


def _rtd_figures(final: dict[str, float]) -> dict:
    # The frozen probe's curve (deciding nothing) sits at chance; the fine-tuned accuracies decide.
    return {"accuracy": {"untrained": 0.55, **final},
            "probe_accuracy": {"untrained": 0.5, **{arm: [0.5, 0.52, 0.54] for arm in rtd.ARMS}}}


def _cn_figures(clean: dict[str, float]) -> dict:
    return {"accuracy": {arm: {"clean": clean[arm], "misspelled": clean[arm] - 0.05} for arm in cn.ARMS}}


def _cc_figures(no_sg: float) -> dict:
    arm = {"stop_gradient": {"init": 0.6, "trained": 0.9}, "no_stop_gradient": {"init": 0.6, "trained": no_sg}}
    return {"normalised_std": {"simsiam": arm, "no_batch_norm": arm}}


@pytest.mark.parametrize(("module", "figures", "expected", "passes"), [
    # rtd-efficiency: the lowest arm's fine-tuned accuracy after pre-training.
    (rtd, _rtd_figures({"mlm": 0.71, "rtd": 0.64, "rtd15": 0.68}), 0.64, True),
    (rtd, _rtd_figures({"mlm": 0.71, "rtd": 0.75, "rtd15": 0.58}), 0.58, False),
    # char-noise-robustness: the lower clean-text accuracy of the two models.
    (cn, _cn_figures({"clean": 0.66, "char_noise": 0.62}), 0.62, True),
    (cn, _cn_figures({"clean": 0.53, "char_noise": 0.70}), 0.53, False),
    # consistency-collapse: the no-stop-gradient run with SimSiam's heads must collapse.
    (cc, _cc_figures(0.02), 0.02, True),
    (cc, _cc_figures(0.98), 0.98, False),
    # weight-tying: the tied model's training loss fell; entropy-masking: both twins' did.
    (wt, {"tied": {"training_loss": {"first": 8.6, "last": 6.2, "steps": 300}}}, 2.4, True),
    (wt, {"tied": {"training_loss": {"first": 8.6, "last": 8.1, "steps": 300}}}, 0.5, False),
    (em, {"training_loss": {"uniform": {"first": 8.6, "last": 6.2}, "entropy": {"first": 8.6, "last": 7.2}}}, 1.4, True),
    (em, {"training_loss": {"uniform": {"first": 8.6, "last": 6.2}, "entropy": {"first": 8.6, "last": 7.9}}}, 0.7, False),
])
def test_each_precondition_reads_its_figure(module, figures, expected, passes):
    [precondition] = module.PRECONDITIONS
    result = _seed(module, 0.0, figures, 0)
    assert precondition.value(result) == pytest.approx(expected)
    seeds = [_seed(module, effect, figures, s) for s, effect in enumerate((10.0, 11.0, 12.0))]
    overall = conclude(module, seeds, Setting(seed=0))
    [check] = overall.preconditions
    assert check["passed"] is passes and check["value"] == pytest.approx(expected)
    # The seeds' effects lie far above every threshold: confirmed unless the precondition failed.
    assert overall.verdict == ("confirmed" if passes else "inconclusive")


def test_a_failed_positive_control_never_leaves_a_refutation():
    seeds = [_seed(cc, effect, _cc_figures(0.97), s) for s, effect in enumerate((-0.01, 0.0, 0.01))]
    overall = conclude(cc, seeds, Setting(seed=0))
    assert overall.verdict == "inconclusive" and "would read refuted" in overall.reason
    assert overall.reason.startswith("precondition failed: no_stop_gradient_collapses")
