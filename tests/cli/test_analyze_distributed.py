"""``objreg analyze`` under ``torchrun``: two gloo processes on loopback print one report, the
one-process report, and an impossible launch fails on every process instead of hanging."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import objreg
from objreg.cli import make_cli

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

SMALL = ["--pretrain", "mlm,sop", "--downstream", "qa", "--steps", "2", "--batch-size", "5", "--seq-len", "32",
         "--eval-size", "8", "--head-fit-size", "16", "--dtype", "float64",
         "--attribution-top", "3"]
#: Bounds a hang only; longer than objreg's own wait on a collective (1800 s by default), so a stuck
#: collective reports itself first.
TIMEOUT_S = 2400


def torchrun(*args: str, script: Path | None = None) -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc-per-node 2 objreg ARGS`` (or ``script ARGS``); the whole
    process group is killed if it outlives ``TIMEOUT_S`` (a hang fails the test instead of blocking it)."""
    objreg_script = script or Path(sys.executable).with_name("objreg")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               str(objreg_script), *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                               start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        pytest.fail(f"torchrun still running after {TIMEOUT_S} s: hung")
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def test_two_processes_print_the_one_process_report_once(tmp_path):
    cli = make_cli(lambda: objreg.get_plugin_manager(load_entrypoints=False))
    one = CliRunner().invoke(cli, ["analyze", *SMALL, "--json"], catch_exceptions=False)
    assert one.exit_code == 0, one.output
    done = torchrun("analyze", *SMALL, "--json", "--out", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    two = json.loads(done.stdout)  # exactly one JSON document: only rank 0 printed
    single = json.loads(one.stdout)
    assert (two["config"]["world_size"], two["config"]["backend"]) == (2, "gloo")
    for step_one, step_two in zip(single["steps"], two["steps"], strict=True):
        for name in ("mlm", "sop"):
            for field in ("dot", "cosine", "grad_norm", "conflict_fraction"):
                a, b = step_one["alignment"][name][field], step_two["alignment"][name][field]
                assert math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-12), (step_one["step"], name, field, a, b)
        for key, value in step_one["second_order"].items():
            assert math.isclose(value, step_two["second_order"][key], rel_tol=1e-6)
        assert math.isclose(step_one["actual_delta"], step_two["actual_delta"], rel_tol=1e-6)
    assert json.loads((tmp_path / "run" / "report.json").read_text(encoding="utf-8")) == two


def test_an_impossible_launch_fails_on_every_process(tmp_path):
    done = torchrun("analyze", *SMALL, "--batch-size", "1")  # the last --batch-size counts
    assert done.returncode != 0
    assert "batch_size 1 is smaller than the 2 processes" in done.stderr


def per_rank(tmp_path: Path, extra: dict[str, list[str]]) -> Path:
    """A script that runs ``objreg`` with the arguments it is given plus ``extra[RANK]``: processes
    started by one torchrun command with settings that differ, as a user's per-rank wrapper would."""
    script = tmp_path / "per_rank.py"
    script.write_text("import os, sys\nfrom objreg.cli import main\n"
                      f"sys.argv += {extra!r}.get(os.environ['RANK'], [])\nmain()\n", encoding="utf-8")
    return script


def _refusal_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("Error:")]


def test_processes_started_with_another_seed_are_refused_naming_it(tmp_path):
    done = torchrun("analyze", *SMALL, script=per_rank(tmp_path, {"1": ["--seed", "7"]}))
    assert done.returncode != 0
    lines = _refusal_lines(done.stderr)
    assert lines, done.stderr
    assert all("rank 1 was started with seed (--seed) 7 but rank 0 with 0" in line for line in lines), lines
    assert "internal error" not in done.stderr


def test_only_rank_0_given_out_ends_at_once_naming_it(tmp_path):
    # Waits in no collective for the 1800 s timeout: refused at start-up, before the run directory is made.
    done = torchrun("analyze", *SMALL, script=per_rank(tmp_path, {"0": ["--out", str(tmp_path / "run")]}))
    assert done.returncode != 0
    lines = _refusal_lines(done.stderr)
    assert lines and all("rank 1 was started with out_dir (--out) not given but rank 0 with" in line for line in lines), done.stderr
    assert not (tmp_path / "run").exists()
