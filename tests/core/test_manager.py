"""The plugin manager factory: fresh managers, built-ins with their origin, load problems,
tracing, and entry points that fail to import."""

from __future__ import annotations

import importlib
import sys

import pytest

import objreg
from objreg.core.manager import BUILTIN_DISTRIBUTION, BUILTIN_PLUGINS, ObjregPluginManager


class Info:
    def __init__(self, name: str):
        self.name = name

    @objreg.hookimpl
    def objreg_register_models(self, register):
        register(objreg.Provider("model", self.name, "a throwaway provider", lambda *args: None))


def test_fresh_manager_each_call():
    a = objreg.get_plugin_manager(load_entrypoints=False)
    b = objreg.get_plugin_manager(load_entrypoints=False)
    assert a is not b and isinstance(a, ObjregPluginManager)
    a.register(Info("only-in-a"), name="extra")
    assert a.has_plugin("extra") and not b.has_plugin("extra")
    assert "only-in-a" in {p.name for p in objreg.Registry(a).providers()}
    assert "only-in-a" not in {p.name for p in objreg.Registry(b).providers()}
    a.load_problems.append("something")
    assert b.load_problems == []
    assert objreg.get_plugin_manager(load_entrypoints=False).load_problems == []


def test_builtins_registered_with_their_origin():
    pm = objreg.get_plugin_manager(load_entrypoints=False)
    names = [name for name, _ in BUILTIN_PLUGINS]
    assert {n for n, _ in pm.list_name_plugin()} == set(names)
    for name, module in BUILTIN_PLUGINS:
        assert pm.get_plugin(name) is importlib.import_module(module)
        assert pm.origin(name) == BUILTIN_DISTRIBUTION == "objreg (built-in)"
    assert pm.origins == {n: "objreg (built-in)" for n in names}
    assert pm.load_problems == []
    assert pm.origin("not-registered") == "registered at run time"


def test_without_builtins_the_manager_is_empty():
    pm = objreg.get_plugin_manager(load_entrypoints=False, builtins=False)
    assert pm.get_plugins() == set()
    assert pm.origins == {} and pm.load_problems == []
    registry = objreg.Registry(pm)
    assert registry.objectives() == [] and registry.tasks() == [] and registry.providers() == []
    # the hook specs are there: a plugin registered later is validated against them
    pm.register(Info("late"), name="late")
    assert [p.name for p in objreg.Registry(pm).providers()] == ["late"]


def test_second_plugin_under_a_taken_name_is_a_load_problem():
    pm = objreg.get_plugin_manager(load_entrypoints=False)
    pm.register_plugin(Info("x"), "mlm", "evil-dist 2.0")
    assert pm.load_problems == ["two plugins claim the name 'mlm': objreg (built-in) and evil-dist 2.0"]
    assert pm.get_plugin("mlm") is importlib.import_module("objreg.plugins.objectives.mlm")  # first stays
    assert pm.origin("mlm") == "objreg (built-in)"
    with pytest.raises(objreg.PluginError) as e:
        objreg.Registry(pm)
    assert e.value.problems == pm.load_problems
    assert "objreg (built-in) and evil-dist 2.0" in str(e.value)


def test_register_plugin_records_pluggy_validation_failures():
    class WrongArgument:
        @objreg.hookimpl
        def objreg_register_models(self, not_an_argument):
            pass

    pm = objreg.get_plugin_manager(load_entrypoints=False)
    pm.register_plugin(WrongArgument(), "wrong", "wrong-dist 1.0")
    assert len(pm.load_problems) == 1
    assert pm.load_problems[0].startswith("plugin 'wrong' from wrong-dist 1.0: ")
    assert "not_an_argument" in pm.load_problems[0]
    assert not pm.has_plugin("wrong") and "wrong" not in pm.origins
    with pytest.raises(objreg.PluginError, match="wrong-dist 1.0"):
        objreg.Registry(pm)


def test_same_module_under_a_second_name_is_a_load_problem():
    pm = objreg.get_plugin_manager(load_entrypoints=False)
    pm.register_plugin(importlib.import_module("objreg.plugins.objectives.mlm"), "mlm2", "copy-dist 1.0")
    assert any("mlm2" in p and "copy-dist 1.0" in p for p in pm.load_problems)


def test_clash_with_a_hand_registered_plugin_names_its_origin():
    pm = objreg.get_plugin_manager(load_entrypoints=False, builtins=False)
    pm.register(Info("a"), name="x")
    pm.register_plugin(Info("b"), "x", "late-dist 1.0")
    assert pm.load_problems == ["two plugins claim the name 'x': registered at run time and late-dist 1.0"]


# -- tracing ------------------------------------------------------------------------------------


def test_trace_prints_hook_calls(monkeypatch, capsys):
    monkeypatch.setenv("OBJREG_TRACE_PLUGINS", "1")
    pm = objreg.get_plugin_manager(load_entrypoints=False)
    assert capsys.readouterr().err == ""  # building the manager calls no hook
    pm.hook.objreg_register_models(register=lambda provider: None)
    err = capsys.readouterr().err
    # pluggy's own tracing: the call with its arguments, then its finish.
    assert "objreg_register_models [hook]" in err and "finish objreg_register_models" in err
    assert "register:" in err


def test_no_trace_by_default(monkeypatch, capsys):
    monkeypatch.delenv("OBJREG_TRACE_PLUGINS", raising=False)
    objreg.get_plugin_manager(load_entrypoints=False).hook.objreg_register_models(register=lambda provider: None)
    assert capsys.readouterr().err == ""


def test_trace_zero_means_off(monkeypatch, capsys):
    monkeypatch.setenv("OBJREG_TRACE_PLUGINS", "0")
    objreg.get_plugin_manager(load_entrypoints=False).hook.objreg_register_models(register=lambda provider: None)
    assert capsys.readouterr().err == ""


# -- an entry point that fails to import --------------------------------------------------------


@pytest.fixture
def broken_distribution(tmp_path, monkeypatch):
    info = tmp_path / "fake_pkg-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-pkg\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[objreg]\nbroken = fake_broken_module\n")
    (tmp_path / "fake_broken_module.py").write_text("raise RuntimeError('fake plugin exploded on import')\n")
    monkeypatch.delenv("OBJREG_LOAD_PLUGINS", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    yield tmp_path
    sys.modules.pop("fake_broken_module", None)


def test_entry_point_import_failure_names_the_distribution(broken_distribution):
    pm = objreg.get_plugin_manager()
    problems = [p for p in pm.load_problems if "'broken'" in p]
    assert problems == [
        "plugin 'broken' from fake-pkg 0.1 failed to import: RuntimeError: fake plugin exploded on import "
        "(OBJREG_LOAD_PLUGINS='' skips installed plugins)"
    ]
    assert not pm.has_plugin("broken")
    assert pm.has_plugin("mlm")  # the built-ins still loaded
    with pytest.raises(objreg.PluginError) as e:
        objreg.Registry(pm)
    assert "fake-pkg 0.1" in str(e.value)
    assert "OBJREG_LOAD_PLUGINS" in str(e.value)


def test_the_escape_hatch_named_in_the_message_works(broken_distribution, monkeypatch):
    monkeypatch.setenv("OBJREG_LOAD_PLUGINS", "")
    registry = objreg.Registry(objreg.get_plugin_manager())
    assert registry.objectives() == objreg.Registry.load(load_entrypoints=False).objectives()
    assert "broken" not in registry.objectives()
