"""The suite of bad inputs and faults (docs/reliability.md): every case, CLI or library, must fail
with its exit code (CLI: 1 for objreg's errors, 2 for click's usage errors) and one line naming
the culprit, never a traceback, in well under a second of this process's CPU, and leave every file
that was there before exactly as it was.

A case is one row of ``CASES``: its class (the kinds of failure of issue 18 plus our own), an
id, what runs (CLI arguments or a library call), the text the message must hold, and an optional
setup (files to damage, a plugin to install, a fault to inject, a lock held by another process).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

import objreg
from objreg.analysis.run.checksum import seal
from objreg.cli import make_cli

#: CPU seconds a refused case may take in this process (the wall clock is shared with the rest of
#: the machine; ``WALL_LIMIT`` only catches a case that blocks, e.g. on a lock, instead of refusing).
CPU_BUDGET = 1.0
#: For the few cases refused only once an input is loaded (a corpus whose content changed).
LOADING_BUDGET = 5.0
WALL_LIMIT = 1800.0

SMALL = dict(steps=4, batch_size=4, seq_len=48, eval_size=8, head_fit_size=16)
TEXT = "The committee met on Tuesday. It approved the budget for the new library. Members argued about the roof."


# -- the workspace ----------------------------------------------------------------------------------


class _Stop(Exception):
    pass


def _stop_after(k: int) -> Callable[[int, Any], None]:
    def on_step(step: int, record: Any) -> None:
        if step == k - 1:
            raise _Stop

    return on_step


def _corpus_text() -> str:
    topics = ["library", "river", "compiler", "orchestra", "garden", "mountain", "harbour", "engine"]
    blocks = []
    for i in range(160):
        t = topics[i % len(topics)]
        blocks.append(f"The {t} number {i} opened on a Monday. People visited the {t} often. "
                      f"Reports about the {t} were written every year. Nobody forgot the {t} {i}.")
    return "\n\n".join(blocks) + "\n"


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.fixture(scope="module")
def ws(tmp_path_factory) -> Path:
    """Files every case may point at, and one interrupted run (2 of 4 steps) on ``corpus.txt``."""
    root = tmp_path_factory.mktemp("ws")
    (root / "corpus.txt").write_text(_corpus_text(), encoding="utf-8")
    (root / "empty.txt").write_text("")
    (root / "binary.txt").write_bytes(b"Valid start.\n\xff\xfe broken bytes\n")
    (root / "nested.jsonl").write_text('{"text": ' + _nested(100_000) + "}\n")
    (root / "notext.jsonl").write_text('{"body": "A sentence here."}\n')
    (root / "bad.jsonl").write_text('{"text": "fine"}\n{"text": \n')
    (root / "heading_only.txt").write_text(" = Title = \n \n = = Section = = \n")
    (root / "nodocs").mkdir()
    (root / "nodocs" / "readme.md").write_text("not a corpus")
    os.mkfifo(root / "fifo")
    os.mkfifo(root / "fifo.txt")
    (root / "squad_nested.json").write_text('{"data": ' + _nested(100_000) + "}")
    (root / "squad_bad.json").write_text('{"data": [')
    (root / "squad_shape.json").write_text('{"data": [{"title": "x"}]}')
    (root / "squad_list.json").write_text("[1, 2, 3]")
    (root / "afile.txt").write_text("I am a file, not a directory.\n")
    (root / "model_empty").mkdir()
    (root / "model_badconfig").mkdir()
    (root / "model_badconfig" / "config.json").write_text("{not json")
    (root / "model_badtokenizer").mkdir()
    (root / "model_badtokenizer" / "config.json").write_text('{"model_type": "bert"}')
    (root / "model_badtokenizer" / "tokenizer.json").write_text("{}")
    foreign = root / "foreign"
    foreign.mkdir()
    (foreign / "config.json").write_text('{"my": "own settings, not objreg\'s"}\n')
    (foreign / "README").write_text("someone else's project\n")
    cache = root / "cache"
    cache.mkdir()
    objreg.default_tokenizer(cache=cache)  # the default corpus's cache: built once, not inside a timed case
    interrupted = root / "interrupted"
    with pytest.raises(_Stop):
        objreg.analyze("mlm,sop", "qa", **SMALL, corpus=str(root / "corpus.txt"), out_dir=interrupted,
                       on_step=_stop_after(2), cache=cache)
    finished = root / "finished"
    shutil.copytree(interrupted, finished)
    (finished / "checkpoint.pt").unlink()
    (finished / "report.json").write_text('{"summary": {}}')
    return root


@pytest.fixture(scope="module")
def model_pickled(ws) -> Path:
    """A transformers model directory whose pytorch_model.bin pickles a Python object."""
    transformers = pytest.importorskip("transformers")
    from objreg.toolkit.wordpiece import train_wordpiece

    path = ws / "model_pickled"
    tokenizer = train_wordpiece([TEXT] * 20, vocab_size=200, name="tiny")
    config = transformers.BertConfig(vocab_size=tokenizer.vocab.size, hidden_size=16, num_hidden_layers=1,
                                     num_attention_heads=2, intermediate_size=32, max_position_embeddings=128)
    model = transformers.BertModel(config)
    path.mkdir()
    config.save_pretrained(path)
    tokenizer.backend.save(str(path / "tokenizer.json"))
    state = dict(model.state_dict())
    state["extra"] = _Payload()
    torch.save(state, path / "pytorch_model.bin")
    return path


class _Payload:
    def __reduce__(self):
        return (print, ("unpickled",))


# -- plugins and faults -----------------------------------------------------------------------------


class RaisingObjective:
    """An installed objective whose hooks raise (valid for every version of the contract)."""

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


class RaisingProviders:
    """An installed plugin whose corpus, model and tokenizer providers raise."""

    @objreg.hookimpl
    def objreg_register_corpora(self, register):
        register(objreg.Provider("corpus", "brokencorpus", "raises", _raise("corpus loader exploded")))
        register(objreg.Provider("corpus", "ACCEPTS", "accepts raises", _raise("never"),
                                 accepts=lambda name: name.startswith("weird:") and 1 / 0))

    @objreg.hookimpl
    def objreg_register_models(self, register):
        register(objreg.Provider("model", "brokenmodel", "raises", _raise("model loader exploded")))

    @objreg.hookimpl
    def objreg_register_tokenizers(self, register):
        register(objreg.Provider("tokenizer", "brokenmodel", "raises", _raise("tokenizer loader exploded")))


def _raise(message: str) -> Callable[..., Any]:
    def load(*args: Any) -> Any:
        raise RuntimeError(message)

    return load


def _with_plugin(plugin: object, name: str, origin: str) -> Callable[[], Any]:
    def factory() -> Any:
        pm = objreg.get_plugin_manager(load_entrypoints=False)
        pm.register_plugin(plugin, name, origin)
        return pm

    return factory


def _builtins() -> Any:
    return objreg.get_plugin_manager(load_entrypoints=False)


def _no_space(monkeypatch) -> None:
    """Disk full: every fsync (each atomic write and each steps.jsonl line syncs) fails with ENOSPC."""

    def fsync(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", fsync)


def _write_denied(monkeypatch) -> None:
    real = os.replace

    def replace(src: Any, dst: Any) -> None:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(dst))

    monkeypatch.setattr(os, "replace", replace)
    assert real is not replace


def _out_of_memory(monkeypatch) -> None:
    """The allocator fails as torch's does when memory runs out, as the model is built."""
    from objreg.analysis.run import prepare

    def fail(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] . DefaultCPUAllocator: can't allocate memory: "
                           "you tried to allocate 68719476736 bytes. Error code 12 (Cannot allocate memory)")

    monkeypatch.setattr(prepare, "build_model", fail)


