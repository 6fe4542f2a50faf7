"""Ctrl-C and SIGTERM during ``objreg analyze``: the run stops cleanly, prints the exact resume
command (or says there is nothing to resume), and the resumed run ends identical to an
uninterrupted one."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys

import pytest
from click.testing import CliRunner

import objreg
from objreg.analysis.run.loop import Trainer
from objreg.cli import make_cli

SMALL = ["--pretrain", "mlm,sop", "--steps", "4", "--batch-size", "4", "--seq-len", "48", "--eval-size", "8",
         "--head-fit-size", "16", "--optimizer", "adam", "--lr", "1e-3"]


def cli():
    return make_cli(lambda: objreg.get_plugin_manager(load_entrypoints=False))


def invoke(*args: str):
    return CliRunner().invoke(cli(), ["analyze", *args], catch_exceptions=False)


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    """The uninterrupted run."""
    out = tmp_path_factory.mktemp("whole") / "run"
    result = invoke(*SMALL, "--out", str(out))
    assert result.exit_code == 0, result.output
    return out


def signals_during_step(monkeypatch, step: int, *signums: int) -> None:
    """Deliver ``signums`` to this process while training step ``step`` is in flight."""
    original = Trainer.step

    def step_with_signals(self, index, probe):
        if index == step:
            for signum in signums:
                os.kill(os.getpid(), signum)
        return original(self, index, probe)

    monkeypatch.setattr(Trainer, "step", step_with_signals)


def resume_command(stderr: str) -> list[str]:
    match = re.search(r"Continue the run with:\n  (objreg analyze --resume .+)\n", stderr)
    assert match, stderr
    return shlex.split(match.group(1))


def assert_same_run(out, whole) -> None:
    for name in ("report.json", "steps.jsonl", "report.csv"):
        assert (out / name).read_text() == (whole / name).read_text(), name
    assert not (out / "checkpoint.pt").exists()


def test_ctrl_c_finishes_the_step_prints_the_resume_command_and_the_resumed_run_is_identical(
    whole, tmp_path, monkeypatch
):
    out = tmp_path / "run"
    signals_during_step(monkeypatch, 1, signal.SIGINT)
    stopped = invoke(*SMALL, "--out", str(out))
    assert stopped.exit_code == 130, stopped.output
    assert "Stopped with 2 of 4 steps done." in stopped.stderr
    assert "Aborted!" not in stopped.output and "Traceback" not in stopped.output
    assert stopped.stdout == ""  # no half report
    command = resume_command(stopped.stderr)
    assert command == ["objreg", "analyze", "--resume", str(out)]
    monkeypatch.undo()
    resumed = CliRunner().invoke(cli(), command[1:], catch_exceptions=False)
    assert resumed.exit_code == 0, resumed.output
    assert_same_run(out, whole)


def test_a_second_ctrl_c_abandons_the_step_and_the_resume_still_ends_identical(whole, tmp_path, monkeypatch):
    out = tmp_path / "run"
    signals_during_step(monkeypatch, 2, signal.SIGINT, signal.SIGINT)
    stopped = invoke(*SMALL, "--out", str(out))
    assert stopped.exit_code == 130, stopped.output
    assert "Stopped with 2 of 4 steps done (the step in flight was abandoned)." in stopped.stderr
    monkeypatch.undo()
    resumed = CliRunner().invoke(cli(), resume_command(stopped.stderr)[1:], catch_exceptions=False)
    assert resumed.exit_code == 0, resumed.output
    assert_same_run(out, whole)


def test_sigterm_stops_like_ctrl_c_with_its_own_exit_code(tmp_path, monkeypatch):
    signals_during_step(monkeypatch, 0, signal.SIGTERM)
    stopped = invoke(*SMALL, "--out", str(tmp_path / "run"))
    assert stopped.exit_code == 143, stopped.output
    assert "SIGTERM: stopping once the step in flight has finished" in stopped.stderr
    assert resume_command(stopped.stderr)[-1] == str(tmp_path / "run")


def test_without_out_it_says_there_is_nothing_to_resume(monkeypatch):
    signals_during_step(monkeypatch, 0, signal.SIGINT)
    stopped = invoke(*SMALL)
    assert stopped.exit_code == 130
    assert "Nothing to resume: the run had no --out DIR" in stopped.stderr
    assert "--resume" not in stopped.stderr


def test_ctrl_c_while_loading_stops_at_once(tmp_path, monkeypatch):
    import objreg.analysis.run.prepare as prepare

    original = prepare.build_model

    def interrupted(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)
        return original(*args, **kwargs)

    monkeypatch.setattr(prepare, "build_model", interrupted)
    stopped = invoke(*SMALL, "--out", str(tmp_path / "run"))
    assert stopped.exit_code == 130
    assert "Stopped before training started. Nothing to resume: no step had finished" in stopped.stderr


def test_the_handlers_are_put_back_after_the_run():
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    assert invoke(*SMALL[:2], "--steps", "1", "--batch-size", "2", "--seq-len", "48", "--eval-size", "4",
                  "--json").exit_code == 0
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


@pytest.mark.e2e
def test_ctrl_c_in_a_real_process_then_the_printed_command_resumes_it(whole, tmp_path, stderr_until):
    # What a user does: Ctrl-C (SIGINT) a running `objreg analyze --out DIR` (stderr is no terminal
    # here, so progress comes as one line per probe), then run the command it printed.
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen([sys.executable, "-m", "objreg", "analyze", *SMALL, "--out", str(out)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    read = stderr_until(process, lambda line: re.match(r"\[\d+:\d\d:\d\d\] step 1/4 ", line), "step 1/4")
    process.send_signal(signal.SIGINT)
    stdout, rest = process.communicate(timeout=1800)  # bounds a hang only
    stderr = read + rest
    assert process.returncode == 130, stderr
    assert stdout == ""
    command = resume_command(stderr)
    resumed = subprocess.run([sys.executable, "-m", "objreg", *command[1:]], capture_output=True, text=True,
                             env=env, cwd=tmp_path, timeout=1800)  # bounds a hang only
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming at step" in resumed.stderr
    assert_same_run(out, whole)
