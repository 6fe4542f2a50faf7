"""``objreg.screen``: the score is the analyzer's first-order term, every candidate starts from
the same D*, candidates are parsed and checked before any work, ties and validity."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import objreg
from objreg.analysis.run.config import AnalysisConfig
from objreg.analysis.run.screen import (
    VALIDITY_RESULT,
    Budget,
    Candidate,
    parse_budget,
    parse_candidates,
    rank_with_ties,
    screen,
    validity_line,
)
from objreg.analysis.run.screen_run import unrunnable_reason
from objreg.analysis.run.screen_setting import describe

#: A small float64 setting: rows, sets and a re-fitted head small enough for a test.
SMALL = {"batch_size": 4, "seq_len": 48, "eval_size": 8, "head_fit_size": 16, "dtype": "float64"}


@pytest.fixture(scope="module")
def registry():
    return objreg.Registry.load()


@pytest.mark.filterwarnings("ignore:the downstream head fits")  # analyze's note on the tiny fit set
def test_the_score_is_the_analyzers_first_order_term_for_the_same_steps(registry):
    report = screen("mlm", "qa", budget=3, registry=registry, second_order=True, **SMALL)
    (entry,) = report.candidates
    analyzed = objreg.analyze(["mlm"], "qa", registry=registry, steps=3, attribution_top=0, **SMALL)
    # The probe's first-order term is ∇D*·Δθ (the predicted change); the score is its negative.
    first_order = [-s["predicted_delta"]["first_order"] for s in analyzed.steps]
    both = [-s["predicted_delta"]["first_order"] - s["predicted_delta"]["second_order"] for s in analyzed.steps]
    assert entry["probes"] == 3
    assert entry["score"]["mean"] == pytest.approx(sum(first_order) / 3, rel=1e-8, abs=1e-12)
    signals = entry["signals"]
    assert signals["first_order_sum"] == pytest.approx(sum(first_order), rel=1e-8, abs=1e-12)
    assert signals["second_order_sum"] == pytest.approx(sum(both), rel=1e-6, abs=1e-12)
    # Under SGD the step is −lr·∇L: the preconditioned score is lr times the raw alignment, and
    # the step's cosine is the gradient's.
    lr = report.config["lr"]
    assert signals["score"] == pytest.approx(lr * signals["alignment"], rel=1e-8)
    assert signals["step_cosine"] == pytest.approx(signals["cosine"], rel=1e-8)
    dstar = [s["downstream_loss"] for s in analyzed.steps] + [analyzed.summary["final_downstream_loss"]]
    assert entry["lookahead"]["mean"] == pytest.approx((dstar[0] - dstar[-1]) / 3, rel=1e-6, abs=1e-12)
    assert signals["speed"] == pytest.approx(sum(dstar[0] - d for d in dstar[1:]) / 3, rel=1e-6, abs=1e-12)
    assert entry["initial_downstream_loss"] == pytest.approx(analyzed.summary["initial_downstream_loss"], rel=1e-10)
    assert entry["actual_improvement"] == pytest.approx(
        analyzed.summary["initial_downstream_loss"] - analyzed.summary["final_downstream_loss"], rel=1e-7, abs=1e-12)


def test_every_candidate_starts_from_the_same_downstream_loss(registry):
    report = screen("mlm,clm,sop+mlm", "qa", budget=2, registry=registry, **SMALL)
    starts = {e["candidate"]: e["initial_downstream_loss"] for e in report.candidates}
    assert len(starts) == 3 and max(starts.values()) - min(starts.values()) < 1e-12
    ends = {e["final_downstream_loss"] for e in report.candidates}
    assert len(ends) == 3  # and the runs then differ
    for e in report.candidates:
        assert e["runnable"] and e["score"]["low"] <= e["score"]["mean"] <= e["score"]["high"]
        assert e["tokens_per_step"] > 0 and e["signals"]["grad_norm"] > 0 and e["steps"] == 2
        assert e["signals"]["random"] == -e["random_rank"] and math.isnan(e["signals"]["second_order_sum"])
    assert sorted(e["random_rank"] for e in report.candidates) == [1, 2, 3]
    assert report.candidates[0]["rank"] == 1


def test_the_report_is_json_and_a_time_budget_stops_the_run(registry):
    report = screen(["mlm"], "qa", budget="0.001s", registry=registry, **SMALL)
    (entry,) = report.candidates
    assert entry["steps"] == 2  # at least two probes for an interval, then the time is spent
    assert json.loads(report.to_json())["budget"] == "0.001s"


def test_candidates_are_parsed_and_checked_by_their_plugins(registry):
    parsed = parse_candidates("mlm, mlm:mask_prob=0.4 ,mlm+sop,span:geometric_p=0.3:mask_prob=0.2", registry)
    assert [c.label for c in parsed] == ["mlm", "mlm:mask_prob=0.4", "mlm+sop",
                                         "span:geometric_p=0.3:mask_prob=0.2"]
    assert parsed[1].params == {"mlm": {"mask_prob": "0.4"}}
    assert parsed[2].objectives == ("mlm", "sop") and parsed[2].weights == {"mlm": 0.5, "sop": 0.5}


@pytest.mark.parametrize("text, message", [
    ("", "no candidate given"),
    ("mlm,nosuch", "unknown objective 'nosuch'"),
    ("mlm:mask_prob=2", "mask_prob"),
    ("mlm:nosuch=1", "unknown parameter of 'mlm' 'nosuch'"),
    ("mlm:mask_prob", "malformed parameter 'mask_prob'"),
    ("mlm+mlm", "names 'mlm' twice"),
    ("mlm,mlm", "'mlm' is given twice"),
    ("+sop", "malformed candidate"),
])
def test_bad_candidates_are_one_clear_error(registry, text, message):
    with pytest.raises(objreg.ObjregError, match=message) as error:  # unknown names: UnknownNameError
        parse_candidates(text, registry)
    assert "\n" not in str(error.value)


def test_a_bad_candidate_fails_before_anything_is_loaded(registry):
    stages = []
    with pytest.raises(objreg.ObjregError, match="unknown objective"):
        screen("mlm,nosuch", "qa", registry=registry, on_status=stages.append, **SMALL)
    assert stages == []


@pytest.mark.parametrize("budget, parsed", [(12, Budget(steps=12)), ("5", Budget(steps=5)),
                                            ("90s", Budget(seconds=90.0)), (" 2.5s ", Budget(seconds=2.5))])
def test_budgets(budget, parsed):
    assert parse_budget(budget) == parsed


@pytest.mark.parametrize("budget", [1, 0, "-3s", "0s", "ten", "5m", True, "nans"])
def test_bad_budgets(budget):
    with pytest.raises(objreg.InvalidParameterError, match="budget must be"):
        parse_budget(budget)


def test_settings_the_screen_sets_are_refused(registry):
    with pytest.raises(objreg.InvalidParameterError, match="the screen sets steps itself"):
        screen("mlm", "qa", registry=registry, steps=3)


def test_a_causal_candidate_on_an_encoder_decoder_is_listed_with_itsunrunnable_reason(registry, tokenizer, texts):
    corpus = objreg.Corpus("tiny", tuple(tuple(objreg.split_sentences(t)) for t in texts * 4))
    loaded = SimpleNamespace(tokenized=objreg.TokenizedCorpus(tokenizer, corpus, 40), architecture="encoder-decoder")
    config = AnalysisConfig(pretrain=("mlm",), seq_len=40)
    clm = Candidate("clm", ("clm",), {})
    assert "does not run on an encoder-decoder" in unrunnable_reason(registry, clm, config, loaded)
    assert unrunnable_reason(registry, Candidate("t5", ("t5",), {}), config, loaded) is None
    loaded.architecture = "encoder"
    assert unrunnable_reason(registry, clm, config, loaded) is None


def _entry(name, mean, low, high):
    return {"candidate": name, "runnable": True, "score": {"mean": mean, "low": low, "high": high},
            "rank": None, "tied": False}


def test_overlapping_intervals_tie_with_the_best_of_their_group():
    entries = [_entry("c", 1.0, 0.5, 1.5), _entry("a", 3.0, 2.0, 4.0), _entry("b", 2.5, 1.8, 3.2),
               _entry("d", 0.9, 0.8, 1.0), _entry("e", -1.0, -1.2, -0.8)]
    rank_with_ties(entries)
    ranks = {e["candidate"]: (e["rank"], e["tied"]) for e in entries}
    assert ranks == {"a": (1, True), "b": (1, True), "c": (3, True), "d": (3, True), "e": (5, False)}


def test_a_diverged_run_is_listed_with_its_reason_not_ranked():
    entries = [_entry("a", 1.0, 0.5, 1.5), _entry("nan", math.nan, math.nan, math.nan), _entry("b", 3.0, 2.0, 4.0)]
    rank_with_ties(entries)
    ranks = {e["candidate"]: (e["runnable"], e["rank"]) for e in entries}
    assert ranks == {"b": (True, 1), "a": (True, 2), "nan": (False, None)}
    assert "diverged" in entries[1]["reason"]


def test_the_validity_line_reads_the_result_shipped_in_the_package():
    """By default the line reads objreg/data/screen-validity.json (package data, the committed
    result's extract), not a path climbed to from the module."""
    committed = Path(__file__).resolve().parents[3] / "docs" / "experiments" / "results" / "screen-validity.json"
    shipped = json.loads(VALIDITY_RESULT.read_text())
    setting = shipped["setting"]
    config = AnalysisConfig(pretrain=("mlm",), downstream="classification", model=setting["model"],
                            corpus=setting["corpus"])
    budget = Budget(steps=setting["budget"])
    assert validity_line(config, budget) == validity_line(config, budget, path=committed)
    assert "no committed result" not in validity_line(config, budget)


def test_the_validity_line_reads_the_committed_result_for_its_setting(tmp_path):
    path = tmp_path / "screen-validity.json"
    squad = tmp_path / "squad.json"
    squad.write_text("{}")
    config = AnalysisConfig(pretrain=("mlm",), batch_size=8, seq_len=64, eval_size=32, head_fit_size=64,
                            downstream_data=str(squad))
    assert "not validated" in validity_line(config, Budget(steps=8), path)  # no result yet
    rho = {"mean": 0.61, "low": 0.52, "high": 0.7, "seeds": 3}
    # A result of the first design: its data by path, in each seed's figures.
    seeds = [{"figures": {"per_task": {"qa": {"downstream_data": str(squad)}, "classification": {}}}}]
    path.write_text(json.dumps({"verdict": "confirmed", "setting": {
        "model": "default", "corpus": "default", "budget": 8, "batch_size": 8, "seq_len": 64, "eval_size": 32,
        "head_fit_size": 64, "outcome_factor": 20}, "replicates": seeds,
        "figures": {"per_task": {"qa": {"rho": {"screen": rho}}}}}))
    line = validity_line(config, Budget(steps=8), path)
    assert "ρ +0.61 [+0.52, +0.70]" in line and "3 seeds" in line and "confirmed" in line
    assert "not validated" in validity_line(config, Budget(steps=12), path)
    assert "not validated" in validity_line(dataclasses.replace(config, optimizer="adamw"), Budget(steps=8), path)
    # The built-in set is not the data the figure was measured on; nor another file of the same name.
    builtin = dataclasses.replace(config, downstream_data=None)
    assert "not validated" in validity_line(builtin, Budget(steps=8), path)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "squad.json").write_text("[]")
    other = validity_line(dataclasses.replace(config, downstream_data=str(tmp_path / "other" / "squad.json")),
                          Budget(steps=8), path)
    assert other.startswith("validity: not validated for this setting") and "ρ" not in other
    assert "qa on squad.json: model default" in other and "budget 8 steps" in other
    # A task the experiment read with its own sets is validated at those sets, not the common ones.
    seeds = [{"figures": {"per_task": {"qa": {"downstream_data": str(squad)}, "classification": {}}}}]
    path.write_text(json.dumps({"verdict": "inconclusive", "setting": {
        "model": "default", "corpus": "default", "budget": 8, "batch_size": 8, "seq_len": 64, "eval_size": 32,
        "head_fit_size": 64, "classification_eval_size": 256, "classification_head_fit_size": 512,
        "outcome_factor": 20}, "replicates": seeds, "figures": {"per_task": {
            "qa": {"rho": {"screen": rho}}, "classification": {"rho": {"screen": rho}}}}}))

    def classification(eval_size, head_fit_size):
        return AnalysisConfig(pretrain=("mlm",), downstream="classification", batch_size=8, seq_len=64,
                              eval_size=eval_size, head_fit_size=head_fit_size)

    assert "ρ +0.61" in validity_line(classification(256, 512), Budget(steps=8), path)
    line = validity_line(classification(32, 64), Budget(steps=8), path)
    assert "not validated" in line and "classification data built-in, batch_size 8, seq_len 64, eval_size 256" in line
    assert "ρ +0.61" in validity_line(config, Budget(steps=8), path)  # qa at its own 32 and 64


