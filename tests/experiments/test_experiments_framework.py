"""The experiment framework: verdicts from intervals, results, the registry and ``run``."""

from __future__ import annotations

import json
import sys
import types

import pytest

import objreg
from objreg.experiments import base


@pytest.mark.parametrize(
    ("low", "high", "threshold", "claim", "expected"),
    [
        (0.1, 0.3, 0.0, "above", "confirmed"),
        (-0.3, -0.1, 0.0, "above", "refuted"),
        (-0.1, 0.3, 0.0, "above", "inconclusive"),
        (1.2, 1.5, 1.0, "below", "refuted"),
        (0.2, 0.9, 1.0, "below", "confirmed"),
        (0.9, 1.1, 1.0, "below", "inconclusive"),
    ],
)
def test_verdict_from_interval(low, high, threshold, claim, expected):
    assert base.verdict_from_interval(low, high, threshold, claim) == expected


def test_verdict_rejects_an_unknown_direction():
    with pytest.raises(ValueError, match="'above' or 'below'"):
        base.verdict_from_interval(0, 1, claim="sideways")


def test_result_rejects_an_unknown_verdict():
    with pytest.raises(ValueError, match="confirmed, refuted, inconclusive"):
        base.ExperimentResult("x", "claim", "probably", "why", {})


def test_setting_picks_sizes():
    assert base.Setting(quick=True).size(2, 20) == 2
    assert base.Setting(quick=False).size(2, 20) == 20


@pytest.fixture
def fake_experiment(monkeypatch):
    """A registered experiment whose verdict follows the sign of a seeded draw."""
    module = types.ModuleType("objreg_fake_experiment")
    module.NAME = "fake"
    module.CLAIM = "a seeded draw is positive"
    calls = []

    def run(setting):
        calls.append(setting)
        import torch

        value = float(torch.randn(1, generator=torch.Generator().manual_seed(setting.seed)))
        verdict = base.verdict_from_interval(value - 0.01, value + 0.01)
        return base.ExperimentResult("fake", module.CLAIM, verdict, f"draw {value:.3f}", {"draw": value},
                                     {"quick": setting.quick, "seed": setting.seed})

    module.run = run
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(objreg.experiments.EXPERIMENTS, "fake", module.__name__)
    return calls


def test_run_writes_result_json(fake_experiment, tmp_path):
    out = tmp_path / "a" / "b"
    result = objreg.experiments.run("fake", quick=True, seed=3, out_dir=out)
    written = json.loads((out / "result.json").read_text())
    assert written == result.to_dict()
    assert set(written) == {"name", "claim", "verdict", "reason", "figures", "setting", "plots"}
    assert written["setting"] == {"quick": True, "seed": 3}
    assert fake_experiment[0].out_dir == out
    # Same seed, same figures.
    assert objreg.experiments.run("fake", quick=True, seed=3).figures == result.figures


def test_run_refuses_a_file_as_out_dir(fake_experiment, tmp_path):
    target = tmp_path / "file"
    target.write_text("keep me")
    with pytest.raises(objreg.InvalidParameterError, match="not a directory"):
        objreg.experiments.run("fake", out_dir=target)
    assert target.read_text() == "keep me"
    assert not fake_experiment  # refused before running


def test_unknown_experiment_lists_the_known_ones(fake_experiment):
    with pytest.raises(objreg.UnknownNameError, match="fake"):
        objreg.experiments.run("fak")


def test_every_registered_experiment_has_the_contract():
    for name in objreg.experiments.names():
        module = objreg.experiments.module(name)
        assert module.NAME == name
        assert isinstance(module.CLAIM, str) and module.CLAIM
        assert callable(module.run)
        assert module.__doc__ and len(module.__doc__) > 200, f"{name}: the docstring states claim, source, setting"
