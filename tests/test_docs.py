"""The docs stay true to the code (datasette-style meta-tests): every hook has a section in
docs/hooks.md titled with its exact signature, docs/cli.md holds the current --help of every
command, and ``objreg analyze --help`` names every value the run accepts (the fixed choices that
``AnalysisConfig`` validates with, and the registry's objectives, tasks, models and corpora), so
help, docs/cli.md and validation cannot drift apart.

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
from objreg.analysis.math.curvature import HVP_METHODS
from objreg.analysis.math.per_sample import METHODS as PER_SAMPLE_METHODS
from objreg.analysis.parallel.devices import resolve_device
from objreg.analysis.run.config import CHOICES, DTYPES, OPTIMIZERS
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
        "The help of every command is generated from the CLI's own `--help` below. Regenerate this page",
        "with `python tests/test_docs.py --write`; `tests/test_docs.py` fails when it is out of date, and",
        "checks that `objreg analyze --help` names every value the run accepts. See also",
        "[hooks.md](hooks.md) and [writing-a-plugin.md](writing-a-plugin.md).\n",
        RUNNING,
    ]
    for command, text in help_texts().items():
        parts += [f"## {command}\n", "```text", text.rstrip(), "```\n"]
    return "\n".join(parts)


#: What docs/cli.md says about a running `objreg analyze`, before the generated help.
RUNNING = """## A run of `objreg analyze`: progress, stopping, output

**Threads.** The first line on stderr says how many CPU threads torch computes with and why:
`--threads N`, `OMP_NUM_THREADS` where set, or `auto`: the CPUs this process may use (its
affinity and a cgroup's CPU quota, shared among the processes torchrun started on the machine)
less the one-minute load average of other jobs, at least one. On a busy machine the `objreg`
command also lets OpenMP's waiting threads sleep (`OMP_WAIT_POLICY=PASSIVE`, set before torch
loads, where you set no policy). The report's header repeats the count.
[performance.md](performance.md#threads) gives the measured effect.

**Progress** goes to stderr. On a terminal: one line per finished stage with its time (loading
the corpus, the tokenizer and the task data, building the model, fitting the downstream head,
writing the report), then a bar with the steps done, the elapsed time and, from the first
finished step on, the ETA and the seconds per step; under it the latest probe's numbers: `D`
before and after the step, the improvement (positive: `D` fell) predicted to first and to first
plus second order against the actual improvement, and each objective's dot (with its 95% interval over examples), cosine and
share of conflicting examples. Where stderr is not a terminal (`nohup`, CI, `2> log`) the same
comes as plain lines, one per stage and one per probe, each stamped with the time since the
start (here the main job of the README at commit `53161e8`, 2026-12-06, one thread, on a 2-core
CPU shared with other jobs at load 6 to 7):

```text
[0:00:00] computing with 1 thread (OMP_NUM_THREADS); --threads N to change
[0:00:07] the downstream head is re-fitted at every probe, on 256 examples
[0:00:15] training with probes: 0/6 steps
[0:01:42] step 1/6 87.26 s/step, ETA 0:07:16 | D 2.8976 → 2.8902: improvement +0.007386, predicted +0.001915 (first order), +0.008332 (with second order) | mlm dot +0.5614 cosine +0.005; sop dot -0.1784 cosine -0.016
```

With `--json`, stdout holds the report and stderr only warnings or an error, and where stderr is
a terminal the live bar, which leaves nothing behind, so that a long run shows it is alive.

**Stopping.** Ctrl-C (SIGINT) or SIGTERM during training lets the step in flight finish (its
checkpoint written, with `--out`), then stops; a second one stops at once, abandoning that
step (the previous checkpoint stays). While loading, the first one stops at once. The command
then prints how to go on, and exits with 130 (SIGINT) or 143 (SIGTERM):

```text
Stopped with 7 of 20 steps done. Continue the run with:
  objreg analyze --resume runs/mlm-sop
```

The resumed run ends with the report of an uninterrupted one (`tests/cli/test_interrupt.py`).
Without `--out` there is nothing to resume, and it says so. Under `torchrun` the handlers are
left to torchrun (the processes could otherwise stop after different steps); `--resume`
continues from the last checkpoint as after `kill -9`.

**Output** goes to stdout. Redirected (`> log.txt`, a pipe), tables keep their natural width
instead of 80 columns. On a terminal every line of the default report fits an 80-column one
(`tests/cli/test_width.py` and `tests/test_readme.py` run it on an 80-column pseudo-terminal):
headers of number columns wrap, text wraps between words, numbers never break, a matrix of many
objectives becomes a list of its pairs, and a table that cannot fit even so is drawn wider than
the terminal rather than cutting a number (`tests/cli/test_output.py` compares `> log.txt` with
`--json`). `objreg list` stacks each entry (its name on one line, its description under it) where
its tables would not fit, so no name is split, and `objreg experiment list` is one line per
experiment (`objreg experiment show NAME` for the claim whole, its source and verdict rule).
"""

HOOKS = hook_signatures()
HELP = help_texts()


@pytest.mark.parametrize("hook", sorted(HOOKS))
def test_hook_has_a_section_with_its_signature(hook):
    assert f"\n## {HOOKS[hook]}\n" in (DOCS / "hooks.md").read_text()


def test_hooks_page_documents_no_missing_hook():
    documented = re.findall(r"^## (objreg_\w+)\(", (DOCS / "hooks.md").read_text(), flags=re.MULTILINE)
    assert sorted(documented) == sorted(HOOKS)


def flat(text: str) -> str:
    """Help text as one line: click wraps at spaces and after hyphens."""
    return re.sub(r"-\s+", "-", " ".join(text.split()))


def option_help(command: str, option: str) -> str:
    """The help of ``option`` in ``command``'s help, as one line."""
    lines = HELP[command].splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith(option + " "))
    end = next((i for i in range(start + 1, len(lines)) if lines[i].strip().startswith("-")), len(lines))
    return flat(" ".join(lines[start:end]))


