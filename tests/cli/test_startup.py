"""What a command loads before it runs: ``objreg --version`` and ``import objreg`` need no torch,
and each command imports its own module only."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import json, sys
from objreg.cli import main
sys.argv = ["objreg", *json.loads(sys.argv[1])]
try:
    main()
except SystemExit as done:
    code = done.code
print(json.dumps({"code": code, "modules": sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "objreg"))}))
"""


def loaded(*args: str) -> tuple[int, list[str], str]:
    """Exit code, the torch and objreg modules loaded, and the output of ``objreg ARGS`` in a fresh interpreter."""
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(args)], capture_output=True, text=True,
                          timeout=1800, check=False)  # bounds a hang only
    result = json.loads(done.stdout.splitlines()[-1])
    return result["code"], result["modules"], done.stdout


def test_version_loads_neither_torch_nor_any_command():
    code, modules, output = loaded("--version")
    assert code == 0 and "objreg, version" in output
    assert not [m for m in modules if m == "torch" or m.startswith("torch.")]
    assert not [m for m in modules if m.startswith(("objreg.analysis", "objreg.plugins", "objreg.experiments"))]
    assert "objreg.cli.analyze" not in modules and "objreg.cli.listing" not in modules


def test_import_objreg_loads_no_torch():
    done = subprocess.run([sys.executable, "-c", "import sys, objreg; print('torch' in sys.modules)"],
                          capture_output=True, text=True, timeout=1800, check=True)  # bounds a hang only
    assert done.stdout.strip() == "False"


def test_a_command_imports_its_own_module_and_not_the_others():
    code, modules, _ = loaded("show", "mlm", "--json")
    assert code == 0
    assert "objreg.cli.show" in modules
    assert not [m for m in modules if m in ("objreg.cli.analyze", "objreg.cli.corrupt", "objreg.cli.experiment")]
    assert not [m for m in modules if m.startswith("objreg.analysis")]


def test_help_lists_every_command_without_loading_torch_or_any_command():
    code, modules, output = loaded("--help")
    assert code == 0 and all(name in output for name in ("analyze", "corrupt", "experiment", "list", "screen", "show"))
    assert not [m for m in modules if m == "torch" or m.startswith("torch.")]
    assert not [m for m in modules if m.startswith(("objreg.analysis", "objreg.plugins", "objreg.cli.analyze"))]


def test_the_help_list_says_what_each_command_says_of_itself():
    import importlib

    from objreg.cli import BUILTIN, SHORT_HELP

    assert set(SHORT_HELP) == set(BUILTIN)
    for name, (module, attribute) in BUILTIN.items():
        command = getattr(importlib.import_module(module), attribute)
        assert SHORT_HELP[name] == command.get_short_help_str(limit=10_000), name