def _memory_error(monkeypatch) -> None:
    from objreg.analysis.run import prepare

    def fail(*args: Any, **kwargs: Any) -> Any:
        raise MemoryError()

    monkeypatch.setattr(prepare, "build_model", fail)


class LockHolder:
    """Another process holding a run directory's lock (as a running objreg would)."""

    def __init__(self, directory: Path):
        code = textwrap.dedent(f"""
            import fcntl, os, sys
            fd = os.open({str(directory / '.objreg.lock')!r}, os.O_RDWR | os.O_CREAT)
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.ftruncate(fd, 0)
            os.pwrite(fd, b"%d\\n" % os.getpid(), 0)
            print("locked", flush=True)
            sys.stdin.read()  # holds the lock until stop() kills it (or the tests end: end of input)
        """)
        self.process = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True)
        assert self.process.stdout.readline().strip() == "locked"

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


# -- the table --------------------------------------------------------------------------------------


@dataclass
class Case:
    cls: str
    id: str
    args: list[str] | None = None  # CLI arguments ("{ws}", "{run}" are filled in)
    call: Callable[..., Any] | None = None  # library: call(ws, run) must raise
    message: str | tuple[str, ...] = ""  # text(s) the one line must hold
    code: int = 1
    setup: Callable[..., Any] | None = None  # setup(ws, run, monkeypatch) before the snapshot
    run_from: str | None = None  # "interrupted" / "finished": {run} is a fresh copy of that run
    plugins: Callable[[], Any] | None = None
    budget: float = CPU_BUDGET
    error: type[BaseException] = objreg.ObjregError
    cwd: str | None = None  # a directory under ws to run in


CASES: list[Case] = []


def cli(cls: str, id: str, *args: str, message: str | tuple[str, ...], **kw: Any) -> None:
    CASES.append(Case(cls, id, list(args), message=message, **kw))


def lib(cls: str, id: str, call: Callable[..., Any], message: str | tuple[str, ...], **kw: Any) -> None:
    CASES.append(Case(cls, id, call=call, message=message, **kw))


A = ("analyze", "--pretrain", "mlm,sop")

