"""`objreg experiment list` and `objreg experiment run`: output, JSON and errors."""

from __future__ import annotations

import json
import sys
import types

import pytest
from click.testing import CliRunner

import objreg
from objreg.cli import make_cli
from objreg.experiments import base


@pytest.fixture
def run():
    group = make_cli(lambda: objreg.get_plugin_manager(load_entrypoints=False))
    return lambda *args: CliRunner().invoke(group, list(args))


@pytest.fixture(autouse=True)
def fake_experiment(monkeypatch):
    module = types.ModuleType("objreg_cli_fake_experiment")
    module.NAME = "fake"
    module.CLAIM = "two plus two is four"

    def run(setting):
        total = 2 + 2
        verdict = base.verdict_from_interval(total, total, 3.5)  # computed, so it can fail
        return base.ExperimentResult("fake", module.CLAIM, verdict, f"2 + 2 = {total}",
                                     {"total": total, "by_part": {"a": 2.0, "b": 2.0}}, {"quick": setting.quick})

    module.run = run
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(objreg.experiments.EXPERIMENTS, "fake", module.__name__)


def test_list_json_names_every_experiment(run):
    result = run("experiment", "list", "--json")
    assert result.exit_code == 0, result.output
    listed = json.loads(result.stdout)
    assert [e["name"] for e in listed] == objreg.experiments.names()
    assert {"name": "fake", "claim": "two plus two is four"} in listed


def test_run_json_and_out(run, tmp_path):
    result = run("experiment", "run", "fake", "--quick", "--json", "--out", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert (data["name"], data["verdict"], data["figures"]["total"]) == ("fake", "confirmed", 4)
    assert data["setting"] == {"quick": True}
    assert json.loads((tmp_path / "out" / "result.json").read_text()) == data


def test_run_prints_figures_and_verdict(run):
    result = run("experiment", "run", "fake")
    assert result.exit_code == 0, result.output
    for expected in ("two plus two is four", "total", "by_part.a", "CONFIRMED", "2 + 2 = 4"):
        assert expected in result.stdout


def test_unknown_experiment_is_one_line_and_exit_1(run):
    result = run("experiment", "run", "fak")
    assert result.exit_code == 1
    assert result.output.count("\n") == 1 and "unknown experiment 'fak'" in result.output and "fake" in result.output
    assert "Traceback" not in result.output


def test_out_that_is_a_file_keeps_the_file(run, tmp_path):
    target = tmp_path / "existing"
    target.write_text("precious")
    result = run("experiment", "run", "fake", "--out", str(target))
    assert result.exit_code == 1 and "not a directory" in result.output
    assert target.read_text() == "precious"
