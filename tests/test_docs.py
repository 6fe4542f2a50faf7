"""The docs stay true to the code (datasette-style meta-tests): every hook has a section in
docs/hooks.md titled with its exact signature, and docs/cli.md holds the current --help of every
command.

After changing a command, regenerate docs/cli.md with::

    python tests/test_docs.py --write
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import click
import pytest
import torch
from click.testing import CliRunner

import objreg
from objreg.cli import make_cli

DOCS = Path(__file__).resolve().parents[1] / "docs"
#: Help is rendered at this width, so the page does not depend on the terminal it was made in.
HELP_WIDTH = 80


def hook_signatures() -> dict[str, str]:
    """``{"objreg_corrupt": "objreg_corrupt(batch, generator, params, vocab)", ...}``"""
    hooks = vars(objreg.get_plugin_manager(load_entrypoints=False).hook)
    return {name: f"{name}({', '.join(caller.spec.argnames)})" for name, caller in sorted(hooks.items())}


def builtin_cli() -> click.Group:
    # Only the built-ins: commands that installed plugins add do not belong in objreg's docs.
    return make_cli(lambda: objreg.get_plugin_manager(load_entrypoints=False))


def command_paths(group: click.Group) -> list[list[str]]:
    """Every command's words under ``group``, subcommands of nested groups included, in listing order."""
    paths: list[list[str]] = [[]]
    for name in group.list_commands(click.Context(group)):
        command = group.get_command(click.Context(group), name)
        if isinstance(command, click.Group):
            paths += [[name, *path] for path in command_paths(command)]
        else:
            paths.append([name])
    return paths


def help_texts() -> dict[str, str]:
    """``{"objreg": <objreg --help>, "objreg list": <objreg list --help>, ...}``"""
    group = builtin_cli()
    texts = {}
    for command in command_paths(group):
        result = CliRunner().invoke(group, [*command, "--help"], prog_name="objreg", terminal_width=HELP_WIDTH)
        assert result.exit_code == 0, result.output
        texts[" ".join(["objreg", *command])] = result.stdout
    return texts


def render_cli_page() -> str:
    parts = [
        "# Command-line reference\n",
        "Generated from the CLI's own `--help`. Regenerate it with `python tests/test_docs.py --write`;",
        "`tests/test_docs.py` fails when it is out of date. See also [hooks.md](hooks.md) and",
        "[writing-a-plugin.md](writing-a-plugin.md).\n",
    ]
    for command, text in help_texts().items():
        parts += [f"## {command}\n", "```text", text.rstrip(), "```\n"]
    return "\n".join(parts)


HOOKS = hook_signatures()
HELP = help_texts()


@pytest.mark.parametrize("hook", sorted(HOOKS))
def test_hook_has_a_section_with_its_signature(hook):
    assert f"\n## {HOOKS[hook]}\n" in (DOCS / "hooks.md").read_text()


def test_hooks_page_documents_no_missing_hook():
    documented = re.findall(r"^## (objreg_\w+)\(", (DOCS / "hooks.md").read_text(), flags=re.MULTILINE)
    assert sorted(documented) == sorted(HOOKS)


@pytest.mark.parametrize("command", sorted(HELP))
def test_cli_page_has_current_help(command):
    page = (DOCS / "cli.md").read_text()
    assert f"## {command}\n\n```text\n{HELP[command].rstrip()}\n```" in page, (
        f"docs/cli.md is out of date for `{command} --help`: run python tests/test_docs.py --write"
    )


def test_cli_page_covers_every_builtin_command():
    assert {"objreg", "objreg list", "objreg show", "objreg corrupt", "objreg analyze", "objreg experiment",
            "objreg experiment list", "objreg experiment run"} <= set(HELP)


def test_experiments_page_has_a_section_and_an_existing_plot_for_every_experiment():
    page = (DOCS / "experiments.md").read_text()
    for name in objreg.experiments.names():
        assert f"\n## {name}\n" in page, name
        assert f"](experiments/{name}.png)" in page, name
    for target in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", page):
        assert (DOCS / target).is_file(), target


def tutorial_module(title: str, tmp_path: Path):
    """The module of docs/writing-a-plugin.md whose docstring starts with ``title``, imported."""
    import importlib.util

    page = (DOCS / "writing-a-plugin.md").read_text()
    (source,) = [block for block in re.findall(r"```python\n(.*?)```", page, flags=re.S)
                 if block.startswith(f'"""{title}')]
    path = tmp_path / f"tutorial_{title.rstrip(':')}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_tutorial_plugins_work(tmp_path, tokenizer, texts):
    from objreg.core.registry import merge_heads
    from objreg.testing import TINY_MODEL, check_objective_contract

    pm = objreg.get_plugin_manager(load_entrypoints=False)
    pm.register(tutorial_module("rlm:", tmp_path), name="rlm")
    pm.register(tutorial_module("parity:", tmp_path), name="parity")
    registry = objreg.Registry(pm)
    check_objective_contract("rlm", registry=registry, params={"weight": 0.5})
    task = registry.get_task("parity")
    data = task.task_data(None, [objreg.split_sentences(t) for t in texts], tokenizer, 32, 100)
    assert data.heads == (objreg.HeadSpec("parity", "classifier", 2),)  # sized from the data: two classes
    model = registry.load_model("default", tokenizer.vocab, merge_heads({"parity": data.heads}), dict(TINY_MODEL),
                                torch.Generator().manual_seed(0))
    assert model.heads["parity"].classifier.out_features == 2
    assert task.losses(model, data.batch).shape == (data.batch.batch_size,)


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/test_docs.py --write   (rewrites docs/cli.md)")
    (DOCS / "cli.md").write_text(render_cli_page())
    print(f"wrote {DOCS / 'cli.md'}")