def test_the_validity_line_reads_the_redesigned_result(tmp_path):
    corpus, data = tmp_path / "train.txt", tmp_path / "train.tsv"
    corpus.write_text("a b c\n")
    data.write_text("sentence\tlabel\n")
    config = AnalysisConfig(pretrain=("mlm",), downstream="classification", corpus=str(corpus),
                            downstream_data=str(data), optimizer="adamw", lr=1e-4)
    figures = {"pairwise_accuracy": {"mean": 0.83, "low": 0.71, "high": 0.9}, "spearman": {"mean": 0.7}}
    result = {"verdict": "confirmed", "setting": {"signal": "score", "outcome": "accuracy", "candidates_count": 28,
                                                  "seeds": [0, 1, 2]},
              "figures": {"validated": [{"task": "sst2", "label": "classification on SST-2",
                                         "setting": describe(config, "8 steps")}],
                          "per_task": {"sst2": {"outcomes": {"accuracy": {"signals": {"score": figures}}}}}}}
    path = tmp_path / "screen-validity.json"
    path.write_text(json.dumps(result))
    line = validity_line(config, Budget(steps=8), path)
    assert "pairwise decision accuracy 0.83 [0.71, 0.90]" in line and "28 candidates and 3 seeds" in line
    assert "not validated" in validity_line(config, Budget(steps=16), path)
    data.write_text("sentence\tlabel\nother\t1\n")  # the same file name, other data
    assert "not validated" in validity_line(config, Budget(steps=8), path)


def test_the_committed_result_tells_the_built_in_qa_set_nothing():
    line = validity_line(AnalysisConfig(pretrain=("mlm",), batch_size=8, seq_len=64, eval_size=32, head_fit_size=64),
                         Budget(steps=8))
    assert line.startswith("validity: not validated for this setting") and "ρ" not in line


def test_the_random_order_is_seeded(registry):
    orders = [[e["random_rank"] for e in sorted(screen("mlm,clm,sop", "qa", budget=2, registry=registry, seed=s,
                                                         **SMALL).candidates, key=lambda e: e["candidate"])]
              for s in (0, 0)]
    assert orders[0] == orders[1]
    assert torch.randperm(3, generator=objreg.toolkit.randomness.stream(0, "screen_random_order")).add(1).tolist() \
        == [dict(zip(["clm", "mlm", "sop"], orders[0]))[n] for n in ("mlm", "clm", "sop")]