# 1. Options out of range, sizes that cannot fit, hangs (a huge --steps) and "internal error"s.
for option, value, message in [
    ("--steps", "0", "steps must be a positive integer"),
    ("--steps", "-3", "steps must be a positive integer"),
    ("--steps", "1000000000000", "steps must be at most 1,000,000"),
    ("--steps", str(10**40), "steps must be at most"),
    ("--seed", "-1", "seed must be an integer ≥ 0"),
    ("--seed", str(2**32), "seed must be at most 4,294,967,295"),
    ("--seed", str(10**30), "seed must be at most"),
    ("--batch-size", "0", "batch_size must be a positive integer"),
    ("--batch-size", "1000000000", "batch_size must be at most"),
    ("--seq-len", "4", "seq_len must be at least 8"),
    ("--seq-len", "10000000", "seq_len must be at most"),
    ("--eval-size", "0", "eval_size must be a positive integer"),
    ("--eval-size", "100000000", "eval_size must be at most"),
    ("--head-fit-size", "-5", "head_fit_size must be a positive integer"),
    ("--head-warmup-steps", "-1", "head_warmup_steps must be an integer ≥ 0"),
    ("--head-warmup-steps", "10000000000", "head_warmup_steps must be at most"),
    ("--probe-every", "0", "probe_every must be a positive integer"),
    ("--spectrum", "-1", "spectrum must be an integer ≥ 0"),
    ("--spectrum", "100000", "spectrum must be at most 64"),
    ("--attribution-top", "-2", "attribution_top must be an integer ≥ 0"),
    ("--attribution-top", "1000000000", "attribution_top must be at most"),
    ("--lr", "0", "lr must be a positive finite number"),
    ("--lr", "-1e-3", "lr must be a positive finite number"),
    ("--lr", "nan", "lr must be a positive finite number"),
    ("--lr", "inf", "lr must be a positive finite number"),
    ("--char-noise", "2", "char_noise must be a rate in [0, 1]"),
    ("--char-noise", "-0.5", "char_noise must be a rate in [0, 1]"),
    ("--char-noise", "nan", "char_noise must be a rate in [0, 1]"),
    ("--optimizer", "lamb", "optimizer must be one of"),
    ("--dtype", "float16", "dtype must be one of"),
    ("--per-sample-method", "magic", "per_sample_method must be one of"),
    ("--hvp-method", "fd", "hvp_method must be one of"),
    ("--device", "tpu", "device"),
    ("--weights", "mlm=abc", "weight for 'mlm' must be a number"),
    ("--weights", "clm=1", "'clm', which is not a selected objective"),
    ("--weights", "mlm=-1", "weight for 'mlm' must be finite and ≥ 0"),
    ("--weights", "mlm=0,sop=0", "all objective weights are zero"),
    ("--weights", "mlm", "malformed weight 'mlm'"),
    ("--schedule", "mlm=warmup:3", "unknown schedule shape 'warmup'"),
    ("--schedule", "clm=cosine", "schedule given for 'clm'"),
    ("--schedule", "step:x", "AT must be a step number"),
    ("--schedule", "linear:1", "wrong number of arguments"),
    ("--schedule", "cosine:nan:1", "START must be finite"),
    ("--schedule", "mlm=cosine,mlm=linear", "schedule given twice"),
]:
    cli("options", f"{option}={value}", *A, option, value, message=message)
cli("options", "steps and batch that cannot fit", *A, "--batch-size", "4096", "--seq-len", "4096",
    message=("--batch-size 4096 × --seq-len 4096", "cannot fit in memory"))
cli("options", "downstream sets that cannot fit", *A, "--eval-size", "600000", "--head-fit-size", "600000",
    "--seq-len", "512", message=("downstream tokens cannot fit",))
cli("options", "--param malformed", *A, "--param", "mask_prob=1", message="malformed --param")
cli("options", "--param unknown", *A, "--param", "mlm.nosuch=1", message="'nosuch'")
cli("options", "--param out of range", *A, "--param", "mlm.mask_prob=2", message="must lie in")
cli("options", "--param unselected", *A, "--param", "clm.foo=1", message="parameters given for objectives not selected")
cli("options", "--pretrain unknown", "analyze", "--pretrain", "mlm,nosuch", message="unknown objective 'nosuch'")
cli("options", "--pretrain empty list", "analyze", "--pretrain", ",", message="no pre-training objective")
cli("options", "--pretrain repeated", "analyze", "--pretrain", "mlm,mlm", message="pre-training objectives repeat")
cli("options", "--pretrain a task", "analyze", "--pretrain", "qa", message="'qa' is a downstream task")
cli("options", "--downstream unknown", *A, "--downstream", "qaa", message="unknown downstream task 'qaa'")
cli("options", "--downstream an objective", *A, "--downstream", "mlm", message="'mlm' is a pre-training objective")
cli("options", "--model unknown", *A, "--model", "nosuch", message="unknown model 'nosuch'")
cli("options", "--steps not a number", *A, "--steps", "many", message="'--steps'", code=2)
cli("options", "--seed not a number", *A, "--seed", "1.5", message="'--seed'", code=2)
cli("options", "unknown option", *A, "--stpes", "3", message="--stpes", code=2)
cli("options", "corrupt --seq-len 1", "corrupt", "mlm", "--text", TEXT, "--seq-len", "1", message="'--seq-len'", code=2)
cli("options", "corrupt unknown objective", "corrupt", "mlmm", "--text", TEXT, message="Did you mean 'mlm'")
cli("options", "corrupt a task", "corrupt", "qa", "--text", TEXT, message="'qa' is a downstream task")
cli("options", "corrupt bad param", "corrupt", "mlm", "--text", TEXT, "--param", "mask_prob", message="not key=value")
cli("options", "show unknown", "show", "nosuch", message="unknown objective or task 'nosuch'")
cli("options", "experiment unknown", "experiment", "run", "nosuch", message="unknown experiment 'nosuch'")
cli("options", "experiment --seeds 0", "experiment", "run", "nsp-vs-sop", "--seeds", "0",
    message="seeds must be a positive integer, got 0")
cli("options", "experiment --seeds huge", "experiment", "run", "nsp-vs-sop", "--seeds", "1000000",
    message="seeds must be at most 64, got 1,000,000")
cli("options", "experiment --seeds not a number", "experiment", "run", "nsp-vs-sop", "--seeds", "2.5",
    message="'--seeds'", code=2)
cli("options", "experiment --all without --out", "experiment", "run", "--all", message="--all needs --out", code=2)

