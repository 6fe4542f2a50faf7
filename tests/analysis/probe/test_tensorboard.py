"""Probe records as TensorBoard scalars, read back with TensorBoard's own reader."""

from __future__ import annotations

import pytest

from objreg.analysis.probe.tensorboard import TensorBoardScalars, record_scalars


@pytest.fixture
def records(tiny_trainer):
    return tiny_trainer(steps=2).run()


def test_record_scalars_name_every_objective_and_the_taylor_terms(records):
    scalars = record_scalars(records[0])
    for name in ("mlm", "sop"):
        assert scalars[f"alignment/{name}/dot"] == records[0]["alignment"][name]["dot"]
        assert scalars[f"alignment/{name}/cosine"] == records[0]["alignment"][name]["cosine"]
    assert scalars["taylor/actual"] == records[0]["actual_delta"]
    assert scalars["taylor/predicted_first_plus_second_order"] == pytest.approx(
        records[0]["predicted_delta"]["first_order"] + records[0]["predicted_delta"]["second_order"])
    assert scalars["second_order/mlm,sop"] == records[0]["second_order"]["mlm,sop"]


def test_tensorboard_holds_each_probe_step(records, tmp_path):
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    scalars = TensorBoardScalars(tmp_path)
    for record in records:
        scalars.add(record)
    scalars.close()
    events = accumulator.EventAccumulator(str(tmp_path))
    events.Reload()
    read = events.Scalars("alignment/mlm/dot")
    assert [e.step for e in read] == [r["step"] for r in records]
    assert [e.value for e in read] == pytest.approx([r["alignment"]["mlm"]["dot"] for r in records], rel=1e-6)
    assert [e.value for e in events.Scalars("taylor/actual")] == pytest.approx(
        [r["actual_delta"] for r in records], rel=1e-6, abs=1e-12)
