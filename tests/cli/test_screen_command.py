"""``objreg screen``: the done-when command, its table and plot, and one clear error for bad input."""

from __future__ import annotations

import json

import pytest

SMALL = ["--batch-size", "4", "--seq-len", "48", "--eval-size", "8", "--head-fit-size", "16", "--budget", "2"]


@pytest.fixture
def run(command):
    return command("screen")


def test_the_done_when_command_returns_every_candidate_with_score_interval_rank_and_baselines(run):
    result = run("--candidates", "mlm,clm,sop,t5", "--downstream", "qa", *SMALL, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert sorted(e["candidate"] for e in report["candidates"]) == ["clm", "mlm", "sop", "t5"]
    for e in report["candidates"]:
        assert e["runnable"] and e["steps"] == 2 and e["probes"] == 2
        assert e["score"]["low"] <= e["score"]["mean"] <= e["score"]["high"]
        assert e["rank"] in (1, 2, 3, 4) and e["random_rank"] in (1, 2, 3, 4)
        for baseline in ("grad_norm", "loss_decrease", "actual_improvement", "score_per_1k_tokens"):
            assert e[baseline] is not None
    means = [e["score"]["mean"] for e in report["candidates"]]
    assert means == sorted(means, reverse=True) or any(e["tied"] for e in report["candidates"])
    assert report["validity"].startswith("validity: ")


def test_the_table_fits_80_columns_and_out_writes_the_plot(run, tmp_path):
    result = run("--candidates", "mlm,mlm:mask_prob=0.4,mlm+sop", *SMALL, "--out", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    table = lines[lines.index(next(line for line in lines if line.startswith("Ranking"))):]
    assert all(len(line) <= 80 for line in table if not line.startswith(("=:", "validity", "Wrote"))), table
    assert any("mlm:mask_prob=0.4" in line for line in lines) and lines[-1].startswith("Wrote")
    assert json.loads((tmp_path / "out" / "screen.json").read_text())["downstream"] == "qa"
    assert (tmp_path / "out" / "screen.png").read_bytes()[:4] == b"\x89PNG"
    assert "training with probes" in result.stderr and "screening mlm+sop" in result.stderr


@pytest.mark.parametrize("args, message", [
    (["--candidates", "mlm,nosuch"], "unknown objective 'nosuch'"),
    (["--candidates", "mlm:mask_prob=7"], "mask_prob"),
    (["--candidates", "mlm", "--budget", "soon"], "budget must be a number of steps"),
    (["--candidates", "mlm", "--downstream", "qaa"], "unknown downstream task 'qaa'"),
    (["--candidates", "mlm", "--lr", "0"], "lr must be a positive finite number"),
])
def test_bad_input_is_one_line_before_any_work(run, args, message):
    result = run(*args)
    assert result.exit_code != 0
    assert message in result.stderr and "Traceback" not in result.stderr
    assert "loading corpus" not in result.stderr and result.stdout == ""