# 2. Paths: empty, not a regular file (FIFO, pipe, device), unreadable or malformed content.
cli("paths", "--out ''", *A, "--out", "", message="--out is empty")
cli("paths", "--out is a file", *A, "--out", "{ws}/afile.txt", message=("--out", "afile.txt"), code=2)
cli("paths", "--out under a file", *A, "--out", "{ws}/afile.txt/run", message="afile.txt/run")
cli("paths", "--out under /dev/null", *A, "--out", "/dev/null/run", message="/dev/null/run")
cli("paths", "--resume ''", "analyze", "--resume", "", message="--resume is empty")
cli("paths", "--resume missing", "analyze", "--resume", "{ws}/nosuch", message="no config.json")
cli("paths", "--resume a file", "analyze", "--resume", "{ws}/afile.txt", message="afile.txt", code=(1, 2))
cli("paths", "--resume not a run", "analyze", "--resume", "{ws}/foreign", message="not an objreg run config")
cli("paths", "--corpus ''", *A, "--corpus", "", message="--corpus is empty")
cli("paths", "--corpus missing", *A, "--corpus", "{ws}/missing/corpus.txt", message="does not exist")
cli("paths", "--corpus FIFO", *A, "--corpus", "{ws}/fifo.txt", message=("fifo.txt", "is a pipe or FIFO"))
cli("paths", "--corpus FIFO (no suffix)", *A, "--corpus", "{ws}/fifo", message=("fifo", "is a pipe or FIFO"))
cli("paths", "--corpus pipe <(cat file)", *A, "--corpus", "{pipe}", message="is a pipe or FIFO")
cli("paths", "--corpus /dev/zero", *A, "--corpus", "/dev/zero", message=("/dev/zero", "is a device"))
cli("paths", "--corpus NUL in name", *A, "--corpus", "a\0b.txt", message="NUL character")
cli("paths", "--corpus empty", *A, "--corpus", "{ws}/empty.txt", message="is empty")
cli("paths", "--corpus headings only", *A, "--corpus", "{ws}/heading_only.txt", message="is empty")
cli("paths", "--corpus not UTF-8", *A, "--corpus", "{ws}/binary.txt", message=("binary.txt", "not UTF-8"))
cli("paths", "--corpus JSONL nested", *A, "--corpus", "{ws}/nested.jsonl", message=("nested.jsonl", "nested too deeply"))
cli("paths", "--corpus JSONL no text", *A, "--corpus", "{ws}/notext.jsonl", message=("notext.jsonl", '"text"'))
cli("paths", "--corpus JSONL bad line", *A, "--corpus", "{ws}/bad.jsonl", message=("bad.jsonl' line 2", "not valid JSON"))
cli("paths", "--corpus dir without text", *A, "--corpus", "{ws}/nodocs", message=("nodocs", "no .txt or .jsonl"))
cli("paths", "--downstream-data ''", *A, "--downstream-data", "", message="--downstream-data is empty")
cli("paths", "--downstream-data missing", *A, "--downstream-data", "{ws}/nosuch.json", message="does not exist")
cli("paths", "--downstream-data FIFO", *A, "--downstream-data", "{ws}/fifo", message="is a pipe or FIFO")
cli("paths", "--downstream-data nested", *A, "--downstream-data", "{ws}/squad_nested.json",
    message=("squad_nested.json", "nested too deeply"), budget=LOADING_BUDGET)
cli("paths", "--downstream-data bad JSON", *A, "--downstream-data", "{ws}/squad_bad.json", message="not valid JSON", budget=LOADING_BUDGET)
cli("paths", "--downstream-data shape", *A, "--downstream-data", "{ws}/squad_shape.json", message="'paragraphs'", budget=LOADING_BUDGET)
cli("paths", "--downstream-data a list", *A, "--downstream-data", "{ws}/squad_list.json", message="squad_list.json", budget=LOADING_BUDGET)
# A directory is the task's to refuse (a task may read one), when it loads its data: after the tokenizer.
cli("paths", "--downstream-data a directory", *A, "--downstream-data", "{ws}/nodocs", message="is a directory",
    budget=LOADING_BUDGET)
cli("paths", "--model ''", *A, "--model", "", message="--model is empty")
cli("paths", "--model missing dir", *A, "--model", "{ws}/no/model/", message="does not exist")
cli("paths", "--model dir without config", *A, "--model", "{ws}/model_empty", message="has no config.json")
cli("paths", "--model /dev/zero", *A, "--model", "/dev/zero", message="is a device")
cli("paths", "experiment --out ''", "experiment", "run", "nsp-vs-sop", "--quick", "--out", "", message="--out is empty")
cli("paths", "experiment --out under /dev/null", "experiment", "run", "nsp-vs-sop", "--quick", "--out",
    "/dev/null/x", message=("/dev/null/x", "cannot be written"))
cli("paths", "experiment --out a file", "experiment", "run", "nsp-vs-sop", "--quick", "--out", "{ws}/afile.txt",
    message="exists and is not a directory")

# 3. One owner per run directory.
cli("ownership", "fresh run on an interrupted run", *A, "--out", "{run}", run_from="interrupted",
    message=("holds an interrupted run", "--resume"))
cli("ownership", "fresh run on a finished run", *A, "--out", "{run}", run_from="finished",
    message="already holds a finished run")
cli("ownership", "fresh run on someone else's files", *A, "--out", "{ws}/foreign",
    message=("holds files objreg did not write", "config.json"))
cli("ownership", "--out . among someone else's files", *A, "--out", ".", cwd="foreign",
    message=("holds files objreg did not write", "config.json"))
cli("ownership", "fresh run on a locked directory", *A, "--out", "{run}", run_from="interrupted",
    setup=lambda ws, run, mp, req: req.addfinalizer(LockHolder(run).stop), message="is in use by another objreg run")
cli("ownership", "resume of a locked run", "analyze", "--resume", "{run}", run_from="interrupted",
    setup=lambda ws, run, mp, req: req.addfinalizer(LockHolder(run).stop), message="is in use by another objreg run")
cli("ownership", "resume of a finished run", "analyze", "--resume", "{run}", run_from="finished",
    message="already finished")
cli("ownership", "resume with --steps", "analyze", "--resume", "{run}", "--steps", "3", run_from="interrupted",
    message="drop --steps")
cli("ownership", "resume with --pretrain", "analyze", "--resume", "{run}", "--pretrain", "mlm",
    run_from="interrupted", message="drop --pretrain")
