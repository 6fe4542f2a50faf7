"""The experiment framework: verdicts from intervals, results, the registry and ``run``."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

import objreg
from objreg.experiments import _support, base


@pytest.mark.parametrize(
    ("low", "high", "threshold", "claim", "expected"),
    [
        (0.1, 0.3, 0.0, "above", "confirmed"),
        (-0.3, -0.1, 0.0, "above", "refuted"),
        (-0.1, 0.3, 0.0, "above", "inconclusive"),
        (1.2, 1.5, 1.0, "below", "refuted"),
        (0.2, 0.9, 1.0, "below", "confirmed"),
        (0.9, 1.1, 1.0, "below", "inconclusive"),
    ],
)
def test_verdict_from_interval(low, high, threshold, claim, expected):
    assert base.verdict_from_interval(low, high, threshold, claim) == expected


def test_verdict_rejects_an_unknown_direction():
    with pytest.raises(ValueError, match="'above' or 'below'"):
        base.verdict_from_interval(0, 1, claim="sideways")


def test_result_rejects_an_unknown_verdict():
    with pytest.raises(ValueError, match="confirmed, refuted, inconclusive"):
        base.ExperimentResult("x", "claim", "probably", "why", {})


def test_setting_picks_sizes():
    assert base.Setting(quick=True).size(2, 20) == 2
    assert base.Setting(quick=False).size(2, 20) == 20


def draw(seed: int) -> float:
    import torch

    return 1.0 + float(torch.randn(1, generator=torch.Generator().manual_seed(seed)))


# t_{0.975} for 2 and 4 degrees of freedom, from a printed t table (not from scipy).
T_975 = {2: 4.302652729911275, 4: 2.7764451051977987}


@pytest.mark.parametrize("seeds", [3, 5])
def test_default_combine_is_the_mean_with_a_between_seed_t_interval(stand_in_experiment, seeds):
    _, calls = stand_in_experiment
    result = objreg.experiments.run("stand-in", seeds=seeds, seed=7, quick=True)
    assert [c.seed for c in calls] == list(range(7, 7 + seeds))
    effects = [draw(s) for s in range(7, 7 + seeds)]
    mean = sum(effects) / seeds
    sd = math.sqrt(sum((e - mean) ** 2 for e in effects) / (seeds - 1))
    half = T_975[seeds - 1] * sd / math.sqrt(seeds)
    assert result.figures["effect"] == pytest.approx(mean)
    assert result.figures["effect_ci95_between_seeds"] == pytest.approx([mean - half, mean + half])
    assert result.figures["per_seed_effect"] == pytest.approx(effects)
    assert result.verdict == base.verdict_from_interval(mean - half, mean + half, 0.5)
    replicates = result.to_dict()["replicates"]
    assert [r["setting"]["seed"] for r in replicates] == list(range(7, 7 + seeds))
    assert [r["figures"]["effect"] for r in replicates] == pytest.approx(effects)
    assert result.setting["seeds"] == list(range(7, 7 + seeds))
    assert result.source == "the test suite" and result.rule.startswith("the between-seed")


def test_the_interval_decides_not_the_seeds(stand_in_experiment):
    # Seeds 0..2 draw 2.54, 1.66, 1.39 (each above 1.2) but the t-interval over three straddles 1.2.
    module, _ = stand_in_experiment
    module.THRESHOLD = 1.2
    result = objreg.experiments.run("stand-in", seeds=3, seed=0, quick=True)
    low, high = result.figures["effect_ci95_between_seeds"]
    assert low < 1.2 < high and result.verdict == "inconclusive"
    module.DIRECTION = "below"
    module.THRESHOLD = 10.0
    assert objreg.experiments.run("stand-in", seeds=3, seed=0, quick=True).verdict == "confirmed"


def test_one_seed_keeps_its_own_verdict_and_says_so(stand_in_experiment):
    module, _ = stand_in_experiment
    module.THRESHOLD = 100.0  # the default combine would refute; one seed keeps its own verdict
    result = objreg.experiments.run("stand-in", seeds=1, seed=0, quick=True)
    assert result.verdict == "confirmed" and "only one seed" in result.reason
    assert len(result.replicates) == 1


def test_default_seeds(stand_in_experiment):
    _, calls = stand_in_experiment
    objreg.experiments.run("stand-in", quick=True)
    assert len(calls) == 1
    objreg.experiments.run("stand-in", quick=False)
    assert len(calls) == 1 + 3 and all(not c.quick for c in calls[1:])


def test_a_module_combine_replaces_the_default(stand_in_experiment):
    module, _ = stand_in_experiment
    seen = []

    def combine(results, setting):
        seen.append((len(results), setting.seed))
        return base.ExperimentResult("stand-in", module.CLAIM, "refuted", "all seeds must agree", {"effect": -1.0})

    module.combine = combine
    result = objreg.experiments.run("stand-in", seeds=2, seed=4, quick=True)
    assert seen == [(2, 4)] and result.verdict == "refuted" and result.reason == "all seeds must agree"
    assert len(result.replicates) == 2 and result.source == "the test suite"


def test_a_seed_without_an_effect_is_an_error(stand_in_experiment):
    module, _ = stand_in_experiment
    plain = module.run
    module.run = lambda setting: base.ExperimentResult("stand-in", "c", "confirmed", "r", {"other": 1.0})
    with pytest.raises(ValueError, match="figures\\['effect'\\]"):
        objreg.experiments.run("stand-in", seeds=2)
    module.run = plain


def test_run_writes_result_json_and_plots(stand_in_experiment, tmp_path):
    out = tmp_path / "a" / "b"
    result = objreg.experiments.run("stand-in", seeds=2, seed=3, quick=True, out_dir=out)
    written = json.loads((out / "result.json").read_text())
    assert written == result.to_dict()
    assert set(written) == {"name", "claim", "source", "rule", "verdict", "reason", "figures", "setting", "plots",
                            "replicates", "timing", "preconditions", "power"}
    assert written["power"]["part"] == "effect" and written["power"]["seeds"] == 2
    assert written["preconditions"] == [] and all(r["power"] is None for r in written["replicates"])
    assert written["timing"]["cpu_s"] >= 0 and written["timing"]["wall_s"] > 0
    assert written["timing"]["wall_s"] == pytest.approx(sum(r["timing"]["wall_s"] for r in written["replicates"]))
    assert written["setting"] == {"quick": True, "seeds": [3, 4]}
    assert (out / "stand-in-seeds.png").stat().st_size > 1000
    assert (out / "seed-3" / "stand-in.png").is_file() and (out / "seed-4" / "stand-in.png").is_file()
    assert str(out / "seed-4" / "stand-in.png") in written["plots"]
    # Same seeds, same figures.
    assert objreg.experiments.run("stand-in", seeds=2, seed=3, quick=True).figures == result.figures


def test_run_all_writes_every_experiment(stand_in_experiment, monkeypatch, tmp_path):
    module, calls = stand_in_experiment
    monkeypatch.setattr(objreg.experiments, "EXPERIMENTS", {"stand-in": module.__name__})
    results = objreg.experiments.run_all(tmp_path / "all", seeds=2, quick=True)
    assert list(results) == ["stand-in"] and len(calls) == 2
    assert json.loads((tmp_path / "all" / "stand-in" / "result.json").read_text()) == results["stand-in"].to_dict()


@pytest.mark.parametrize(("seeds", "seed", "message"), [
    (0, 0, "seeds must be a positive integer, got 0"),
    (-2, 0, "seeds must be a positive integer, got -2"),
    (10**6, 0, "seeds must be at most 64, got 1,000,000"),
    ("3", 0, "seeds must be a positive integer, got str '3'"),
    (2.0, 0, "seeds must be a positive integer, got float"),
    (True, 0, "seeds must be a positive integer, got bool"),
    (3, -1, "seed must be an integer ≥ 0"),
    (3, 2**32 - 2, "seed + seeds − 1 must be at most 4,294,967,295"),
])
def test_bad_seeds_are_refused_before_anything_runs(stand_in_experiment, tmp_path, seeds, seed, message):
    _, calls = stand_in_experiment
    with pytest.raises(objreg.InvalidParameterError, match=re.escape(message)):
        objreg.experiments.run("stand-in", seeds=seeds, seed=seed, out_dir=tmp_path / "out")
    with pytest.raises(objreg.InvalidParameterError, match=re.escape(message)):
        objreg.experiments.run_all(tmp_path / "all", seeds=seeds, seed=seed)
    assert not calls and not (tmp_path / "out").exists() and not (tmp_path / "all").exists()


def test_run_refuses_a_file_as_out_dir(stand_in_experiment, tmp_path):
    _, calls = stand_in_experiment
    target = tmp_path / "file"
    target.write_text("keep me")
    with pytest.raises(objreg.InvalidParameterError, match="not a directory"):
        objreg.experiments.run("stand-in", out_dir=target)
    assert target.read_text() == "keep me"
    assert not calls  # refused before running


def test_unknown_experiment_lists_the_known_ones(stand_in_experiment):
    with pytest.raises(objreg.UnknownNameError, match="stand-in"):
        objreg.experiments.run("stand-i")


def test_every_registered_experiment_has_the_contract():
    for name in objreg.experiments.names():
        module = objreg.experiments.module(name)
        assert module.NAME == name
        for attribute in ("CLAIM", "SOURCE", "RULE"):
            assert isinstance(getattr(module, attribute), str) and len(getattr(module, attribute)) > 20, (name,
                                                                                                          attribute)
        assert getattr(module, "DIRECTION", "above") in ("above", "below")
        assert isinstance(getattr(module, "THRESHOLD", 0.0), float)
        assert callable(module.run)
        assert module.__doc__ and len(module.__doc__) > 200, f"{name}: the docstring states claim, source, setting"


def _seeds(effects, parts=None):
    return [base.ExperimentResult("x", "c", "inconclusive", "r",
                                  {"effect": e, **({"parts": {"a": p}} if parts else {})})
            for e, p in zip(effects, parts or effects)]


def test_combine_equivalence_reads_the_between_seed_interval_against_the_margin():
    from objreg.experiments.replication import combine_equivalence

    inside = combine_equivalence(_seeds([2.9, 3.0, 3.1]), base.Setting(), 2.5, 3.5)
    half = T_975[2] * 0.1 / math.sqrt(3)
    assert inside.figures["effect_ci95_between_seeds"] == pytest.approx([3.0 - half, 3.0 + half])
    assert inside.verdict == "confirmed" and inside.figures["margin"] == [2.5, 3.5]
    assert combine_equivalence(_seeds([1.9, 2.0, 2.1]), base.Setting(), 2.5, 3.5).verdict == "refuted"
    assert combine_equivalence(_seeds([2.0, 3.0, 4.0]), base.Setting(), 2.5, 3.5).verdict == "inconclusive"


def test_combine_parts_needs_every_part():
    from objreg.experiments.replication import combine_parts

    parts = {"a": (0.0, "above")}
    assert combine_parts(_seeds([1.0, 1.1, 0.9], [0.5, 0.6, 0.4]), base.Setting(), parts).verdict == "confirmed"
    assert combine_parts(_seeds([1.0, 1.1, 0.9], [-0.5, -0.6, -0.4]), base.Setting(), parts).verdict == "refuted"
    result = combine_parts(_seeds([1.0, 1.1, 0.9], [-0.5, 0.6, 0.1]), base.Setting(), parts)
    assert result.verdict == "inconclusive" and result.figures["parts"]["a"]["mean"] == pytest.approx(0.2 / 3)


def test_shared_data_is_the_environment_variable_else_shared_data_beside_the_checkout(monkeypatch, tmp_path):
    monkeypatch.setenv("OBJREG_SHARED_DATA", str(tmp_path))
    assert _support.shared_data() == tmp_path
    monkeypatch.delenv("OBJREG_SHARED_DATA")
    checkout = Path(objreg.__file__).resolve().parents[2]  # src/objreg/__init__.py
    assert _support.shared_data() == checkout.parent / "shared" / "data"


def test_the_tests_find_the_shared_data_where_the_experiments_do(shared_file, monkeypatch, tmp_path):
    (tmp_path / "glue").mkdir()
    (tmp_path / "glue" / "dev.tsv").write_text("sentence\tlabel\n")
    monkeypatch.setenv("OBJREG_SHARED_DATA", str(tmp_path))
    assert shared_file("glue/dev.tsv") == tmp_path / "glue" / "dev.tsv"
    with pytest.raises(pytest.skip.Exception, match="absent"):
        shared_file("glue/missing.tsv")


def test_power_is_that_of_the_between_seed_test(stand_in_experiment):
    from objreg.experiments import power

    result = objreg.experiments.run("stand-in", seeds=5, seed=0, quick=True)
    effects = [draw(s) for s in range(5)]
    expected = power.power_of(effects, 0.5)
    assert result.power["n80"] == expected["n80"] and result.power["mde"] == pytest.approx(expected["mde"])
    assert result.power["threshold"] == 0.5 and result.power["verdict"] == result.verdict


def _precondition(threshold: float, direction: str = "above"):
    from objreg.experiments.preconditions import Precondition

    return Precondition("control", "the stand-in's effect itself, as a control", threshold, direction,
                        lambda figures, setting: figures["effect"])


def test_a_failed_precondition_makes_the_verdict_inconclusive_never_refuted(stand_in_experiment):
    module, _ = stand_in_experiment
    module.THRESHOLD = 100.0  # the claim alone would be refuted over seeds 0..4
    assert objreg.experiments.run("stand-in", seeds=5, seed=0, quick=True).verdict == "refuted"
    module.PRECONDITIONS = (_precondition(5.0),)  # every draw lies far below 5
    result = objreg.experiments.run("stand-in", seeds=5, seed=0, quick=True)
    assert result.verdict == "inconclusive"
    assert result.reason.startswith("precondition failed: control (the stand-in's effect itself, as a control)")
    assert "would read refuted" in result.reason
    [check] = result.preconditions
    effects = [draw(s) for s in range(5)]
    mean = sum(effects) / 5
    sd = math.sqrt(sum((e - mean) ** 2 for e in effects) / 4)
    half = T_975[4] * sd / math.sqrt(5)
    assert check["value"] == pytest.approx(mean) and check["per_seed"] == pytest.approx(effects)
    assert check["ci95_between_seeds"] == pytest.approx([mean - half, mean + half])
    assert check["threshold"] == 5.0 and check["passed"] is False and check["seeds_holding"] == 0
    assert all(r["verdict"] == "inconclusive" and not r["preconditions"][0]["passed"] for r in result.replicates)
    assert result.power["verdict"] == "refuted"  # the claim's own test, reported beside the failed control


def test_a_precondition_holds_only_when_every_seed_holds_it(stand_in_experiment):
    module, _ = stand_in_experiment
    # Seeds 0..2 draw 2.54, 1.66, 1.39: seed 2 alone lies below 1.5.
    module.PRECONDITIONS = (_precondition(1.5),)
    result = objreg.experiments.run("stand-in", seeds=3, seed=0, quick=True)
    [check] = result.preconditions
    assert check["seeds_holding"] == 2 and not check["passed"] and result.verdict == "inconclusive"
    assert [r["preconditions"][0]["passed"] for r in result.replicates] == [True, True, False]
    assert check["value"] > 1.5  # the mean holds it; seed 2 does not
    module.PRECONDITIONS = (_precondition(1.2),)
    result = objreg.experiments.run("stand-in", seeds=3, seed=0, quick=True)
    del module.PRECONDITIONS
    unchecked = objreg.experiments.run("stand-in", seeds=3, seed=0, quick=True)
    assert result.preconditions[0]["passed"] and "precondition" not in result.reason
    assert (result.verdict, result.reason) == (unchecked.verdict, unchecked.reason)
    module.PRECONDITIONS = (_precondition(0.2, "below"),)
    assert objreg.experiments.run("stand-in", seeds=1, seed=0, quick=True).verdict == "inconclusive"


def test_one_seed_says_once_which_precondition_failed(stand_in_experiment):
    module, _ = stand_in_experiment
    module.PRECONDITIONS = (_precondition(5.0),)
    result = objreg.experiments.run("stand-in", seeds=1, seed=0, quick=True)
    assert result.verdict == "inconclusive" and result.reason.count("precondition failed") == 1
    assert result.reason.startswith("only one seed was run") and result.reason.count("Without it") == 1
    [check] = result.preconditions
    assert check["passed"] is False and check["per_seed"] == pytest.approx([draw(0)])


def test_recombine_rebuilds_the_overall_result_from_the_seeds(stand_in_experiment):
    from objreg.experiments.replication import recombine

    module, calls = stand_in_experiment
    committed = objreg.experiments.run("stand-in", seeds=3, seed=0, quick=False).to_dict()
    ran = len(calls)
    with pytest.warns(UserWarning, match="kept as recorded"):
        assert recombine(module, committed).to_dict() == committed
    module.PRECONDITIONS = (_precondition(5.0),)  # a precondition declared later reads the seeds' figures
    changed = recombine(module, committed)
    assert len(calls) == ran  # nothing ran
    assert changed.verdict == "inconclusive" and changed.preconditions[0]["per_seed"] == pytest.approx(
        [draw(s) for s in range(3)])
    assert changed.timing == committed["timing"] and changed.setting == committed["setting"]


def test_recombine_reads_each_seed_s_verdict_again_after_a_rule_change(stand_in_experiment):
    from objreg.experiments import base
    from objreg.experiments.replication import recombine

    module, _ = stand_in_experiment
    committed = objreg.experiments.run("stand-in", seeds=3, seed=0, quick=False).to_dict()
    with pytest.warns(UserWarning, match="per-seed verdicts are kept as recorded"):
        kept = recombine(module, committed)
    assert [r["verdict"] for r in kept.to_dict()["replicates"]] == [r["verdict"] for r in committed["replicates"]]
    # The rule changes: the threshold moves above every draw. Each seed must now read refuted.
    module.seed_verdict = lambda figures: (
        base.verdict_from_interval(figures["effect"] - 0.01, figures["effect"] + 0.01, 10.0), "re-read")
    reread = recombine(module, committed).to_dict()
    assert [r["verdict"] for r in reread["replicates"]] == ["refuted"] * 3
    assert [r["reason"] for r in reread["replicates"]] == ["re-read"] * 3
    assert [r["figures"]["effect"] for r in reread["replicates"]] == [r["figures"]["effect"]
                                                                     for r in committed["replicates"]]


def test_pooling_a_second_run_equals_running_every_seed_at_once(stand_in_experiment):
    from objreg import InvalidParameterError
    from objreg.experiments.replication import pool, recombine

    module, _ = stand_in_experiment
    first = objreg.experiments.run("stand-in", seeds=3, seed=0, quick=False).to_dict()
    more = objreg.experiments.run("stand-in", seeds=2, seed=3, quick=False).to_dict()
    pooled = recombine(module, pool(first, more))
    together = objreg.experiments.run("stand-in", seeds=5, seed=0, quick=False)
    assert pooled.verdict == together.verdict and pooled.figures == together.figures
    assert pooled.power == together.power and pooled.setting["seeds"] == [0, 1, 2, 3, 4]
    assert pooled.timing["cpu_s"] == pytest.approx(first["timing"]["cpu_s"] + more["timing"]["cpu_s"])
    with pytest.raises(InvalidParameterError, match=r"share seeds \[3, 4\]"):
        pool(pooled.to_dict(), more)
    quick = objreg.experiments.run("stand-in", seeds=2, seed=7, quick=True).to_dict()
    with pytest.raises(InvalidParameterError, match="one experiment in one setting"):
        pool(first, quick)


def test_a_run_stopped_part_way_keeps_its_finished_seeds_for_pooling(stand_in_experiment, tmp_path):
    from objreg.experiments.replication import pool, recombine

    module, _ = stand_in_experiment
    first = objreg.experiments.run("stand-in", seeds=3, seed=0, quick=False).to_dict()
    finished = module.run

    def stops_at_seed_5(setting):
        if setting.seed == 5:
            raise KeyboardInterrupt
        return finished(setting)

    module.run = stops_at_seed_5
    with pytest.raises(KeyboardInterrupt):
        objreg.experiments.run("stand-in", seeds=3, seed=3, quick=False, out_dir=tmp_path / "stopped")
    assert not (tmp_path / "stopped" / "result.json").exists()
    assert not (tmp_path / "stopped" / "seed-5" / "result.json").exists()
    pooled = first
    for seed in (3, 4):
        kept = json.loads((tmp_path / "stopped" / f"seed-{seed}" / "result.json").read_text())
        assert kept["setting"]["seed"] == seed and kept["timing"]["cpu_s"] >= 0
        pooled = pool(pooled, kept)
    module.run = finished
    together = objreg.experiments.run("stand-in", seeds=5, seed=0, quick=False)
    pooled = recombine(module, pooled)
    assert pooled.verdict == together.verdict and pooled.figures == together.figures
    assert pooled.setting["seeds"] == [0, 1, 2, 3, 4]

