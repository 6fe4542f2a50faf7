"""`objreg list`: objectives, tasks and providers, as tables or JSON."""

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


def test_list_json(run):
    result = run("list", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)  # stdout holds only the JSON
    assert set(data) == {"objectives", "tasks", "providers"}
    objectives = {o["name"]: o for o in data["objectives"]}
    assert {"clm", "mlm", "sop"} <= set(objectives)
    clm = objectives["clm"]
    assert set(clm) == {"name", "kind", "attention", "description", "origin"}
    assert (clm["kind"], clm["attention"], clm["origin"]) == ("pretrain", "causal", "objreg (built-in)")
    assert clm["description"].startswith("Causal LM")
    assert [t["name"] for t in data["tasks"]] == ["qa"]
    assert data["tasks"][0]["kind"] == "downstream"
    assert ("model", "default") in {(p["kind"], p["name"]) for p in data["providers"]}
    assert all(set(p) == {"kind", "name", "description"} for p in data["providers"])


def test_list_tables(run):
    result = run("list")
    assert result.exit_code == 0, result.output
    for expected in ("Pre-training objectives", "Downstream tasks", "mlm", "qa", "objreg (built-in)", "tokenizer"):
        assert expected in result.stdout