cli("ownership", "resume with --out", "analyze", "--resume", "{run}", "--out", "{ws}/elsewhere",
    run_from="interrupted", message="drop --out")


# 4. Resume only on the same inputs; damaged files refused.
def _edit_json(name: str, change: Callable[[dict], None]) -> Callable[..., None]:
    def setup(ws: Path, run: Path, mp: Any, req: Any) -> None:
        data = json.loads((run / name).read_text())
        change(data)
        (run / name).write_text(json.dumps(data, indent=2))

    return setup


def _write(name: str, content: bytes | str) -> Callable[..., None]:
    def setup(ws: Path, run: Path, mp: Any, req: Any) -> None:
        (run / name).write_bytes(content.encode() if isinstance(content, str) else content)

    return setup


def _flip(offset: float | int) -> Callable[..., None]:
    def setup(ws: Path, run: Path, mp: Any, req: Any) -> None:
        data = bytearray((run / "checkpoint.pt").read_bytes())
        at = offset if isinstance(offset, int) else int(len(data) * offset)
        data[at] ^= 0x01
        (run / "checkpoint.pt").write_bytes(bytes(data))

    return setup


def _set(key: str, value: Any) -> Callable[[dict], None]:
    def change(data: dict) -> None:
        data[key] = value

    return change


def _resume_case(id: str, message: str | tuple[str, ...], setup: Callable[..., Any], **kw: Any) -> None:
    cli("resume", id, "analyze", "--resume", "{run}", run_from="interrupted", setup=setup, message=message, **kw)


_resume_case("config.json: steps edited", ("config.json was edited", "steps: 4 → 3"), _edit_json("config.json", _set("steps", 3)))
_resume_case("config.json: lr edited", ("config.json was edited", "lr: 0.005 → 0.1"), _edit_json("config.json", _set("lr", 0.1)))
_resume_case("config.json: pretrain edited", ("config.json was edited", "pretrain"),
             _edit_json("config.json", _set("pretrain", ["mlm"])))
_resume_case("config.json: corpus edited", ("config.json was edited", "corpus"),
             _edit_json("config.json", _set("corpus", "default")))
_resume_case("config.json: a parameter edited", ("config.json was edited", "objective_params.mlm.mask_prob"),
             _edit_json("config.json", lambda d: d["objective_params"]["mlm"].update(mask_prob=0.3)))
_resume_case("config.json: a field added", ("config.json was edited", "note added"),
             _edit_json("config.json", _set("note", "mine")))
_resume_case("config.json: not JSON", ("config.json is unreadable",), _write("config.json", "{oops"))
_resume_case("config.json: nested too deeply", ("config.json is unreadable", "nested too deeply"),
             _write("config.json", _nested(100_000)))
_resume_case("config.json: a list", "not an objreg run config", _write("config.json", "[1, 2]"))
_resume_case("config.json: removed", "no config.json", lambda ws, run, mp, req: (run / "config.json").unlink())
_resume_case("run.json: removed", "no run.json", lambda ws, run, mp, req: (run / "run.json").unlink())
_resume_case("run.json: garbled", "run.json is unreadable", _write("run.json", "{"))
_resume_case("run.json: other format", "not an objreg run fingerprint", _edit_json("run.json", _set("format", 99)))
_resume_case("run.json: started with another torch", ("torch 1.0.0", "the numbers would differ"),
             _edit_json("run.json", _set("torch", "1.0.0")))
_resume_case("run.json: started with another objreg", ("objreg 0.0.1",), _edit_json("run.json", _set("objreg", "0.0.1")))
_resume_case("run.json: a plugin of another version", ("plugin 'mlm' was objreg 0.9 (built-in)",),
             _edit_json("run.json", lambda d: d["plugins"].update(mlm="objreg 0.9 (built-in)")))
_resume_case("run.json: a plugin since removed", ("plugin 'extra' (extra-dist 1.0) is no longer installed",),
             _edit_json("run.json", lambda d: d["plugins"].update(extra="extra-dist 1.0")))
cli("resume", "a plugin installed since", "analyze", "--resume", "{run}", run_from="interrupted",
    plugins=_with_plugin(RaisingObjective(), "boom", "boom-objectives 1.2.0"),
    message=("plugin 'boom' (boom-objectives 1.2.0) was not installed when the run started", "OBJREG_LOAD_PLUGINS"))
_resume_case("tokenizer.json: edited", "tokenizer.json was changed", _write("tokenizer.json", '{"version": "1.0"}'))
_resume_case("tokenizer.json: removed", "tokenizer.json cannot be read",
             lambda ws, run, mp, req: (run / "tokenizer.json").unlink())
_resume_case("checkpoint: a flipped byte in its header", "checkpoint.pt is damaged", _flip(20))
_resume_case("checkpoint: a flipped byte early", ("checkpoint.pt is damaged", "checksum"), _flip(200))
_resume_case("checkpoint: a flipped byte in the middle", ("checkpoint.pt is damaged", "checksum"), _flip(0.5))
_resume_case("checkpoint: its last byte flipped", ("checkpoint.pt is damaged", "checksum"), _flip(-1))
_resume_case("checkpoint: truncated", ("checkpoint.pt is damaged", "truncated"),
             lambda ws, run, mp, req: os.truncate(run / "checkpoint.pt", 4096))
_resume_case("checkpoint: appended to", ("checkpoint.pt is damaged", "appended"),
             lambda ws, run, mp, req: (run / "checkpoint.pt").open("ab").write(b"extra"))
_resume_case("checkpoint: empty", "checkpoint.pt is not a checksummed objreg file", _write("checkpoint.pt", b""))
_resume_case("checkpoint: of the format before checksums", "not a checksummed objreg file",
             lambda ws, run, mp, req: torch.save({"format": 1, "trainer": {}, "records": []}, run / "checkpoint.pt"))
