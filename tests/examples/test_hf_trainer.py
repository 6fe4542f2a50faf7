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
    # BERT's default dropout (0.1) is on in the trainer's steps: the probe replays the step's
    # random state, so every record's split is the step the trainer took.
    assert trainer.model.config.hidden_dropout_prob == 0.1
    assert not any(r["update"].get("decomposition_flagged") for r in callback.records)
    assert all(r["update"]["decomposition_residual"] < 1e-5 for r in callback.records)
    printed = capsys.readouterr().out
    assert "mlm: dot" in printed and "nsp: dot" in printed and "report.json" in printed
    # The printed summary says what the records say: D's first and last value, and the improvement
    # (positive: D fell) the records' changes add up to.
    records = callback.records
    actual = -sum(r["actual_delta"] for r in records)
    predicted = -sum(r["predicted_delta"]["first_order"] + r["predicted_delta"]["second_order"] for r in records)
    last = printed.strip().splitlines()[-1]
    assert f"D {records[0]['downstream_loss']:.4f} -> {records[-1]['downstream_loss_after']:.4f}" in last
    assert f"improvement (+: D fell): predicted {predicted:+.4g}, actual {actual:+.4g}" in last
