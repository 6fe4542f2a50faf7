"""screen-validity: its rule over seeds (precondition, confirmed, refuted) on stand-in per-seed
figures, and one quick seed end to end."""

from __future__ import annotations

import json

import pytest

from objreg.experiments import screen_validity
from objreg.experiments.base import ExperimentResult, Setting
from objreg.experiments.replication import conclude

CANDIDATES = ["a", "b", "c", "d"]


def seed_result(outcome, screen, grad_norm, loss_decrease, random):
    signals = {"screen": screen, "screen_per_token": screen, "grad_norm": grad_norm, "loss_decrease": loss_decrease,
               "random": random, "short_run_actual": screen}
    per_task = {task: {"candidates": CANDIDATES, "outcome_improvement": outcome, "signals": signals,
                       "rho": {k: screen_validity.spearman(v, outcome) for k, v in signals.items()}}
                for task in ("qa", "classification")}
    verdict, reason = screen_validity.seed_verdict({"per_task": per_task})
    return ExperimentResult(screen_validity.NAME, screen_validity.CLAIM, verdict, reason,
                            {"per_task": per_task, "effect": per_task["qa"]["rho"]["screen"]})


def test_spearman_is_zero_without_an_order():
    assert screen_validity.spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert screen_validity.spearman([1, 1, 1], [3, 2, 1]) == 0.0


def test_a_screen_that_orders_a_reproducible_outcome_is_confirmed():
    outcome = [4.0, 3.0, 2.0, 1.0]
    results = [seed_result(outcome, [0.4, 0.3, 0.2, 0.1], [1, 4, 2, 3], [2, 1, 4, 3], [1, 3, 4, 2])
               for _ in range(3)]
    combined = conclude(screen_validity, results, Setting())
    assert combined.verdict == "confirmed", combined.reason
    qa = combined.figures["per_task"]["qa"]
    assert qa["outcome_agreement"] == pytest.approx(1.0) and qa["rho"]["screen"]["mean"] == pytest.approx(1.0)


def test_an_outcome_that_does_not_reproduce_is_inconclusive_by_precondition():
    outcomes = [[4.0, 3.0, 2.0, 1.0], [1.0, 2.0, 3.0, 4.0], [4.0, 3.0, 2.0, 1.0]]
    results = [seed_result(o, [0.4, 0.3, 0.2, 0.1], [1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4]) for o in outcomes]
    combined = conclude(screen_validity, results, Setting())
    assert combined.verdict == "inconclusive" and combined.reason.startswith("precondition failed")
    # Pairs of seeds: (0, 1) reversed, (0, 2) equal, (1, 2) reversed; the claim's own figures would confirm.
    checks = {c["name"]: c for c in combined.preconditions}
    assert checks["outcome_reproduces_qa"]["pairs"] == pytest.approx([-1.0, 1.0, -1.0])
    assert checks["outcome_reproduces_qa"]["value"] == pytest.approx(-1 / 3)
    assert not checks["outcome_reproduces_qa"]["passed"] and "would read" in combined.reason


def test_a_screen_that_reverses_the_outcome_is_refuted_and_a_baseline_can_beat_it():
    outcome = [4.0, 3.0, 2.0, 1.0]
    reversed_screen = [seed_result(outcome, [0.1, 0.2, 0.3, 0.4], [1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4])
                       for _ in range(3)]
    refuted = conclude(screen_validity, reversed_screen, Setting())
    assert refuted.verdict == "refuted" and all(c["passed"] for c in refuted.preconditions)
    # The power of the decisive part: every seed's rho is -1, no spread, so three seeds suffice.
    assert refuted.power["part"].startswith("screen_rho_") and refuted.power["mean"] == pytest.approx(-1.0)
    # A perfect screen that a baseline matches is not confirmed: it must beat every baseline.
    matched = [seed_result(outcome, [0.4, 0.3, 0.2, 0.1], [4, 3, 2, 1], [1, 2, 3, 4], [1, 2, 4, 3])
               for _ in range(3)]
    assert conclude(screen_validity, matched, Setting()).verdict == "inconclusive"


@pytest.mark.e2e  # about a minute of training, as the other experiments' quick runs
def test_one_quick_seed_runs_end_to_end(tmp_path):
    result = screen_validity.run(Setting(quick=True, out_dir=tmp_path))
    assert result.verdict in ("confirmed", "refuted", "inconclusive")
    for task in ("qa", "classification"):
        found = result.figures["per_task"][task]
        assert found["candidates"] == sorted(screen_validity.QUICK.candidates)
        assert set(found["rho"]) == {"screen", "screen_per_token", "grad_norm", "loss_decrease", "random",
                                     "short_run_actual"}
        assert all(-1.0 <= r <= 1.0 for r in found["rho"].values())
    assert result.setting["budget"] == screen_validity.QUICK.budget and result.setting["outcome_factor"] == 20
    json.dumps(result.to_dict(), allow_nan=False)
    assert (tmp_path / "screen-validity.png").read_bytes()[:4] == b"\x89PNG"


def test_the_full_setting_reads_squad_for_qa_and_the_built_in_pairs_for_classification(tmp_path, monkeypatch):
    (tmp_path / "squad_v1.1").mkdir()
    (tmp_path / "squad_v1.1" / "dev-v1.1.half-a.json").write_text("{}")
    (tmp_path / "glue" / "SST-2").mkdir(parents=True)
    (tmp_path / "glue" / "SST-2" / "dev.tsv").write_text("sentence\tlabel\n")
    monkeypatch.setenv("OBJREG_SHARED_DATA", str(tmp_path))
    assert screen_validity.data_for("qa", quick=False) == str(tmp_path / "squad_v1.1" / "dev-v1.1.half-a.json")
    assert screen_validity.data_for("classification", quick=False) is None  # SST-2 present, not read
    assert screen_validity.data_for("qa", quick=True) is None
    monkeypatch.setenv("OBJREG_SHARED_DATA", str(tmp_path / "absent"))
    assert screen_validity.data_for("qa", quick=False) is None


def test_each_task_gets_its_own_sets(monkeypatch):
    full = screen_validity.FULL
    assert screen_validity.sizes_for(full, "qa") == {"batch_size": 8, "seq_len": 64, "eval_size": 32,
                                                     "head_fit_size": 64}
    assert screen_validity.sizes_for(full, "classification") == {"batch_size": 8, "seq_len": 64, "eval_size": 256,
                                                                 "head_fit_size": 512}
    assert screen_validity.sizes_for(screen_validity.QUICK, "classification")["eval_size"] == 16
    asked = []

    class Stop(Exception):
        pass

    def recording_screen(candidates, task, **kwargs):
        asked.append((task, kwargs["eval_size"], kwargs["head_fit_size"]))
        raise Stop

    monkeypatch.setattr(screen_validity, "FULL", screen_validity.Config(
        candidates=("mlm",), budget=2, tasks=("classification",), eval_size=32, head_fit_size=64,
        classification_eval_size=256, classification_head_fit_size=512))
    monkeypatch.setattr(screen_validity, "screen", recording_screen)
    with pytest.raises(Stop):
        screen_validity.run(Setting(quick=False, device="cpu"))
    assert asked == [("classification", 256, 512)]