_resume_case("checkpoint: sealed but not a checkpoint", "is not an objreg checkpoint",
             lambda ws, run, mp, req: _sealed_torch(run, {"something": "else"}))
_resume_case("checkpoint: removed", "no checkpoint.pt", lambda ws, run, mp, req: (run / "checkpoint.pt").unlink())
_resume_case("corpus: content changed", ("the corpus", "corpus.txt", "changed since the run started"),
             lambda ws, run, mp, req: _edit_corpus(ws, req), budget=LOADING_BUDGET)
_resume_case("corpus: removed", ("corpus.txt", "does not exist"), lambda ws, run, mp, req: _move_corpus(ws, req))


def _sealed_torch(run: Path, data: Any) -> None:
    import io

    buffer = io.BytesIO()
    torch.save(data, buffer)
    (run / "checkpoint.pt").write_bytes(seal(buffer.getvalue()))


def _edit_corpus(ws: Path, req: Any) -> None:
    original = (ws / "corpus.txt").read_text()
    (ws / "corpus.txt").write_text(original + "\nA sentence was added later. It changes the corpus.\n")
    req.addfinalizer(lambda: (ws / "corpus.txt").write_text(original))


def _move_corpus(ws: Path, req: Any) -> None:
    (ws / "corpus.txt").rename(ws / "corpus.moved")
    req.addfinalizer(lambda: (ws / "corpus.moved").rename(ws / "corpus.txt"))


# 5. Resources: a full disk, a forbidden write, no memory (faults injected).
cli("resources", "disk full on a fresh run", *A, "--corpus", "{ws}/corpus.txt", "--out", "{ws}/full_run",
    setup=lambda ws, run, mp, req: _no_space(mp), message=("no space left on the device", "full_run"),
    budget=LOADING_BUDGET)
cli("resources", "disk full on resume", "analyze", "--resume", "{run}", run_from="interrupted",
    setup=lambda ws, run, mp, req: _no_space(mp), message=("no space left on the device", "--resume"),
    budget=LOADING_BUDGET)
cli("resources", "write denied on a fresh run", *A, "--corpus", "{ws}/corpus.txt", "--out", "{ws}/denied_run",
    setup=lambda ws, run, mp, req: _write_denied(mp), message=("cannot write", "permission denied"),
    budget=LOADING_BUDGET)
cli("resources", "out of memory (allocator)", *A, "--corpus", "{ws}/corpus.txt", "--eval-size", "4",
    "--head-fit-size", "8", setup=lambda ws, run, mp, req: _out_of_memory(mp),
    message=("out of memory", "--batch-size"), budget=LOADING_BUDGET)
cli("resources", "out of memory (MemoryError)", *A, "--corpus", "{ws}/corpus.txt", "--eval-size", "4",
    "--head-fit-size", "8", setup=lambda ws, run, mp, req: _memory_error(mp),
    message=("out of memory", "--seq-len"), budget=LOADING_BUDGET)

# 6. Installed plugins that raise: named with their hook and distribution, and the escape hatch.
_BOOM = _with_plugin(RaisingObjective(), "boom", "boom-objectives 1.2.0")
_PROVIDERS = _with_plugin(RaisingProviders(), "brokenprov", "broken-providers 0.3")
cli("plugins", "a hook raises (corrupt)", "corrupt", "boom", "--text", TEXT, plugins=_BOOM,
    message=("plugin 'boom'", "boom-objectives 1.2.0", "objreg_corrupt", "ValueError: boom in corrupt",
             "OBJREG_LOAD_PLUGINS"))
cli("plugins", "a hook raises (analyze)", "analyze", "--pretrain", "boom", "--corpus", "{ws}/corpus.txt",
    "--eval-size", "4", "--head-fit-size", "8", "--steps", "1", plugins=_BOOM,
    message=("plugin 'boom'", "boom-objectives 1.2.0", "objreg_corrupt", "OBJREG_LOAD_PLUGINS"), budget=LOADING_BUDGET)
cli("plugins", "a corpus provider raises", *A, "--corpus", "brokencorpus", plugins=_PROVIDERS,
    message=("plugin 'brokenprov'", "broken-providers 0.3", "corpus provider 'brokencorpus'", "exploded",
             "OBJREG_LOAD_PLUGINS"))
cli("plugins", "a provider's accepts raises", *A, "--corpus", "weird:thing", plugins=_PROVIDERS,
    message=("plugin 'brokenprov'", "accepts", "ZeroDivisionError"))
cli("plugins", "a tokenizer provider raises", *A, "--model", "brokenmodel", "--corpus", "{ws}/corpus.txt",
    plugins=_PROVIDERS, message=("plugin 'brokenprov'", "tokenizer provider 'brokenmodel'", "exploded"))
cli("plugins", "a pickled pytorch_model.bin", *A, "--model", "{model_pickled}", "--corpus", "{ws}/corpus.txt",
    message=("model_pickled", "pickled Python objects", "safetensors"), budget=LOADING_BUDGET)
cli("plugins", "a model tokenizer.json that is not a tokenizer", *A, "--model", "{ws}/model_badtokenizer",
    message=("model_badtokenizer/tokenizer.json", "cannot be read as a tokenizer"))
cli("plugins", "a model config.json that is not JSON", *A, "--model", "{model_badconfig}",
    message=("model_badconfig", "cannot read config.json"), budget=LOADING_BUDGET)


# 7. The library API: wrong types fail at the door, and corrupt checks its batch.
def _analyze(**kwargs: Any) -> Callable[..., Any]:
    def call(ws: Path, run: Path) -> Any:
        return objreg.analyze(**{"pretrain": "mlm", **kwargs})

    return call


