"""The example third-party plugin (examples/objreg-example-plugin) installed the way users install
plugins: pip puts it in a directory with its entry point, and objreg finds it with no change to
objreg itself."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import objreg
from objreg.cli import cli

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "objreg-example-plugin"
ORIGIN = "objreg-example-plugin 0.1.0"

# Installs the example package with pip into a temporary directory and runs real processes.
pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory) -> Path:
    """The example plugin pip-installed into a fresh directory (no network, no build isolation)."""
    # Build from a copy: pip writes build/ and *.egg-info next to the sources.
    source = tmp_path_factory.mktemp("example-src") / "objreg-example-plugin"
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    target = tmp_path_factory.mktemp("example-installed")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
         "--quiet", "--target", str(target), str(source)],
        check=True, capture_output=True, timeout=1800,  # bounds a hang only
    )
    return target


def fake_distribution(directory: Path, name: str, entry_points: str) -> Path:
    """A second installed distribution: just the metadata pip would write, pointing its entry
    point at the example's module (which the plugin directory provides)."""
    info = directory / f"{name.replace('-', '_')}-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(textwrap.dedent(entry_points))
    return directory


def run_objreg(*args: str, path: list[Path]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("OBJREG_LOAD_PLUGINS", "OBJREG_RAISE_ERRORS")}
    env["PYTHONPATH"] = os.pathsep.join([*map(str, path), *filter(None, [os.environ.get("PYTHONPATH")])])
    return subprocess.run(
        [sys.executable, "-m", "objreg", *args], capture_output=True, text=True, env=env, timeout=1800
    )


@pytest.fixture
def plugin_on_path(plugin_dir, monkeypatch):
    """The installed plugin importable in this process; sys.path and sys.modules restored after."""
    monkeypatch.delenv("OBJREG_LOAD_PLUGINS", raising=False)
    monkeypatch.syspath_prepend(str(plugin_dir))  # also calls importlib.invalidate_caches()
    yield plugin_dir
    for module in [m for m in sys.modules if m.split(".")[0] == "objreg_example_plugin"]:
        del sys.modules[module]


# -- through the installed command line ----------------------------------------------------------


def test_list_and_show_find_the_installed_plugin(plugin_dir):
    listed = run_objreg("list", "--json", path=[plugin_dir])
    assert listed.returncode == 0, listed.stderr
    objectives = {o["name"]: o for o in json.loads(listed.stdout)["objectives"]}
    assert objectives["rlm"]["origin"] == ORIGIN
    assert objectives["rlm"]["attention"] == "anti-causal"
    assert objectives["mlm"]["origin"] == "objreg (built-in)"

    shown = run_objreg("show", "rlm", "--json", path=[plugin_dir])
    assert shown.returncode == 0, shown.stderr
    info = json.loads(shown.stdout)
    assert info["origin"] == ORIGIN
    assert [p["name"] for p in info["params"]] == ["predict_special"]
    assert info["heads"] == [{"name": "lm", "kind": "lm", "num_outputs": 0}]


def test_two_distributions_claiming_one_name(plugin_dir, tmp_path):
    clash = fake_distribution(tmp_path, "objreg-rlm-copy", "[objreg]\nrlm = objreg_example_plugin.rlm\n")
    result = run_objreg("list", path=[plugin_dir, clash])
    assert result.returncode == 1
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("Error: plugin contract broken: two distributions claim the plugin name 'rlm'")
    assert ORIGIN in result.stderr and "objreg-rlm-copy 0.1.0" in result.stderr


# -- in this process ------------------------------------------------------------------------------


def test_registry_finds_the_plugin(plugin_on_path):
    registry = objreg.Registry.load()
    assert "rlm" in registry.objectives()
    assert registry.origin("rlm") == ORIGIN


def test_load_plugins_env_is_an_allow_list(plugin_on_path, monkeypatch):
    monkeypatch.setenv("OBJREG_LOAD_PLUGINS", "")
    assert "rlm" not in objreg.Registry.load().objectives()
    monkeypatch.setenv("OBJREG_LOAD_PLUGINS", "rlm")
    assert "rlm" in objreg.Registry.load().objectives()


def test_a_plugin_may_not_take_a_builtin_name(plugin_on_path, tmp_path, monkeypatch):
    clash = fake_distribution(tmp_path, "objreg-mlm-clash", "[objreg]\nmlm = objreg_example_plugin.rlm\n")
    monkeypatch.syspath_prepend(str(clash))
    monkeypatch.delenv("OBJREG_RAISE_ERRORS", raising=False)
    result = CliRunner().invoke(cli, ["list"])
    assert result.exit_code == 1
    assert result.stderr == (
        "Error: plugin contract broken: two plugins claim the name 'mlm': "
        "objreg (built-in) and objreg-mlm-clash 0.1.0\n"
    )


def test_corrupt_mask_and_loss(plugin_on_path, tokenizer, texts):
    registry = objreg.Registry.load()
    rlm = registry.get("rlm", vocab=tokenizer.vocab)
    batch = tokenizer.batch_from_texts(texts[:3], seq_len=24)
    corrupted = rlm.corrupt(batch, torch.Generator().manual_seed(0))

    # Every label is the previous token; [CLS] (special) and position 0 are never targets.
    labelled = corrupted.labels != objreg.IGNORE_INDEX
    assert labelled.any()
    assert not labelled[:, :2].any()
    assert torch.equal(corrupted.labels[:, 1:][labelled[:, 1:]], batch.input_ids[:, :-1][labelled[:, 1:]])
    assert not (labelled & batch.is_padding).any()
    with_special = registry.get("rlm", vocab=tokenizer.vocab, predict_special=True)
    assert (with_special.corrupt(batch, torch.Generator()).labels[:, 1] == tokenizer.vocab.cls_id).all()

    # Anti-causal: query i sees exactly the real keys j >= i.
    mask = rlm.attention_mask(corrupted)
    n = int((~batch.is_padding[0]).sum())
    expected = torch.ones(n, n, dtype=torch.bool).triu()
    assert torch.equal(mask[0, :n, :n], expected)
    assert not (mask & batch.is_padding[:, None, :]).any()  # padding is never attended to

    model = registry.load_model("default", tokenizer.vocab, rlm.info.heads, {}, torch.Generator().manual_seed(0))
    hidden = model.encode(corrupted.input_ids, mask, corrupted.position_ids)
    loss = rlm.loss(objreg.ModelOutputs(hidden, model), corrupted)
    assert loss.shape == (3,)
    assert torch.isfinite(loss).all() and (loss > 0).all()


def test_contract_suite(plugin_on_path):
    from objreg.testing import check_objective_contract

    passed = check_objective_contract("rlm", registry=objreg.Registry.load())
    assert any("vmap" in check for check in passed)
