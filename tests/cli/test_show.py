"""`objreg show NAME`: what an objective or task declares, as tables or JSON."""

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


def test_show_json_is_the_info_plus_origin(run):
    result = run("show", "mlm", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    expected = objreg.Registry.load(load_entrypoints=False).info("mlm").to_dict()
    assert data == {**json.loads(json.dumps(expected)), "origin": "objreg (built-in)"}
    assert data["heads"] == [{"name": "lm", "kind": "lm", "num_outputs": 0}]
    assert "mask_prob" in [p["name"] for p in data["params"]]


def test_show_table(run):
    result = run("show", "mlm")
    assert result.exit_code == 0, result.output
    for expected in ("bidirectional", "mask_prob", "0.15", "[0.0, 1.0]", "References", "objreg (built-in)"):
        assert expected in result.stdout


def test_show_a_task(run):
    result = run("show", "qa", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["kind"] == "downstream"


def test_show_objective_without_params(run):
    result = run("show", "clm")
    assert result.exit_code == 0, result.output
    assert "Parameters: none" in result.stdout
    assert "causal" in result.stdout


def test_show_unknown_name(run):
    result = run("show", "mlmm")
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: unknown objective or task 'mlmm'. Did you mean 'mlm'?")
    assert "Available: bart, classification, clm, contrastive, fim, mlm" in result.stderr
