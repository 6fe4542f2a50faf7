"""examples/custom_loop.py: a plain loop with the public probe gives the records ``objreg analyze``
gives for the same run (same model directory, objectives, seed, optimizer and steps)."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

import objreg

pytest.importorskip("transformers")
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "custom_loop.py"


def load_example():
    spec = importlib.util.spec_from_file_location("custom_loop", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def assert_close(a, b, path="record"):
    if isinstance(a, dict):
        assert set(a) == set(b), path
        for key in a:
            assert_close(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_close(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        assert math.isclose(a, b, rel_tol=1e-7, abs_tol=1e-12), f"{path}: {a} != {b}"
    else:
        assert a == b, path


@pytest.mark.e2e
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_the_custom_loop_equals_objreg_analyze(tmp_path, optimizer, capsys):
    example = load_example()
    model_dir = example.build_model_dir(tmp_path / "model")
    report = example.main(["--steps", "2", "--out", str(tmp_path / "loop"), "--model", str(model_dir),
                           "--optimizer", optimizer, "--dtype", "float64"])
    analyzed = objreg.analyze(["mlm", "sop"], "qa", model=str(model_dir), steps=2, optimizer=optimizer,
                              dtype="float64", device="cpu", **example.SMALL)
    written = json.loads((tmp_path / "loop" / "report.json").read_text())
    assert len(written["steps"]) == 2 and {"alignment", "second_order", "predicted_delta", "actual_delta"} <= set(
        written["steps"][0])
    assert_close(report.steps, analyzed.steps)
    assert report.config["downstream_head"] == "refit" and all("downstream_fit" in r for r in report.steps)
    assert not any(r["update"].get("decomposition_flagged") for r in report.steps)
    # Its lines say what the records say, as improvements (positive: D fell).
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("step ")]
    assert len(lines) == len(report.steps)
    for record, line in zip(report.steps, lines):
        assert (f"improvement of D: predicted {-record['predicted_delta']['first_order']:+.3e} (first order), "
                f"actual {-record['actual_delta']:+.3e}") in line
    assert_close(written["steps"], analyzed.to_dict()["steps"])
    assert report.config["per_sample_method"] == analyzed.config["per_sample_method"]
