"""``objreg.analyze`` end to end on the default corpus, model and task, at a small size."""

from __future__ import annotations

import json

import pytest
import torch

import objreg
from objreg.core.registry import merge_heads

SMALL = dict(steps=3, batch_size=4, seq_len=48, eval_size=8, head_fit_size=32, head_warmup_steps=10)


@pytest.fixture(scope="session")
def small_report():
    return objreg.analyze(["mlm", "sop"], "qa", **SMALL, optimizer="sgd", lr=0.01, dtype="float64")


def test_report_shape(small_report):
    report = small_report.to_dict()
    assert report["pretrain"] == ["mlm", "sop"] and report["downstream"] == "qa"
    assert len(report["steps"]) == SMALL["steps"]
    for step in report["steps"]:
        assert set(step) >= {"step", "downstream_loss", "weights", "alignment", "predicted_delta", "actual_delta"}
        for name in ("mlm", "sop"):
            a = step["alignment"][name]
            assert set(a) >= {"dot", "cosine", "ci95", "conflict_fraction", "grad_norm"}
            assert a["ci95"][0] <= a["dot"] <= a["ci95"][1]
            assert 0.0 <= a["conflict_fraction"] <= 1.0 and -1.0 <= a["cosine"] <= 1.0
    assert set(report["summary"]) >= {"alignment", "first_order_term", "actual_improvement", "predicted_improvement"}
    json.loads(small_report.to_json())  # strict JSON: no NaN


def test_shared_parameters_are_the_backbone(small_report):
    tokenizer = objreg.default_tokenizer()
    infos = [objreg.get_objective(n).info for n in ("mlm", "sop")] + [objreg.get_task("qa").info]
    model = objreg.Registry.load().load_model("default", tokenizer.vocab, merge_heads(infos), {}, torch.Generator())
    backbone = sum(p.numel() for p in model.backbone.parameters())
    assert small_report.config["shared_parameters"] == backbone
    assert small_report.config["model_parameters"] > backbone  # heads are excluded


def test_sgd_prediction_is_the_weighted_sum_of_per_sample_dots(small_report):
    # With plain SGD, Δθ = −η Σ_k α_k ∇L_k, so ∇D·Δθ = −η Σ_k α_k c_k: the mean of the per-sample
    # dots (from jvp) must reproduce the first-order prediction computed from the actual update.
    lr = small_report.config["lr"]
    for step in small_report.steps:
        from_dots = -lr * sum(step["weights"][k] * a["dot"] for k, a in step["alignment"].items())
        assert step["predicted_delta"]["first_order"] == pytest.approx(from_dots, rel=1e-8)


def test_first_order_error_shrinks_as_the_step_squared():
    # One step from the same θ_0: the actual change is −η∇D·u + O(η²), so halving η must cut the
    # first-order error about 4× while the prediction itself halves exactly.
    def first_step(lr):
        report = objreg.analyze("mlm,sop", "qa", **{**SMALL, "steps": 1}, optimizer="sgd", lr=lr, dtype="float64")
        step = report.steps[0]
        return step["predicted_delta"]["first_order"], step["actual_delta"]

    (p1, a1), (p2, a2) = first_step(2e-3), first_step(1e-3)
    assert p1 == pytest.approx(2 * p2, rel=1e-9)
    ratio = abs(p1 - a1) / abs(p2 - a2)
    assert 3.5 <= ratio <= 4.5, ratio


def test_same_seed_same_json_and_another_seed_differs():
    first = objreg.analyze("clm", "qa", **SMALL, seed=3).to_json()
    assert objreg.analyze("clm", "qa", **SMALL, seed=3).to_json() == first
    assert objreg.analyze("clm", "qa", **SMALL, seed=4).to_json() != first


def test_probes_do_not_change_the_trajectory():
    every = objreg.analyze("mlm,sop", "qa", **SMALL, probe_every=1)
    sparse = objreg.analyze("mlm,sop", "qa", **SMALL, probe_every=100)  # probes only the first and last step
    assert [s["step"] for s in sparse.steps] == [0, SMALL["steps"] - 1]
    assert sparse.steps[-1] == every.steps[-1]
    assert sparse.summary["final_downstream_loss"] == every.summary["final_downstream_loss"]


def test_outputs_are_written(tmp_path, small_report):
    steps_seen = []
    report = objreg.analyze("mlm", "qa", **SMALL, out_dir=tmp_path / "run", on_step=lambda s, r: steps_seen.append(s))
    assert steps_seen == list(range(SMALL["steps"]))
    lines = (tmp_path / "run" / "steps.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == report.steps
    assert json.loads((tmp_path / "run" / "report.json").read_text()) == report.to_dict()
    assert json.loads((tmp_path / "run" / "config.json").read_text())["shared_parameters"] > 0
    assert not list((tmp_path / "run").glob(".*.tmp"))


def test_non_finite_loss_names_objective_and_step():
    with pytest.raises(objreg.NonFiniteLossError, match=r"objective '(mlm|sop)'.*at step \d"):
        objreg.analyze("mlm,sop", "qa", **{**SMALL, "steps": 6}, optimizer="sgd", lr=1e12)


def test_unknown_objective_fails_before_loading_anything():
    stages = []
    with pytest.raises(objreg.UnknownObjectiveError, match="'nosuch'.*Available: clm, mlm, sop") as error:
        objreg.analyze("mlm,nosuch", "qa", on_status=stages.append)
    assert stages == []
    assert "nosuch" in str(error.value)


def test_downstream_must_be_a_task():
    with pytest.raises(objreg.InvalidParameterError, match="'mlm' is a pre-training objective"):
        objreg.analyze("clm", "mlm")


def test_corpus_without_two_sentence_documents_is_a_clear_error_for_sop(tmp_path):
    corpus = tmp_path / "one-sentence-lines.txt"
    corpus.write_text("\n".join(f"Document number {i} has exactly one sentence about Topic{i}." for i in range(400)))
    with pytest.raises(objreg.DataError, match="sop needs 2 sentences"):
        objreg.analyze("sop", "qa", **SMALL, corpus=str(corpus))
