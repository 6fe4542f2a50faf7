"""Runs that never lie (issue 18), one test or more per class of failure found by trying objreg as
a hostile and a careless user would:

1. resume trusts whatever it finds;       5. hangs;
2. same seed, different numbers;          6. "internal error" instead of one clear line;
3. a run directory has no owner;          7. the library API fails deep inside.
4. damaged files accepted;

Each test failed on the code before the fix (8ad306f) and passes now. They use only what that
code had too (the ``objreg`` facade, ``objreg.cli.make_cli``, the console script), so they can be
run against it: ``pytest --noconftest tests/test_reliability.py`` with that tree first on
``PYTHONPATH`` (docs/reliability.md).
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import objreg
from objreg.cli import make_cli

SMALL = dict(steps=4, batch_size=4, seq_len=48, eval_size=8, head_fit_size=16)
CLI_SMALL = ["--batch-size", "4", "--seq-len", "48", "--eval-size", "8", "--head-fit-size", "16"]
TEXT = "The committee met on Tuesday. It approved the budget for the new library. Members argued about the roof."


class Stop(Exception):
    pass


def stop_after(k):
    def on_step(step, record):
        if step == k - 1:
            raise Stop

    return on_step


def corpus_text(extra: str = "") -> str:
    topics = ["library", "river", "compiler", "orchestra", "garden", "mountain", "harbour", "engine"]
    blocks = [f"The {topics[i % 8]} number {i} opened on a Monday. People visited the {topics[i % 8]} often. "
              f"Reports about it were written every year. Nobody forgot the {topics[i % 8]} {i}."
              for i in range(160)]
    return "\n\n".join(blocks) + "\n" + extra


def builtins():
    return objreg.get_plugin_manager(load_entrypoints=False)


def cli():
    return make_cli(builtins)


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    """Every test starts with an empty cache of its own (this file also runs without conftest)."""
    monkeypatch.setenv("OBJREG_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("OBJREG_RAISE_ERRORS", raising=False)


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory):
    """A run on a relative ``--corpus`` (from its own working directory), stopped after 2 of 4
    steps; and the same run uninterrupted. Returns (workdir, interrupted dir, whole dir)."""
    root = tmp_path_factory.mktemp("runs")
    work = root / "work"
    work.mkdir()
    (work / "corpus.txt").write_text(corpus_text(), encoding="utf-8")
    before = os.getcwd()
    os.chdir(work)
    try:
        with pytest.raises(Stop):
            objreg.analyze("mlm,sop", "qa", **SMALL, corpus="corpus.txt", out_dir="killed", cache=root / "cacheA",
                           on_step=stop_after(2))
        objreg.analyze("mlm,sop", "qa", **SMALL, corpus="corpus.txt", out_dir="whole", cache=root / "cacheB")
    finally:
        os.chdir(before)
    return work, work / "killed", work / "whole"


def copy_of(run: Path, tmp_path: Path) -> Path:
    target = tmp_path / "run"
    shutil.copytree(run, target)
    return target


def one_line(text: str) -> str:
    """The one error line (warnings, each a line of their own, and the plain progress lines of the
    stages that ran, ``[0:00:01] loading corpus ...``, aside)."""
    lines = [line for line in text.strip().splitlines()
             if line.strip() and not line.startswith("Warning:") and not re.match(r"\[\d+:\d\d:\d\d\] ", line)]
    assert len(lines) == 1, text
    assert "Traceback" not in text and "internal error" not in text, text
    return lines[0]


# -- 1. resume trusts whatever it finds -------------------------------------------------------------


def test_1_resume_from_another_directory_with_an_empty_cache_ends_as_the_uninterrupted_run(
        interrupted, tmp_path, monkeypatch):
    work, killed, whole = interrupted
    run = copy_of(killed, tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    objreg.analyze(resume=run, cache=tmp_path / "empty-cache")
    for name in ("report.json", "steps.jsonl", "report.csv"):
        assert (run / name).read_bytes() == (whole / name).read_bytes(), name


def test_1_resume_refuses_an_edited_config_json(interrupted, tmp_path, monkeypatch):
    monkeypatch.chdir(interrupted[0])  # where the run started: only config.json differs
    run = copy_of(interrupted[1], tmp_path)
    config = json.loads((run / "config.json").read_text())
    config["steps"] = 3
    (run / "config.json").write_text(json.dumps(config))
    with pytest.raises(objreg.ObjregError, match="config.json"):
        objreg.analyze(resume=run)
    assert not (run / "report.json").exists()


def test_1_resume_refuses_a_corpus_whose_content_changed(interrupted, tmp_path, monkeypatch):
    work, killed, _ = interrupted
    monkeypatch.chdir(work)  # where the run started: only the corpus's content differs
    run = copy_of(killed, tmp_path)
    original = (work / "corpus.txt").read_text()
    (work / "corpus.txt").write_text(corpus_text("\nA sentence added later. It changes the numbers.\n"))
    try:
        with pytest.raises(objreg.ObjregError, match="corpus.*changed"):
            objreg.analyze(resume=run)
    finally:
        (work / "corpus.txt").write_text(original)
    assert not (run / "report.json").exists()


def test_1_the_tokenizer_is_kept_in_the_run_directory_and_resumed_from_there(interrupted, tmp_path, monkeypatch):
    monkeypatch.chdir(interrupted[0])
    run = copy_of(interrupted[1], tmp_path)
    assert (run / "tokenizer.json").is_file()
    cache = tmp_path / "empty-cache"
    objreg.analyze(resume=run, cache=cache)
    # Nothing was trained or cached again: the run's own tokenizer was used.
    assert not list(cache.glob("default-tokenizer-*"))


class NoHooks:
    """An installed plugin that adds nothing (its version still decides whether a run may resume)."""


def _registry_with(origin: str):
    pm = objreg.get_plugin_manager(load_entrypoints=False)
    pm.register_plugin(NoHooks(), "extras", origin)
    return objreg.Registry(pm)


def test_1_resume_refuses_other_plugin_versions(tmp_path):
    (tmp_path / "corpus.txt").write_text(corpus_text())
    run = tmp_path / "run"
    with pytest.raises(Stop):
        objreg.analyze("mlm", "qa", **SMALL, corpus=str(tmp_path / "corpus.txt"), out_dir=run,
                       registry=_registry_with("extras-dist 1.0"), on_step=stop_after(1))
    with pytest.raises(objreg.ObjregError, match="extras"):
        objreg.analyze(resume=run, registry=_registry_with("extras-dist 1.1"))


# -- 2. same seed, same numbers, on any machine -----------------------------------------------------


def test_2_a_user_corpus_gives_the_same_tokenizer_with_every_empty_cache(tmp_path, shared_file):
    wikitext = shared_file("wikitext-2/valid.txt")
    registry = objreg.Registry.load(load_entrypoints=False)
    vocabularies = []
    for i in range(3):
        cache = tmp_path / f"cache{i}"
        corpus = registry.load_corpus(str(wikitext), cache)
        vocabularies.append(registry.load_tokenizer("default", corpus, cache).backend.get_vocab())
    assert vocabularies[0] == vocabularies[1] == vocabularies[2]


# -- 3. one owner per run directory -----------------------------------------------------------------


def test_3_a_fresh_run_refuses_an_interrupted_runs_directory(interrupted, tmp_path):
    run = copy_of(interrupted[1], tmp_path)
    checkpoint = (run / "checkpoint.pt").read_bytes()
    result = CliRunner().invoke(cli(), ["analyze", "--pretrain", "mlm", "--steps", "1", *CLI_SMALL, "--out", str(run)])
    assert result.exit_code == 1
    assert "--resume" in one_line(result.stderr)
    assert (run / "checkpoint.pt").read_bytes() == checkpoint


def test_3_empty_out_is_refused_and_leaves_the_working_directory_alone(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.json").write_text('{"mine": true}')
    result = CliRunner().invoke(cli(), ["analyze", "--pretrain", "mlm", "--steps", "1", *CLI_SMALL, "--out", ""])
    assert result.exit_code == 1
    assert "--out" in one_line(result.stderr)
    assert (tmp_path / "config.json").read_text() == '{"mine": true}'
    assert not [p.name for p in tmp_path.iterdir() if p.name in ("steps.jsonl", "report.json", "checkpoint.pt")]


def test_3_empty_corpus_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text(corpus_text())
    result = CliRunner().invoke(cli(), ["analyze", "--pretrain", "mlm", "--steps", "1", *CLI_SMALL, "--corpus", ""])
    assert result.exit_code == 1
    assert "--corpus" in one_line(result.stderr)


def test_3_stale_temporary_files_of_an_interrupted_write_are_removed(interrupted, tmp_path, monkeypatch):
    monkeypatch.chdir(interrupted[0])
    run = copy_of(interrupted[1], tmp_path)
    stale = [run / ".checkpoint.pt.k2j3h4.tmp", run / ".report.json.abc123.tmp"]
    for path in stale:
        path.write_bytes(b"half written")
    objreg.analyze(resume=run)
    assert not any(path.exists() for path in stale)


def _cli_process(*args: str, cwd: Path | None = None) -> subprocess.Popen:
    env = {**os.environ, "OBJREG_RAISE_ERRORS": "0"}
    return subprocess.Popen([sys.executable, "-m", "objreg", "analyze", *args], env=env, cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.e2e
def test_3_a_second_run_on_a_directory_in_use_is_refused(tmp_path, stderr_until):
    (tmp_path / "corpus.txt").write_text(corpus_text())
    out = tmp_path / "run"
    first = _cli_process("--pretrain", "mlm", "--steps", "60", *CLI_SMALL, "--corpus", str(tmp_path / "corpus.txt"),
                         "--out", str(out))
    try:
        # The run reports each probed step on stderr once its line of steps.jsonl is written.
        stderr_until(first, lambda _: (out / "steps.jsonl").exists()
                     and (out / "steps.jsonl").read_text().count("\n") >= 1, "one step")
        steps = (out / "steps.jsonl").read_text()
        second = CliRunner().invoke(cli(), ["analyze", "--pretrain", "mlm", "--steps", "2", *CLI_SMALL, "--corpus",
                                            str(tmp_path / "corpus.txt"), "--out", str(out)])
        assert second.exit_code == 1
        assert "in use" in one_line(second.stderr)
        assert (out / "steps.jsonl").read_text().startswith(steps)
    finally:
        first.kill()
        first.communicate()


# -- 4. damaged files refused ----------------------------------------------------------------------


def test_4_a_checkpoint_with_a_flipped_byte_is_refused(interrupted, tmp_path, monkeypatch):
    monkeypatch.chdir(interrupted[0])
    run = copy_of(interrupted[1], tmp_path)
    data = bytearray((run / "checkpoint.pt").read_bytes())
    data[len(data) // 2] ^= 0x10
    (run / "checkpoint.pt").write_bytes(bytes(data))
    with pytest.raises(objreg.ObjregError, match="checkpoint.pt"):
        objreg.analyze(resume=run)
    assert not (run / "report.json").exists()


# -- 5. hangs ------------------------------------------------------------------------------------


def _run_with_timeout(args: list[str], timeout: float = 1800, shell: bool = False) -> subprocess.CompletedProcess:
    """``args`` in a child; a child still running after ``timeout`` seconds hangs (the only bound)."""
    env = {**os.environ, "OBJREG_RAISE_ERRORS": "0"}
    command = args if not shell else ["bash", "-c", args[0]]
    try:
        return subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"hung for {timeout} s: {args}")


@pytest.mark.e2e
def test_5_a_huge_steps_fails_at_once():
    done = _run_with_timeout([sys.executable, "-m", "objreg", "analyze", "--pretrain", "mlm", "--steps", str(10**12)])
    assert done.returncode == 1
    assert "steps" in one_line(done.stderr)


@pytest.mark.e2e
def test_5_a_fifo_as_corpus_does_not_block(tmp_path):
    fifo = tmp_path / "corpus.txt"
    os.mkfifo(fifo)
    done = _run_with_timeout([sys.executable, "-m", "objreg", "analyze", "--pretrain", "mlm", "--corpus", str(fifo)])
    assert done.returncode == 1
    assert "corpus.txt" in one_line(done.stderr)


@pytest.mark.e2e
def test_5_a_pipe_as_corpus_is_refused_not_read_twice(tmp_path):
    (tmp_path / "corpus.txt").write_text(corpus_text())
    command = (f"{sys.executable} -m objreg analyze --pretrain mlm --steps 1 {' '.join(CLI_SMALL)} "
               f"--corpus <(cat {tmp_path / 'corpus.txt'})")
    done = _run_with_timeout([command], shell=True)
    assert done.returncode == 1
    line = one_line(done.stderr)
    assert "pipe" in line and "empty" not in line


def test_5_a_long_run_with_a_builtin_schedule_is_configured_at_once():
    start = time.process_time()
    objreg.AnalysisConfig(pretrain=("mlm", "sop"), steps=1_000_000, schedule="mlm=cosine,sop=linear:0:1")
    assert time.process_time() - start < 0.5


# -- 6. one clear line instead of "internal error" ------------------------------------------------


def test_6_a_huge_seed_is_one_clear_line():
    result = CliRunner().invoke(cli(), ["analyze", "--pretrain", "mlm", "--steps", "1", *CLI_SMALL, "--seed",
                                        str(10**30)])
    assert result.exit_code == 1
    assert "seed" in one_line(result.stderr)


def test_6_a_huge_spectrum_is_one_clear_line():
    result = CliRunner().invoke(cli(), ["analyze", "--pretrain", "mlm", "--steps", "1", *CLI_SMALL, "--spectrum",
                                        "100000"])
    assert result.exit_code == 1
    assert "spectrum" in one_line(result.stderr)


def test_6_deeply_nested_json_is_one_clear_line(tmp_path):
    nested = tmp_path / "squad.json"
    nested.write_text('{"data": ' + "[" * 100_000 + "]" * 100_000 + "}")
    result = CliRunner().invoke(cli(), ["analyze", "--pretrain", "mlm", "--steps", "1", *CLI_SMALL,
                                        "--downstream-data", str(nested)])
    assert result.exit_code == 1
    assert "squad.json" in one_line(result.stderr)


def test_6_a_full_disk_is_one_line_that_says_what_to_do(tmp_path, monkeypatch):
    (tmp_path / "corpus.txt").write_text(corpus_text())

    def fsync(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", fsync)
    result = CliRunner().invoke(cli(), ["analyze", "--pretrain", "mlm", "--steps", "1", *CLI_SMALL, "--corpus",
                                        str(tmp_path / "corpus.txt"), "--out", str(tmp_path / "run")])
    assert result.exit_code == 1
    assert "space" in one_line(result.stderr).lower()


def test_6_an_unwritable_experiment_out_is_one_clear_line():
    result = CliRunner().invoke(cli(), ["experiment", "run", "nsp-vs-sop", "--quick", "--out", "/dev/null/results"])
    assert result.exit_code == 1
    assert "/dev/null/results" in one_line(result.stderr)


@pytest.mark.e2e
def test_6_running_out_of_memory_is_one_line_that_says_what_to_change(tmp_path):
    (tmp_path / "corpus.txt").write_text(corpus_text())
    command = (f"ulimit -v 3000000; {sys.executable} -m objreg analyze --pretrain mlm --steps 1 --batch-size 2048 "
               f"--seq-len 1024 --eval-size 4 --head-fit-size 8 "
               f"--corpus {tmp_path / 'corpus.txt'}")
    done = _run_with_timeout([command], shell=True)
    assert done.returncode == 1
    line = one_line(done.stderr)
    assert "memory" in line and "--batch-size" in line


class RaisingObjective:
    @objreg.hookimpl
    def objreg_objective_info(self):
        return objreg.ObjectiveInfo(name="boom", description="an objective whose hooks raise")

    @objreg.hookimpl
    def objreg_corrupt(self, batch, generator):
        raise ValueError("boom in corrupt")

    @objreg.hookimpl
    def objreg_attention_mask(self, batch):
        raise ValueError("boom in attention")

    @objreg.hookimpl
    def objreg_loss(self, outputs, batch):
        raise ValueError("boom in loss")


def test_6_a_raising_plugin_hook_names_the_plugin_hook_and_distribution():
    def factory():
        pm = objreg.get_plugin_manager(load_entrypoints=False)
        pm.register_plugin(RaisingObjective(), "boom", "boom-objectives 1.2.0")
        return pm

    result = CliRunner().invoke(make_cli(factory), ["corrupt", "boom", "--text", TEXT])
    assert result.exit_code == 1
    line = one_line(result.stderr)
    for part in ("boom", "objreg_corrupt", "boom-objectives 1.2.0", "OBJREG_LOAD_PLUGINS"):
        assert part in line


class _Payload:
    def __reduce__(self):
        return (print, ("unpickled",))


def test_6_a_pickled_pytorch_model_bin_is_one_clear_line(tmp_path):
    transformers = pytest.importorskip("transformers")
    tokenizer = objreg.default_tokenizer()
    config = transformers.BertConfig(vocab_size=tokenizer.vocab.size, hidden_size=16, num_hidden_layers=1,
                                     num_attention_heads=2, intermediate_size=32, max_position_embeddings=128)
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    config.save_pretrained(model_dir)
    tokenizer.backend.save(str(model_dir / "tokenizer.json"))
    state = dict(transformers.BertModel(config).state_dict())
    state["extra"] = _Payload()
    torch.save(state, model_dir / "pytorch_model.bin")
    result = CliRunner().invoke(cli(), ["analyze", "--pretrain", "mlm", "--steps", "1", *CLI_SMALL, "--model",
                                        str(model_dir)])
    assert result.exit_code == 1
    assert "pytorch_model.bin" in one_line(result.stderr)


# -- 7. the library API ---------------------------------------------------------------------------


def test_7_analyze_refuses_wrong_types_at_the_door():
    with pytest.raises(objreg.ObjregError, match="pretrain"):
        objreg.analyze(pretrain=123)
    with pytest.raises(objreg.ObjregError, match="stpes"):
        objreg.analyze("mlm", stpes=3)


def test_7_get_objective_refuses_a_name_that_is_not_a_string():
    with pytest.raises(objreg.ObjregError, match="str"):
        objreg.get_objective(["mlm"])


def test_7_corrupt_refuses_a_batch_beyond_its_vocabulary():
    tokenizer = objreg.default_tokenizer()
    batch = objreg.tokenize([TEXT, "Zebras wander quietly near the harbour."], 48, tokenizer)
    small = dataclasses.replace(tokenizer.vocab, size=100)
    objective = objreg.get_objective("mlm", vocab=small)
    with pytest.raises(objreg.ObjregError, match="vocabulary"):
        objective.corrupt(batch, torch.Generator().manual_seed(0))


def test_7_corrupt_refuses_a_string_for_a_batch():
    objective = objreg.get_objective("mlm", vocab=objreg.default_tokenizer().vocab)
    with pytest.raises(objreg.ObjregError, match="TokenBatch"):
        objective.corrupt(TEXT, torch.Generator())



@pytest.mark.e2e
def test_1_killed_after_two_steps_and_resumed_elsewhere_with_an_empty_cache_ends_byte_identical(tmp_path, stderr_until):
    """The done-when of issue 18, with real processes: kill -9 after two steps, resume from another
    working directory with an empty cache; and the same resume refused once config.json is edited."""
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    work.mkdir()
    elsewhere.mkdir()
    (work / "corpus.txt").write_text(corpus_text())
    args = ["--pretrain", "mlm,sop", "--steps", "6", *CLI_SMALL, "--corpus", "corpus.txt"]

    def env(cache: str) -> dict:
        return {**os.environ, "OBJREG_RAISE_ERRORS": "0", "OBJREG_CACHE_DIR": str(tmp_path / cache)}

    killed = subprocess.Popen([sys.executable, "-m", "objreg", "analyze", *args, "--out", "killed"], cwd=work,
                              env=env("cache-killed"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    steps = work / "killed" / "steps.jsonl"
    # The run reports each probed step on stderr once its line of steps.jsonl is written.
    stderr_until(killed, lambda _: steps.exists() and steps.read_text().count("\n") >= 2, "two steps")
    killed.kill()
    killed.communicate()
    assert not (work / "killed" / "report.json").exists()
    edited = tmp_path / "edited"
    shutil.copytree(work / "killed", edited)
    whole = subprocess.run([sys.executable, "-m", "objreg", "analyze", *args, "--out", "whole"], cwd=work,
                           env=env("cache-whole"), capture_output=True, text=True)
    assert whole.returncode == 0, whole.stderr

    resumed = subprocess.run([sys.executable, "-m", "objreg", "analyze", "--resume", str(work / "killed")],
                             cwd=elsewhere, env=env("cache-empty"), capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    for name in ("report.json", "steps.jsonl", "report.csv", "config.json"):
        assert (work / "killed" / name).read_bytes() == (work / "whole" / name).read_bytes(), name

    config = json.loads((edited / "config.json").read_text())
    config["lr"] = 0.5
    (edited / "config.json").write_text(json.dumps(config, indent=2))
    refused = subprocess.run([sys.executable, "-m", "objreg", "analyze", "--resume", str(edited)],
                             cwd=elsewhere, env=env("cache-empty2"), capture_output=True, text=True)
    assert refused.returncode == 1
    assert "config.json was edited" in one_line(refused.stderr)
    assert not (edited / "report.json").exists()
