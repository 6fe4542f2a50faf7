"""``objreg screen``: what cannot give a rank is one line before any work, in the command line's
own flags; a diverged candidate is listed "not ranked" with its step."""

from __future__ import annotations

import json

import pytest

SMALL = ["--batch-size", "4", "--seq-len", "48", "--eval-size", "8", "--head-fit-size", "16"]


@pytest.fixture
def run(command):
    return command("screen")


@pytest.mark.parametrize("args, message", [
    (["--budget", "4", "--probe-every", "4"], "gives one probe per candidate; a rank needs at least two"),
    (["--budget", "2", "--probe-every", "7"], "gives one probe per candidate; a rank needs at least two"),
    (["--budget", "100000000000"], "budget must be at most 10000 steps"),
    (["--budget", "10001"], "budget must be at most 10000 steps"),
    (["--budget", "1e12s"], "budget must be at most 86400s"),
    (["--threads", "1000000000000"], "1000000000000 is not in the range 1<=x<=4096"),
    (["--threads", "0"], "0 is not in the range 1<=x<=4096"),
    (["--downstream-data", "/nonexistent/objreg-data"], "--downstream-data"),
])
def test_what_cannot_give_a_rank_is_one_line_before_any_work(run, args, message):
    result = run("--candidates", "mlm,sop", *args)
    assert result.exit_code != 0
    assert message in result.stderr and "Traceback" not in result.stderr and "internal error" not in result.stderr
    assert "downstream_data=" not in result.stderr  # the command line's flags, not Python's keywords
    assert "loading corpus" not in result.stderr and result.stdout == ""


def test_an_enormous_learning_rate_lists_every_candidate_not_ranked_with_its_step(run):
    result = run("--candidates", "mlm,sop", "--lr", "1e6", "--budget", "3", *SMALL)
    assert result.exit_code == 0, result.output
    out = result.stdout.splitlines()
    lines = [line for line in out[:out.index("What the ranking tells")] if line.startswith("- ")]
    assert [line.split(":")[0] for line in lines] == ["- not ranked", "- not ranked"]
    assert all("diverged at step 0" in line for line in lines)
    nexts = out[out.index("What to run next") + 1:]
    assert any("objreg screen --candidates mlm,sop" in line and "--lr 100000" in line for line in nexts), nexts
    report = json.loads(run("--candidates", "mlm", "--lr", "1e6", "--budget", "3", *SMALL, "--json").stdout)
    (entry,) = report["candidates"]
    assert entry["diverged_at"] == 0 and entry["rank"] is None


@pytest.mark.parametrize("absent", ["--resume", "frozen", "--checkpoint-every", "--head-warmup-steps"])
def test_the_help_offers_only_what_the_screen_has(run, absent):
    result = run("--help")
    assert result.exit_code == 0 and "--candidates" in result.stdout
    assert absent not in result.stdout
