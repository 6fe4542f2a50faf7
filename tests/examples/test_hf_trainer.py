"""examples/hf_trainer.py: ``objreg.ProbeCallback`` inside a real ``transformers.Trainer`` run, as a
user would write it (the model with transformers' default attention, ``remove_unused_columns=False``,
``downstream_name``, TensorBoard): the records, the files, and ``D`` against the trained model."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("accelerate")
pytest.importorskip("datasets")
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "hf_trainer.py"


def load_example():
    spec = importlib.util.spec_from_file_location("hf_trainer", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_trainer_example_probes_and_writes_its_report(tmp_path, capsys):
    pytest.importorskip("tensorboard")
    example = load_example()
    callback, trainer, task = example.main(["--out", str(tmp_path), "--steps", "3", "--every", "2",
                                            "--batch-size", "4", "--tensorboard"])
    assert trainer.model.config._attn_implementation == "sdpa"
    assert [r["step"] for r in callback.records] == [0, 2]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["downstream"] == "sentence order" and report["pretrain"] == ["mlm", "nsp"]
    assert report["steps"] == json.loads(json.dumps(callback.records))
    lines = (tmp_path / "steps.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [0, 2]
    assert (tmp_path / "report.csv").is_file() and list((tmp_path / "tensorboard").glob("events.*"))
    # The last probed step is the last step: D after it is the task's loss on the trained model (float64).
    model = trainer.model.double().eval()
    with torch.no_grad():
        final = float(task(model, example.order_rows(example.objreg.default_tokenizer(), 32, 200)).mean())
    assert callback.records[-1]["downstream_loss_after"] == pytest.approx(final, rel=1e-9)
    # Under AdamW the parts of each step add up to its first-order prediction.
    for record in callback.records:
        parts = sum(record["update"]["first_order"].values())
        assert parts == pytest.approx(record["predicted_delta"]["first_order"], rel=1e-4, abs=1e-12)
    printed = capsys.readouterr().out
    assert "mlm: dot" in printed and "nsp: dot" in printed and "report.json" in printed