for id, kwargs, message in [
    ("pretrain an int", dict(pretrain=123), "pretrain must be objective names"),
    ("pretrain of ints", dict(pretrain=[1, 2]), "pretrain must be objective names"),
    ("pretrain empty", dict(pretrain=[]), "no pre-training objective"),
    ("downstream an int", dict(downstream=5), "downstream must be a task name"),
    ("registry a string", dict(registry="builtins"), "registry must be an objreg.Registry"),
    ("out_dir an int", dict(out_dir=5), "out_dir must be a directory path"),
    ("out_dir empty", dict(out_dir=""), "out_dir= is empty"),  # the keyword argument, not the flag
    ("resume empty", dict(pretrain=None, resume=""), "resume= is empty"),
    ("on_step not callable", dict(on_step=3), "on_step must be callable"),
    ("on_status not callable", dict(on_status="print"), "on_status must be callable"),
    ("cache an int", dict(cache=7), "cache must be a directory path"),
    ("writer not callable", dict(writer=None), "writer must be callable"),
    ("a misspelt setting", dict(stpes=3), "unknown setting 'stpes'; did you mean 'steps'"),
    ("steps a string", dict(steps="3"), "steps must be a positive integer, got str '3'"),
    ("steps a bool", dict(steps=True), "steps must be a positive integer, got bool"),
    ("steps a float", dict(steps=2.0), "steps must be a positive integer, got float"),
    ("lr a string", dict(lr="0.1"), "lr must be a positive finite number"),
    ("lr a bool", dict(lr=True), "lr must be a positive finite number"),
    ("seed a float", dict(seed=1.5), "seed must be an integer ≥ 0"),
    ("corpus None", dict(corpus=None), "corpus must be a name or a path"),
    ("corpus an int", dict(corpus=3), "corpus must be a name or a path"),
    ("model empty", dict(model=""), "model= is empty"),
    ("device an int", dict(device=0), "device must be a non-empty string"),
    ("objective_params a list", dict(objective_params=[1]), "objective_params must be a mapping"),
    ("objective_params of ints", dict(objective_params={"mlm": 3}), "objective_params must map names"),
    ("weights a list", dict(weights=[1, 2]), "weights must be a mapping"),
    ("schedule a list", dict(schedule=[1]), "must be a shape string or a callable"),
    ("schedule negative", dict(schedule=lambda t, T: -1.0, steps=3), "gave -1.0 at step 0"),
    ("huge steps with a callable schedule", dict(steps=10**9, schedule=lambda t, T: 1.0), "steps must be at most"),
]:
    lib("library", f"analyze: {id}", _analyze(**kwargs), message)


def _objective_and_batch(name: str = "mlm") -> tuple[Any, Any, Any]:
    from objreg.toolkit.wordpiece import train_wordpiece

    small = train_wordpiece([TEXT] * 20, vocab_size=120, name="small")
    large = train_wordpiece([TEXT, *_corpus_text().split("\n\n")[:40]] * 5, vocab_size=600, name="large")
    batch = large.batch_from_texts([f"{TEXT} Zebras quietly wander near the harbour number 97."], 48)
    return objreg.get_objective(name, vocab=small.vocab), batch, small


def _corrupt_foreign(ws: Path, run: Path) -> Any:
    objective, batch, _ = _objective_and_batch()
    return objective.corrupt(batch, torch.Generator().manual_seed(0))


def _corrupt_negative(ws: Path, run: Path) -> Any:
    objective, _, small = _objective_and_batch()
    batch = small.batch_from_texts([TEXT], 48)
    return objective.corrupt(batch._replace(input_ids=batch.input_ids - 5), torch.Generator())


def _corrupt_text(ws: Path, run: Path) -> Any:
    objective, _, _ = _objective_and_batch()
    return objective.corrupt(TEXT, torch.Generator())


def _corrupt_seed(ws: Path, run: Path) -> Any:
    objective, _, small = _objective_and_batch()
    return objective.corrupt(small.batch_from_texts([TEXT], 48), 0)


def _corrupt_float_ids(ws: Path, run: Path) -> Any:
    objective, _, small = _objective_and_batch()
    batch = small.batch_from_texts([TEXT], 48)
    return objective.corrupt(batch._replace(input_ids=batch.input_ids.float()), torch.Generator())


def _prepare_foreign(ws: Path, run: Path) -> Any:
    objective, batch, _ = _objective_and_batch("rtd")
    return objective.prepare(batch, None)


lib("library", "corrupt: a batch of another tokenizer", _corrupt_foreign, ("'mlm'", "outside its vocabulary"))
lib("library", "corrupt: negative ids", _corrupt_negative, ("'mlm'", "token id -", "outside its vocabulary"))
lib("library", "corrupt: a string", _corrupt_text, ("'mlm'", "takes a TokenBatch", "got str"))
lib("library", "corrupt: an int for the generator", _corrupt_seed, ("'mlm'", "torch.Generator", "got int"))
lib("library", "corrupt: float ids", _corrupt_float_ids, ("'mlm'", "2-D integer tensor"))
lib("library", "prepare: a batch of another tokenizer", _prepare_foreign, ("'rtd'", "outside its vocabulary"))
lib("library", "get_objective: a list", lambda ws, run: objreg.get_objective(["mlm"]), "objective name must be a str")
lib("library", "get_objective: vocab a string", lambda ws, run: objreg.get_objective("mlm", vocab="v"),
    "vocab must be an objreg.Vocabulary")
lib("library", "get_task: an int", lambda ws, run: objreg.get_task(3), "task name must be a str")
lib("library", "Registry.info: None", lambda ws, run: objreg.Registry.load(load_entrypoints=False).info(None),
    "objective or task name must be a str")
