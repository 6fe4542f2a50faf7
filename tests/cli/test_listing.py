"""`objreg list`: objectives, tasks, modifiers and providers, as tables or JSON."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import objreg
from objreg.cli import make_cli
from objreg.toolkit.modifiers import MODIFIER_PARAMS


@pytest.fixture
def run():
    group = make_cli(lambda: objreg.get_plugin_manager(load_entrypoints=False))
    return lambda *args: CliRunner().invoke(group, list(args))


def test_list_json(run):
    result = run("list", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)  # stdout holds only the JSON
    assert set(data) == {"objectives", "tasks", "modifiers", "providers", "head_kinds"}
    objectives = {o["name"]: o for o in data["objectives"]}
    assert {"clm", "mlm", "sop"} <= set(objectives)
    clm = objectives["clm"]
    assert set(clm) == {"name", "kind", "attention", "description", "origin"}
    assert (clm["kind"], clm["attention"], clm["origin"]) == ("pretrain", "causal", "objreg (built-in)")
    assert clm["description"].startswith("Causal LM")
    assert "qa" in [t["name"] for t in data["tasks"]]
    assert data["tasks"][0]["kind"] == "downstream"
    assert ("model", "default") in {(p["kind"], p["name"]) for p in data["providers"]}
    assert all(set(p) == {"kind", "name", "description", "origin"} for p in data["providers"])
    origins = {(p["kind"], p["name"]): p["origin"] for p in data["providers"]}
    assert origins[("model", "default")] == "plugin 'objreg.models.transformer' (objreg (built-in))"


def test_list_shows_where_modifiers_providers_and_head_kinds_come_from(run):
    data = json.loads(run("list", "--json").stdout)
    assert {m["origin"] for m in data["modifiers"]} == {"objreg (built-in): objreg.toolkit.modifiers"}
    kinds = {k["name"]: k for k in data["head_kinds"]}
    registry = objreg.Registry.load(load_entrypoints=False)
    assert set(kinds) == set(registry.head_kinds())
    assert kinds["generator"]["origin"] == "plugin 'rtd' (objreg (built-in))"  # rtd registers its generator
    assert kinds["classifier"]["needs_outputs"] and not kinds["lm"]["needs_outputs"]
    tables = run("list").stdout
    for expected in ("Head kinds", "token_classifier", "plugin 'objreg.heads' (objreg (built-in))",
                     "objreg (built-in): objreg.toolkit.modifiers"):
        assert expected in tables


def test_a_plugin_s_provider_shows_its_origin():
    class Tiny:
        @objreg.hookimpl
        def objreg_register_models(self, register):
            register(objreg.Provider("model", "tiny", "a tiny model", lambda *args: None))

    def manager():
        pm = objreg.get_plugin_manager(load_entrypoints=False)
        pm.register(Tiny(), name="tinyplugin")
        return pm

    data = json.loads(CliRunner().invoke(make_cli(manager), ["list", "--json"]).stdout)
    (tiny,) = [p for p in data["providers"] if p["name"] == "tiny"]
    assert tiny["origin"] == "plugin 'tinyplugin' (registered at run time)"


def test_list_tables(run):
    result = run("list")
    assert result.exit_code == 0, result.output
    for expected in ("Pre-training objectives", "Downstream tasks", "mlm", "qa", "objreg (built-in)", "tokenizer",
                     "Modifiers", "masking_policy", "label_smoothing", "consistency", "char_noise"):
        assert expected in result.stdout


def test_list_shows_the_modifiers_and_what_they_compose_with(run):
    data = json.loads(run("list", "--json").stdout)
    modifiers = {m["name"]: m for m in data["modifiers"]}
    assert set(modifiers) == {"masking_policy", "label_smoothing", "consistency", "char_noise"}
    for name in ("masking_policy", "label_smoothing", "consistency"):
        assert {"mlm", "wwm", "span"} <= set(modifiers[name]["composes_with"])
        assert "clm" not in modifiers[name]["composes_with"] and modifiers[name]["scope"] == "objective"
    policy = modifiers["masking_policy"]["params"][0]
    assert (policy["name"], policy["default"], policy["type"]) == ("masking_policy", "uniform", "str")
    assert policy["choices"] == ["uniform", "entropy", "inverse_frequency"]
    assert [p["name"] for p in modifiers["consistency"]["params"]] == ["consistency_weight"]
    assert modifiers["label_smoothing"]["params"][0]["default"] == 0.0
    noise = modifiers["char_noise"]
    assert noise["scope"] == "text" and set(noise["composes_with"]) == {o["name"] for o in data["objectives"]}


class MaskedThirdParty:
    """An installed masking objective that declares the shared modifier parameters."""

    @objreg.hookimpl
    def objreg_objective_info(self):
        return objreg.ObjectiveInfo(name="mymask", description="third-party masking",
                                    heads=(objreg.HeadSpec("lm", "lm"),), params=MODIFIER_PARAMS)

    @objreg.hookimpl
    def objreg_corrupt(self, batch):
        raise NotImplementedError

    @objreg.hookimpl
    def objreg_attention_mask(self, batch):
        raise NotImplementedError

    @objreg.hookimpl
    def objreg_loss(self, outputs, batch):
        raise NotImplementedError


def test_a_plugin_declaring_the_modifier_params_composes_with_them():
    def factory():
        pm = objreg.get_plugin_manager(load_entrypoints=False)
        pm.register(MaskedThirdParty(), name="mymask")
        return pm

    result = CliRunner().invoke(make_cli(factory), ["list", "--json"])
    assert result.exit_code == 0, result.output
    modifiers = {m["name"]: m for m in json.loads(result.stdout)["modifiers"]}
    assert "mymask" in modifiers["masking_policy"]["composes_with"]
    assert "mymask" in modifiers["consistency"]["composes_with"]
