"""`objreg experiment list` and `objreg experiment run`: output, JSON and errors."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import objreg
from objreg.cli import make_cli


@pytest.fixture
def run():
    group = make_cli(lambda: objreg.get_plugin_manager(load_entrypoints=False))
    return lambda *args: CliRunner().invoke(group, list(args))


@pytest.fixture(autouse=True)
def fake_experiment(stand_in_experiment):
    return stand_in_experiment


def test_list_json_names_every_experiment_with_source_and_rule(run):
    result = run("experiment", "list", "--json")
    assert result.exit_code == 0, result.output
    listed = json.loads(result.stdout)
    assert [e["name"] for e in listed] == objreg.experiments.names()
    assert {"name": "stand-in", "claim": "a seeded draw plus one is positive", "source": "the test suite",
            "rule": "the between-seed interval of the mean lies above 0.5", "kind": "claim"} in listed


def test_list_shows_a_line_each_and_show_gives_the_rule(run):
    result = run("experiment", "list")
    assert result.exit_code == 0, result.output
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("stand-in")]
    assert "the test suite: a seeded draw plus one is positive" in line and "between-seed" not in line
    shown = run("experiment", "show", "stand-in")
    assert shown.exit_code == 0, shown.output
    assert "verdict rule: the between-seed interval of the mean lies above 0.5" in shown.stdout


def test_run_json_and_out(run, tmp_path):
    result = run("experiment", "run", "stand-in", "--quick", "--json", "--out", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert (data["name"], data["verdict"]) == ("stand-in", "confirmed")
    assert data["setting"] == {"quick": True, "seeds": [0]} and len(data["replicates"]) == 1
    assert json.loads((tmp_path / "out" / "result.json").read_text()) == data


def test_seeds_gives_that_many_replicates(run, fake_experiment):
    _, calls = fake_experiment
    result = run("experiment", "run", "stand-in", "--quick", "--seeds", "3", "--seed", "5", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [r["setting"]["seed"] for r in data["replicates"]] == [5, 6, 7] == [c.seed for c in calls]
    assert data["figures"]["effect"] == pytest.approx(sum(data["figures"]["per_seed_effect"]) / 3)


def test_full_setting_defaults_to_three_seeds(run, fake_experiment):
    _, calls = fake_experiment
    result = run("experiment", "run", "stand-in", "--json")
    assert result.exit_code == 0, result.output
    assert len(json.loads(result.stdout)["replicates"]) == 3 and len(calls) == 3


def test_run_prints_figures_seeds_and_verdict(run):
    result = run("experiment", "run", "stand-in", "--seeds", "2")
    assert result.exit_code == 0, result.output
    for expected in ("a seeded draw plus one is positive", "source: the test suite", "rule: the between-seed",
                     "effect_ci95_between_seeds", "within-seed", "draw 2.541", "INCONCLUSIVE", "over 2 seeds"):
        assert expected in result.stdout, expected


def test_all_writes_every_result(run, fake_experiment, monkeypatch, tmp_path):
    module, _ = fake_experiment
    monkeypatch.setattr(objreg.experiments, "EXPERIMENTS", {"stand-in": module.__name__})
    result = run("experiment", "run", "--all", "--quick", "--seeds", "2", "--out", str(tmp_path / "all"), "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [d["name"] for d in data] == ["stand-in"]
    assert json.loads((tmp_path / "all" / "stand-in" / "result.json").read_text()) == data[0]


@pytest.mark.parametrize(("args", "code", "message"), [
    (("stand-in", "--seeds", "0"), 1, "seeds must be a positive integer, got 0"),
    (("stand-in", "--seeds", "100000"), 1, "seeds must be at most 64, got 100,000"),
    (("stand-in", "--seeds", "three"), 2, "'three' is not a valid integer"),
    (("--all",), 2, "--all needs --out"),
    (("stand-in", "--all", "--out", "x"), 2, "NAME or --all, not both"),
    ((), 2, "give an experiment NAME or --all"),
])
def test_bad_input_is_one_clear_error(run, fake_experiment, args, code, message):
    _, calls = fake_experiment
    result = run("experiment", "run", *args)
    assert result.exit_code == code and message in result.output, result.output
    assert "Traceback" not in result.output and not calls


def test_unknown_experiment_is_one_line_and_exit_1(run):
    result = run("experiment", "run", "stand-i")
    assert result.exit_code == 1
    assert result.output.count("\n") == 1 and "unknown experiment 'stand-i'" in result.output
    assert "stand-in" in result.output and "Traceback" not in result.output


def test_out_that_is_a_file_keeps_the_file(run, tmp_path):
    target = tmp_path / "existing"
    target.write_text("precious")
    result = run("experiment", "run", "stand-in", "--out", str(target))
    assert result.exit_code == 1 and "not a directory" in result.output
    assert target.read_text() == "precious"
