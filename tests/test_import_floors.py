"""The import floors of DESIGN §2: core imports nothing else of objreg; plugins reach objreg only
through the public facade (and core helpers), never analysis, cli or another plugin; analysis
imports only core; cli imports only the facade."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "objreg"

ALLOWED = {
    "core": ("objreg.core",),
    "plugins": ("objreg.core",),  # plus the bare facade `objreg`, checked below
    "analysis": ("objreg.core", "objreg.analysis"),
    "experiments": ("objreg.core", "objreg.analysis", "objreg.experiments"),
    "cli": ("objreg.cli",),
}


def objreg_imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return [n for n in names if n == "objreg" or n.startswith("objreg.")]


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_layer_imports_stay_on_their_floor(layer):
    files = sorted((SRC / layer).rglob("*.py"))
    assert files
    facade_ok = layer in ("plugins", "cli")
    bad = [
        f"{path.relative_to(SRC)}: {name}"
        for path in files
        for name in objreg_imports(path)
        if not (name.startswith(ALLOWED[layer]) or (facade_ok and name == "objreg"))
    ]
    assert not bad, bad


def test_every_public_module_imports():
    import importlib

    modules = ["objreg", "objreg.testing", "objreg.cli"]
    modules += [
        "objreg." + ".".join(p.relative_to(SRC).with_suffix("").parts)
        for p in SRC.rglob("*.py")
        if p.name not in ("__init__.py", "__main__.py")
    ]
    for module in modules:
        importlib.import_module(module)
