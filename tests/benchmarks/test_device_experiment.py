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