@pytest.mark.parametrize("setting", sorted(CHOICES))
def test_analyze_help_names_every_accepted_value_and_the_default(setting):
    option = "--" + setting.replace("_", "-")
    text = option_help("objreg analyze", option)
    for value in CHOICES[setting]:
        assert f" {value}:" in text, (option, value, text)
    assert f"(default: {getattr(objreg.AnalysisConfig(pretrain=('mlm',)), setting)})" in text


@pytest.mark.parametrize("setting", sorted(set(CHOICES) - {"device"}))
def test_validation_accepts_exactly_the_values_the_help_names(setting):
    for value in CHOICES[setting]:
        assert getattr(objreg.AnalysisConfig(pretrain=("mlm",), **{setting: value}), setting) == value
    with pytest.raises(objreg.InvalidParameterError, match=f"{setting} must be one of {', '.join(CHOICES[setting])}"):
        objreg.AnalysisConfig(pretrain=("mlm",), **{setting: "nosuch"})
    methods = {"per_sample_method": PER_SAMPLE_METHODS, "hvp_method": HVP_METHODS}
    if setting in methods:  # the math's own list, not a copy of it
        assert CHOICES[setting] is methods[setting]
    else:
        assert set(CHOICES[setting]) == set({"optimizer": OPTIMIZERS, "dtype": DTYPES,
                                             "downstream_head": ("refit", "frozen")}[setting])


def test_every_device_form_the_help_names_is_one_the_resolver_takes():
    for form in CHOICES["device"]:
        try:
            resolve_device(form.replace(":N", ":0"))
        except objreg.DeviceError:
            pass  # a CUDA form on a machine without CUDA: accepted as a form, refused for the machine
    with pytest.raises(objreg.InvalidParameterError):
        resolve_device("tpu")


def test_analyze_help_names_every_objective_task_model_and_corpus_the_registry_accepts():
    registry = objreg.Registry.load(load_entrypoints=False)
    for option, names in (
        ("--pretrain", registry.objectives()),
        ("--downstream", registry.tasks()),
        ("--model", [p.name for p in registry.providers("model")]),
        ("--corpus", [p.name for p in registry.providers("corpus")]),
    ):
        text = option_help("objreg analyze", option)
        for name in names:
            assert flat(name) in text, (option, name, text)
    # ghost is what `auto` uses first; the issue found it missing.
    assert " ghost:" in option_help("objreg analyze", "--per-sample-method")


