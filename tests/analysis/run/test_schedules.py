"""Weight schedules: the shapes' values, the ``--schedule`` syntax, and its errors."""

from __future__ import annotations

import math

import pytest

import objreg
from objreg.analysis.run.config import AnalysisConfig
from objreg.analysis.run.schedules import Constant, Cosine, Linear, Step, parse_schedules, weights_at


def values(schedule, steps):
    return [schedule(t, steps) for t in range(steps)]


def test_shapes():
    assert values(Constant(), 3) == [1.0, 1.0, 1.0]
    assert values(Linear(), 5) == [1.0, 0.75, 0.5, 0.25, 0.0]
    assert values(Linear(0.0, 2.0), 3) == [0.0, 1.0, 2.0]
    cosine = values(Cosine(), 5)
    assert cosine[0] == 1.0 and cosine[2] == pytest.approx(0.5) and cosine[4] == pytest.approx(0.0, abs=1e-15)
    assert cosine[1] == pytest.approx((1 + math.cos(math.pi / 4)) / 2)
    assert values(Step(2), 4) == [1.0, 1.0, 0.0, 0.0]
    assert values(Step(1, 0.0, 3.0), 3) == [0.0, 3.0, 3.0]
    assert values(Linear(), 1) == [1.0] and values(Cosine(2.0, 0.0), 1) == [2.0]  # a one-step run starts


def test_parsing_and_specs():
    parsed = parse_schedules("mlm=linear:1:0, sop=step:8:0:1", ["mlm", "sop", "clm"])
    assert {n: s.spec for n, s in parsed.items()} == {"mlm": "linear:1:0", "sop": "step:8:0:1", "clm": "constant"}
    everyone = parse_schedules("cosine", ["mlm", "sop"])
    assert everyone == {"mlm": Cosine(), "sop": Cosine()}
    rest = parse_schedules("linear,sop=constant", ["mlm", "sop"])
    assert rest == {"mlm": Linear(), "sop": Constant()}
    assert parse_schedules(None, ["mlm"]) == {"mlm": Constant()}
    assert parse_schedules({"mlm": "step:3"}, ["mlm", "sop"]) == {"mlm": Step(3), "sop": Constant()}
    # A spec parses back to the same schedule.
    for schedule in parsed.values():
        assert parse_schedules(schedule.spec, ["x"])["x"] == schedule


def test_user_callables():
    parsed = parse_schedules({"sop": lambda step, steps: step / steps}, ["mlm", "sop"])
    assert weights_at(2, 4, {"mlm": 2.0, "sop": 3.0}, parsed) == {"mlm": 2.0, "sop": 1.5}
    assert parsed["sop"].spec.startswith("callable:")
    shared = parse_schedules(lambda step, steps: 0.5, ["mlm", "sop"])
    assert weights_at(0, 1, {"mlm": 1.0, "sop": 4.0}, shared) == {"mlm": 0.5, "sop": 2.0}


@pytest.mark.parametrize("bad", [lambda s, n: -1.0, lambda s, n: float("nan"), lambda s, n: "high", lambda s, n: None])
def test_a_callable_giving_a_bad_multiplier_names_objective_and_step(bad):
    parsed = parse_schedules({"sop": bad}, ["mlm", "sop"])
    with pytest.raises(objreg.InvalidParameterError, match=r"of 'sop' gave .* at step 0: a weight multiplier must be"):
        weights_at(0, 3, {"mlm": 1.0, "sop": 1.0}, parsed)


@pytest.mark.parametrize(
    "text, message",
    [
        ("mlm=warmup", "unknown schedule shape 'warmup' in 'mlm=warmup': expected constant, linear"),
        ("mlm=linear:1", "schedule 'mlm=linear:1' has the wrong number of arguments"),
        ("mlm=constant:2", "wrong number of arguments"),
        ("mlm=step", "wrong number of arguments"),
        ("mlm=step:1.5", "AT must be a step number ≥ 0, got '1.5'"),
        ("mlm=step:-1", "AT must be a step number"),
        ("mlm=linear:a:0", "START must be a number, got 'a'"),
        ("mlm=cosine:1:-1", "END must be finite and ≥ 0"),
        ("mlm=linear:inf:0", "START must be finite and ≥ 0"),
        ("nsp=cosine", "schedule given for 'nsp', which is not a selected objective (selected: mlm, sop)"),
        ("mlm=cosine,mlm=linear", "schedule given twice for objective 'mlm'"),
        ("cosine,linear", "schedule given twice for all objectives"),
        ("=cosine", "malformed schedule '=cosine'"),
    ],
)
def test_bad_schedules(text, message):
    with pytest.raises(objreg.InvalidParameterError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_schedules(text, ["mlm", "sop"])


def test_config_records_the_schedule():
    config = AnalysisConfig(pretrain=("mlm", "sop"), schedule="sop=cosine:2:1")
    assert config.to_dict()["schedule"] == {"mlm": "constant", "sop": "cosine:2:1"}
    with pytest.raises(objreg.InvalidParameterError, match="must be a shape string or a callable"):
        AnalysisConfig(pretrain=("mlm",), schedule={"mlm": 3})


def test_a_bad_user_schedule_fails_when_the_config_is_built():
    with pytest.raises(objreg.InvalidParameterError, match="at step 2"):
        AnalysisConfig(pretrain=("mlm",), steps=3, schedule={"mlm": lambda step, steps: -1.0 if step == 2 else 1.0})
