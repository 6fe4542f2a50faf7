"""The import floors of docs/architecture.md, checked directly and transitively.

Directly: which objreg packages each layer's source names in its imports. Transitively: what
``sys.modules`` holds after importing a module in a fresh interpreter, so a floor cannot be
crossed through a chain of imports (``import objreg`` must not load the analyzer, scipy or more
of ``torch.distributed`` than torch itself loads).
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "objreg"

#: What each layer's source may import (the bare facade ``objreg`` where noted below).
ALLOWED = {
    "core": ("objreg.core",),
    "toolkit": ("objreg.core", "objreg.toolkit"),
    "plugins": ("objreg.toolkit",),
    # The run checks third-party objectives with the contract suite's cheap checks (run/contract.py).
    "analysis": ("objreg.core", "objreg.toolkit", "objreg.analysis", "objreg.testing"),
    # The rooms of analysis import only the rooms below them, and the record schema at its root.
    "analysis/parallel": ("objreg.core", "objreg.toolkit", "objreg.analysis.parallel"),
    "analysis/math": ("objreg.core", "objreg.toolkit", "objreg.analysis.math", "objreg.analysis.parallel",
                      "objreg.analysis.records"),
    "analysis/probe": ("objreg.core", "objreg.toolkit", "objreg.analysis.probe", "objreg.analysis.math",
                       "objreg.analysis.parallel", "objreg.analysis.records"),
    "experiments": ("objreg.toolkit", "objreg.analysis", "objreg.experiments", "objreg.testing"),
    "cli": ("objreg.cli", "objreg.toolkit", "objreg.analysis", "objreg.experiments", "objreg.testing"),
}
FACADE_OK = {"plugins", "experiments", "cli"}

#: Modules a layer must never load, even through other modules (beyond what ``import objreg`` loads,
#: which every submodule's import runs first).
HEAVY = ("scipy", "matplotlib", "transformers", "datasets")
NEVER = {
    "core": ("objreg.toolkit", "objreg.plugins", "objreg.analysis", "objreg.experiments", "objreg.cli", *HEAVY),
    "toolkit": ("objreg.plugins", "objreg.analysis", "objreg.experiments", "objreg.cli", *HEAVY),
    "plugins": ("objreg.analysis", "objreg.experiments", "objreg.cli", "scipy", "matplotlib"),
    "analysis": ("objreg.plugins", "objreg.experiments", "objreg.cli", "matplotlib", "transformers"),
    # run -> probe -> math -> parallel, never back.
    "analysis/probe": ("objreg.analysis.run",),
    "analysis/math": ("objreg.analysis.run", "objreg.analysis.probe"),
    "analysis/parallel": ("objreg.analysis.run", "objreg.analysis.probe", "objreg.analysis.math"),
}
#: The modules that exist to load matplotlib (imported only when plots are written) and to plug
#: into transformers' Trainer (imported only by its users).
EXEMPT = {"objreg.analysis.probe.plots": ("matplotlib",), "objreg.analysis.probe.hf_callback": ("transformers",)}


def objreg_imports(path: Path) -> list[str]:
    """The objreg modules ``path`` imports at run time (``if TYPE_CHECKING:`` blocks are annotations only)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and ast.unparse(node.test) ==
                   "TYPE_CHECKING" for child in node.body for n in ast.walk(child)}
    names = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return [n for n in names if n == "objreg" or n.startswith("objreg.")]


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(("objreg", *(parts[:-1] if parts[-1] == "__init__" else parts)))


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_layer_imports_stay_on_their_floor(layer):
    files = sorted((SRC / layer).rglob("*.py"))
    assert files
    bad = [
        f"{path.relative_to(SRC)}: {name}"
        for path in files
        for name in objreg_imports(path)
        if not (name.startswith(ALLOWED[layer]) or (layer in FACADE_OK and name == "objreg"))
    ]
    assert not bad, bad


# One interpreter imports torch once, then forks a child per module: each child starts from what
# torch alone loads and reports what importing the module added.
_PROBE = r"""
import json, os, sys
import torch
baseline = set(sys.modules)
out = {}
for name in json.loads(sys.argv[1]):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            __import__(name)
            added = sorted(set(sys.modules) - baseline)
        except Exception as error:
            added = [f"!import failed: {type(error).__name__}: {error}"]
        os.write(write, json.dumps(added).encode())
        os._exit(0)
    os.close(write)
    chunks = []
    while chunk := os.read(read, 1 << 16):
        chunks.append(chunk)
    os.waitpid(pid, 0)
    out[name] = json.loads(b"".join(chunks))
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def loaded() -> dict[str, list[str]]:
    """For every module of the floored layers and the facade: what importing it adds to ``sys.modules``."""
    names = ["objreg"] + sorted({module_name(p) for layer in NEVER for p in (SRC / layer).rglob("*.py")})
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(names)], capture_output=True, text=True,
                            env=env, timeout=600, check=True)
    return json.loads(result.stdout)


def test_import_objreg_loads_no_analysis_no_scipy_and_no_torch_distributed_of_its_own(loaded):
    added = loaded["objreg"]
    assert not [m for m in added if m.startswith(("objreg.analysis", "objreg.experiments", "objreg.cli",
                                                   "objreg.plugins", "scipy", "matplotlib", "torch.distributed"))]
    assert "objreg.core.hookspecs" in added and "objreg.core.manager" in added  # the probe does see imports
    # The contract's types (they need torch) load on first use.
    assert "objreg.core.registry" not in added and "objreg.toolkit.tokenizer" not in added


@pytest.mark.parametrize("layer", sorted(NEVER))
def test_no_layer_loads_what_is_above_it_transitively(loaded, layer):
    bad = {}
    facade = set(loaded["objreg"])
    for path in sorted((SRC / layer).rglob("*.py")):
        name = module_name(path)
        exempt = EXEMPT.get(name, ())
        added = [m for m in loaded[name] if m not in facade and not (exempt and m.startswith(exempt))]
        # A module loads itself, its parent packages and its own submodules; a plugin no other
        # plugin's module.
        own = {".".join(name.split(".")[:i]) for i in range(2, len(name.split(".")) + 1)}
        crossed = [m for m in added if m.startswith("!") or
                   (m not in own and not m.startswith(f"{name}.") and
                    (m.startswith(NEVER[layer]) or (layer == "plugins" and m.startswith("objreg.plugins."))))]
        if crossed:
            bad[name] = crossed
    assert not bad, bad


def test_every_public_module_imports():
    modules = ["objreg", "objreg.testing", "objreg.cli"]
    modules += [module_name(p) for p in SRC.rglob("*.py") if p.name != "__main__.py"]
    for module in modules:
        importlib.import_module(module)


def test_analysis_keeps_its_modules_in_rooms():
    loose = sorted(p.name for p in (SRC / "analysis").glob("*.py"))
    assert len(loose) <= 5, loose
    rooms = sorted(p.name for p in (SRC / "analysis").iterdir() if p.is_dir() and p.name != "__pycache__")
    assert rooms == ["math", "parallel", "probe", "run"]


def test_the_probe_and_its_outputs_load_none_of_the_run():
    code = ("import sys; from objreg import make_probe, ProbeSettings, TransferProbe, RunWriter, TensorBoardScalars; "
            "print([m for m in sys.modules if m.startswith('objreg.analysis.run')])")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600, check=True)
    assert out.stdout.strip() == "[]"