def test_a_plugin_s_task_shows_up_in_the_help():
    class Extra:
        @objreg.hookimpl
        def objreg_objective_info(self):
            return objreg.ObjectiveInfo(name="extratask", description="a task of a plugin", kind="downstream")

        @objreg.hookimpl
        def objreg_task_data(self, documents):
            raise NotImplementedError

        @objreg.hookimpl
        def objreg_attention_mask(self, batch):
            return objreg.AttentionMask.bidirectional(batch.is_padding)

        @objreg.hookimpl
        def objreg_loss(self, outputs, batch):
            raise NotImplementedError

    def manager():
        pm = objreg.get_plugin_manager(load_entrypoints=False)
        pm.register(Extra(), name="extratask")
        return pm

    result = CliRunner().invoke(make_cli(manager), ["analyze", "--help"], terminal_width=HELP_WIDTH)
    assert "extratask (a task of a plugin)" in flat(result.stdout)


@pytest.mark.parametrize("command", sorted(HELP))
def test_every_option_says_its_default(command):
    # Flags default to off, required options have none (--pretrain says "(required"); every other
    # option names its default.
    context = click.Context(builtin_cli())
    target = builtin_cli()
    for word in command.split()[1:]:
        target = target.get_command(context, word)
    for param in target.params:
        if not isinstance(param, click.Option) or param.is_flag or param.required or param.name == "help":
            continue
        record = param.get_help_record(click.Context(target, parent=context))
        assert "default" in record[1].lower() or "(required" in record[1] or param.show_default, (
            command, param.name, record)


@pytest.mark.parametrize("command", sorted(HELP))
def test_cli_page_has_current_help(command):
    page = (DOCS / "cli.md").read_text()
    assert f"## {command}\n\n```text\n{HELP[command].rstrip()}\n```" in page, (
        f"docs/cli.md is out of date for `{command} --help`: run python tests/test_docs.py --write"
    )


def test_cli_page_covers_every_builtin_command():
    assert {"objreg", "objreg list", "objreg show", "objreg corrupt", "objreg analyze", "objreg experiment",
            "objreg experiment list", "objreg experiment run"} <= set(HELP)


def test_probe_page_names_every_argument_of_the_callback_and_the_probe():
    import inspect

    pytest.importorskip("transformers")
    from objreg.analysis.probe.hf_callback import ProbeCallback
    from objreg.analysis.probe.transfer_probe import TransferProbe

    page = (DOCS / "probe.md").read_text(encoding="utf-8")
    callback = page.split("## Inside `transformers.Trainer`")[1].split("\n## ")[0]
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `(\*\*options|\w+)` \| (.*) \|$", callback, re.M)}
    arguments = [n for n, p in inspect.signature(ProbeCallback.__init__).parameters.items()
                 if n != "self" and p.kind is not p.VAR_KEYWORD]
    assert [n for n in rows if n != "**options"] == arguments
    probe = [n for n in inspect.signature(TransferProbe.__init__).parameters
             if n not in ("self", "model", "objectives", "downstream", "optimizer", "eval_batches", "weights")]
    assert [n for n in probe if f"`{n}`" not in rows["**options"]] == []


def test_hooks_page_documents_every_field_of_the_types_and_every_head_kind():
    import dataclasses

    page = (DOCS / "hooks.md").read_text()
    for cls in (objreg.ObjectiveInfo, objreg.Vocabulary, objreg.HeadSpec, objreg.HeadKind, objreg.Provider,
                objreg.Param):
        section = page[page.index(cls.__name__):]
        for field in dataclasses.fields(cls):
            assert field.name in section, (cls.__name__, field.name)
    for kind in objreg.Registry.load(load_entrypoints=False).head_kinds():
        assert f"`{kind}`" in page, kind
    for kind in objreg.core.types.LABEL_KINDS:
        assert f"`{kind}`" in page, kind


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