lib("library", "AnalysisConfig: pretrain a string", lambda ws, run: objreg.AnalysisConfig(pretrain="mlm"),
    "pretrain must be a list of objective names")
lib("library", "AnalysisConfig: batch that cannot fit",
    lambda ws, run: objreg.AnalysisConfig(pretrain=("mlm",), batch_size=65536, seq_len=65536), "cannot fit in memory")
lib("library", "AnalysisConfig: corpus a FIFO",
    lambda ws, run: objreg.AnalysisConfig(pretrain=("mlm",), corpus=str(ws / "fifo")), "is a pipe or FIFO")
lib("library", "train_wordpiece: one string", lambda ws, run: _train("one text"), "not a single string")
lib("library", "train_wordpiece: vocab too small", lambda ws, run: _train([TEXT], vocab_size=10),
    "vocab_size must be an integer ≥ 77")
lib("library", "train_wordpiece: texts of ints", lambda ws, run: _train([1, 2]), "texts (str), got a int")


def _train(texts: Any, vocab_size: int = 200) -> Any:
    from objreg.toolkit.wordpiece import train_wordpiece

    return train_wordpiece(texts, vocab_size=vocab_size)


# -- running a case ---------------------------------------------------------------------------------


def _snapshot(root: Path) -> dict[str, str]:
    """sha256 of every regular file below ``root`` (the lock files aside: a run writes its pid there)."""
    found = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink() and path.name != ".objreg.lock" and "cache" not in path.parts:
            found[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def _fill(value: str, ws: Path, run: Path, extra: dict[str, str]) -> str:
    return value.format(ws=ws, run=run, **extra) if "{" in value else value


def _line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


@pytest.mark.parametrize("case", [c for c in CASES if c is not None], ids=lambda c: f"{c.cls}: {c.id}")
def test_bad_input(case: Case, ws: Path, tmp_path: Path, monkeypatch, request) -> None:
    monkeypatch.delenv("OBJREG_RAISE_ERRORS", raising=False)
    monkeypatch.setenv("OBJREG_CACHE_DIR", str(ws / "cache"))
    run = tmp_path / "run"
    if case.run_from:
        shutil.copytree(ws / case.run_from, run)
    extra: dict[str, str] = {}
    args = case.args or []
    if any("{pipe}" in a for a in args):
        read, write = os.pipe()
        os.write(write, TEXT.encode())
        os.close(write)
        request.addfinalizer(lambda: os.close(read))
        extra["pipe"] = f"/dev/fd/{read}"
    if any("{model_pickled}" in a for a in args):
        extra["model_pickled"] = str(request.getfixturevalue("model_pickled"))
    if any("{model_badconfig}" in a for a in args):
        path = request.getfixturevalue("model_pickled").parent / "model_badconfig"
        if not (path / "tokenizer.json").exists():  # a valid tokenizer, so that the config is what fails
            shutil.copy(request.getfixturevalue("model_pickled") / "tokenizer.json", path / "tokenizer.json")
        extra["model_badconfig"] = str(path)
    if case.cwd:
        monkeypatch.chdir(ws / case.cwd)
    if case.setup is not None:
        case.setup(ws, run, monkeypatch, request)
    before = {**_snapshot(ws), **{f"run/{k}": v for k, v in _snapshot(run).items()}} if run.exists() else _snapshot(ws)
    messages = (case.message,) if isinstance(case.message, str) else case.message
    factory = case.plugins or _builtins

    wall, cpu = time.perf_counter(), time.process_time()
    if case.call is not None:
        with pytest.raises(case.error) as caught:
            case.call(ws, run)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        text = str(caught.value)
        assert "\n" not in text, text
        line = text
    else:
        result = CliRunner().invoke(make_cli(factory), [_fill(a, ws, run, extra) for a in args])
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        codes = case.code if isinstance(case.code, tuple) else (case.code,)
        assert result.exit_code in codes, (result.exit_code, result.output, result.exception)
        assert "Traceback" not in result.output and "internal error" not in result.output, result.output
        assert result.stdout == "", result.stdout
        errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
        assert len(errors) == 1, result.stderr
        if result.exit_code == 1:  # objreg's own errors are the one line; click adds usage lines to its own
            # Before it, at most the plain progress lines of the stages that ran (stderr is no terminal).
            *progress, last = result.stderr.strip().splitlines()
            assert last == errors[0] and all(re.match(r"\[\d+:\d\d:\d\d\] |Warning: ", p) for p in progress), result.stderr
        line = errors[0]
    if os.environ.get("OBJREG_SUITE_LOG"):  # the observed outcomes, for the record
        with open(os.environ["OBJREG_SUITE_LOG"], "a", encoding="utf-8") as log:
            code = "raised" if case.call is not None else result.exit_code
            log.write(json.dumps({"class": case.cls, "case": case.id, "exit": code, "cpu_s": round(cpu, 3),
                                  "line": line}, ensure_ascii=False) + "\n")
    for message in messages:
        assert message in line, line
    assert cpu < case.budget, f"{cpu:.2f} s of CPU to refuse ({line})"
    assert wall < WALL_LIMIT
    after = {**_snapshot(ws), **{f"run/{k}": v for k, v in _snapshot(run).items()}} if run.exists() else _snapshot(ws)
    changed = sorted(k for k in before if after.get(k) != before[k])
    assert not changed, f"earlier files changed or removed: {changed}"
    created = sorted(set(after) - set(before))
    assert not created, f"files created by a refused run: {created}"


def test_the_suite_is_large_enough() -> None:
    cases = [c for c in CASES if c is not None]
    assert len(cases) >= 120, len(cases)
    assert len({(c.cls, c.id) for c in cases}) == len(cases), "case ids repeat"
