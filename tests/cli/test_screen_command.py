"""``objreg screen``: the done-when command, its table and plot, and one clear error for bad input."""

from __future__ import annotations

import json
import math
import shlex
from pathlib import Path

import pytest

from objreg.analysis.run.screen_signals import SIGNALS

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
        for field in ("actual_improvement", "score_per_1k_tokens", "lookahead"):
            assert e[field] is not None
        assert set(e["signals"]) == set(SIGNALS) and math.isnan(e["signals"]["second_order_sum"])
    means = [e["score"]["mean"] for e in report["candidates"]]
    assert means == sorted(means, reverse=True) or any(e["tied"] for e in report["candidates"])
    assert report["validity"].startswith("validity: ")


def test_the_table_fits_80_columns_and_out_writes_the_plot(run, tmp_path):
    result = run("--candidates", "mlm,mlm:mask_prob=0.4,mlm+sop", *SMALL, "--out", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    start = lines.index(next(line for line in lines if line.startswith("Ranking")))
    end = lines.index(next(line for line in lines if line.startswith("validity")))
    table = [line for line in lines[start:end] if not line.startswith(("=:", "Σ1st,"))]  # prose: wrapped on terminals
    assert all(len(line) <= 80 for line in table), table
    assert any("mlm:mask_prob=0.4" in line for line in lines) and lines[-1].startswith("Wrote")
    # The signals' table, and the end: what the ranking tells, what it cannot, what to run next.
    assert any(line.split() == ["candidate", "Σ1st", "cos", "step", "cos", "speed"] for line in lines), table
    headings = [line for line in lines if line.startswith("What ")]
    assert headings == ["What the ranking tells", "What it cannot tell", "What to run next"]
    nexts = lines[lines.index("What to run next") + 1:-1]
    assert any("objreg analyze --pretrain mlm --downstream qa" in line for line in nexts), nexts
    assert json.loads((tmp_path / "out" / "screen.json").read_text())["downstream"] == "qa"
    assert (tmp_path / "out" / "screen.png").read_bytes()[:4] == b"\x89PNG"
    assert "training with probes" in result.stderr and "screening mlm+sop" in result.stderr


def test_second_order_adds_its_column(run):
    result = run("--candidates", "mlm,clm", *SMALL, "--second-order")
    assert result.exit_code == 0, result.output
    header = next(line for line in result.stdout.splitlines() if "Σ1st" in line)
    assert "Σ2nd" in header


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


@pytest.mark.e2e  # the four candidates at the default budget: about two CPU minutes
def test_the_usage_command_ranks(run):
    """docs/usage.md's screen command ranks its candidates, not ties them all (issue 41)."""
    usage = (Path(__file__).resolve().parents[2] / "docs" / "usage.md").read_text(encoding="utf-8")
    line = next(line for line in usage.splitlines() if line.startswith("objreg screen "))
    result = run(*shlex.split(line)[2:], "--json")
    assert result.exit_code == 0, result.output
    ranks = {e["rank"] for e in json.loads(result.stdout)["candidates"]}
    assert len(ranks) >= 2, ranks
