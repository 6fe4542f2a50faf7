"""No module of ``objreg.analysis`` imports an underscore name from another room (run, probe,
math, parallel): what one room takes from another is that room's public surface, so a private
helper can change without breaking a room it was never meant for."""

from __future__ import annotations

import ast
from pathlib import Path

import objreg.analysis

ANALYSIS = Path(objreg.analysis.__file__).parent
ROOMS = ("run", "probe", "math", "parallel")


def room_of(module: str) -> str | None:
    """``probe`` for ``objreg.analysis.probe.engine``; None outside the rooms (``records``, core, ...)."""
    parts = module.split(".")
    return parts[2] if parts[:2] == ["objreg", "analysis"] and len(parts) > 2 and parts[2] in ROOMS else None


def module_name(path: Path) -> str:
    parts = path.relative_to(ANALYSIS.parent.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def private_imports(source: str, module: str, package: str) -> list[str]:
    """What ``module`` (in ``package``) takes from another room under an underscore name: ``from M
    import _x`` (relative too), ``import M._x``, and ``m._x`` where ``m`` was imported from
    another room (a module or a class)."""
    found, foreign = [], {}  # foreign: local name → what of another room it is bound to
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            origin = node.module or ""
            if node.level:  # relative: resolved against the package
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                origin = ".".join([*base, *([node.module] if node.module else [])])
            pairs = [(alias.asname or alias.name, f"{origin}.{alias.name}") for alias in node.names]
        elif isinstance(node, ast.Import):
            pairs = [(alias.asname or alias.name, alias.name) for alias in node.names]
        else:
            continue
        for local, full in pairs:
            if room_of(full) not in (None, room_of(module)):
                foreign[local] = full
                if full.rpartition(".")[2].startswith("_"):
                    found.append(full)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in foreign
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            found.append(f"{foreign[node.value.id]}.{node.attr}")
    return found


def test_no_module_imports_a_private_name_from_another_room():
    offenders = {}
    for path in sorted(ANALYSIS.rglob("*.py")):
        module = module_name(path)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        if names := private_imports(path.read_text(), module, package):
            offenders[module] = names
    assert offenders == {}, f"private names imported across rooms (make them public or move them): {offenders}"


def test_the_check_sees_each_way_of_importing_a_private_name():
    """``from``-imports, relative ones, ``import``, and an attribute read off what another room
    gave are caught; a room's own private names and public names pass (else the test above could
    pass vacuously)."""
    source = """
from objreg.analysis.math.optimizers import _hidden, public
from objreg.analysis.probe.engine import _own_room_is_fine
from ..run.prepare import _loaded
from objreg.analysis.run import screen
from objreg.analysis.math.curvature import Curvature
import objreg.analysis.parallel._launcher
screen._seen
Curvature._method
Curvature.__name__
public.fine
"""
    assert sorted(private_imports(source, "objreg.analysis.probe.stand_in", "objreg.analysis.probe")) == [
        "objreg.analysis.math.curvature.Curvature._method", "objreg.analysis.math.optimizers._hidden",
        "objreg.analysis.parallel._launcher", "objreg.analysis.run.prepare._loaded",
        "objreg.analysis.run.screen._seen"]
