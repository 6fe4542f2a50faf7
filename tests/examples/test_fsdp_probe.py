"""examples/fsdp_probe.py under torchrun with two gloo processes, FSDP2 and DDP, AdamW, each process
its DistributedSampler's rows: the records are those of one process on the concatenated batch (the
example prints their largest relative difference)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fsdp_probe.py"


@pytest.mark.e2e
@pytest.mark.parametrize("wrap", ["fsdp", "ddp"])
def test_two_processes_under_torchrun_print_the_one_process_records(tmp_path, wrap):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                             "--standalone", str(EXAMPLE), "--wrap", wrap, "--steps", "2", "--out",
                             str(tmp_path / "r.json")], capture_output=True, text=True, env=env, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    differences = [float(x) for x in re.findall(r"largest relative difference ([0-9.e+-]+)", result.stdout)]
    assert len(differences) == 2 and max(differences) < 1e-9, result.stdout
    records = json.loads((tmp_path / "r.json").read_text())
    assert not any(r.get("update", {}).get("decomposition_flagged") for r in records)
    # The printed lines say what the records say, as improvements (positive: D fell).
    for record, line in zip(records, [x for x in result.stdout.splitlines() if x.startswith("step ")]):
        first = -record["predicted_delta"]["first_order"]
        assert f"D {record['downstream_loss']:.6f} → {record['downstream_loss_after']:.6f}" in line
        assert f"predicted improvement {first:+.3e} (first order)" in line
