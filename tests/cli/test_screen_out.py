"""``objreg screen --out``: analyze's run-directory discipline. The directory is claimed, locked
and checked before any training (an empty, impossible, linked, busy or already written --out is
one line and nothing is loaded); the ranking is printed before the files are written, atomically,
and a full disk or a file-size limit is one line that loses nothing shown; Ctrl-C and SIGTERM stop
after the candidate in flight (twice: at once), print and write what finished, exit 130/143."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import objreg
from objreg.analysis.run.rundir import LOCK_FILE, lock
from objreg.cli import make_cli
from objreg.cli import screen as screen_command

SMALL = ["--batch-size", "4", "--seq-len", "48", "--eval-size", "8", "--head-fit-size", "16"]


@pytest.fixture
def run():
    cli = make_cli(lambda: objreg.get_plugin_manager(load_entrypoints=False))

    def invoke(*args: str):
        return CliRunner().invoke(cli, ["screen", "--candidates", "mlm,sop", "--budget", "2", *SMALL, *args])

    return invoke


def _linked(tmp_path, name):
    out = tmp_path / "out"
    out.mkdir()
    target = tmp_path / "elsewhere"
    target.write_text("someone's file")
    (out / name).symlink_to(target)
    return str(out)


def _earlier(tmp_path, name):
    out = tmp_path / "out"
    out.mkdir()
    (out / name).write_text("{}")
    return str(out)


def _file(tmp_path):
    (tmp_path / "plain").write_text("x")
    return str(tmp_path / "plain")


REFUSED = {
    "empty": (lambda t: "", "--out is empty"),
    "blank": (lambda t: "  ", "--out is empty"),
    "a file": (_file, "exists and is not a directory"),
    "below a file": (lambda t: os.path.join(_file(t), "sub"), "Not a directory"),
    "on a file system that refuses": (lambda t: "/proc/objreg-screen-out", "cannot use --out"),
    "screen.json a link": (lambda t: _linked(t, "screen.json"), "screen.json is a symbolic link"),
    "screen.png a link": (lambda t: _linked(t, "screen.png"), "screen.png is a symbolic link"),
    "the lock file a link": (lambda t: _linked(t, LOCK_FILE), ".objreg.lock is a symbolic link"),
    "an earlier screen.json": (lambda t: _earlier(t, "screen.json"), "already holds screen.json of an earlier"),
    "an earlier screen.png": (lambda t: _earlier(t, "screen.png"), "already holds screen.png of an earlier"),
}


@pytest.mark.parametrize("case", list(REFUSED), ids=list(REFUSED))
def test_an_unusable_out_is_one_line_before_any_work(run, tmp_path, case):
    make, message = REFUSED[case]
    out = make(tmp_path)
    before = {p: p.read_bytes() if p.is_file() else None for p in tmp_path.rglob("*")}
    result = run("--out", out)
    assert result.exit_code == 1
    assert message in result.stderr and "Traceback" not in result.stderr
    assert "loading corpus" not in result.stderr and result.stdout == ""
    assert (tmp_path / "elsewhere").read_text() == "someone's file" if (tmp_path / "elsewhere").exists() else True
    after = {p: p.read_bytes() if p.is_file() else None for p in tmp_path.rglob("*") if p.name != LOCK_FILE}
    assert {p: v for p, v in before.items() if p.name != LOCK_FILE} == after  # nothing written or changed


def test_an_out_in_use_by_another_process_is_refused(run, tmp_path):
    held = lock(tmp_path / "out", what="objreg screen")
    try:
        result = run("--out", str(tmp_path / "out"))
    finally:
        held.release()
    assert result.exit_code == 1 and "is in use by another objreg screen" in result.stderr
    assert "loading corpus" not in result.stderr


def test_the_result_is_written_whole_and_the_directory_left_unlocked(run, tmp_path):
    result = run("--out", str(tmp_path / "out"), "--json")
    assert result.exit_code == 0, result.output
    written = json.loads((tmp_path / "out" / "screen.json").read_text())
    assert written == json.loads(result.stdout)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["screen.json", "screen.png"]
    again = run("--out", str(tmp_path / "out"))
    assert again.exit_code == 1 and "already holds screen.json, screen.png" in again.stderr
    assert json.loads((tmp_path / "out" / "screen.json").read_text()) == written  # never overwritten


def failing(code, on):
    real = screen_command.atomic_file

    @contextlib.contextmanager
    def atomic_file(path, mode="wb"):
        if Path(path).name == on:
            raise OSError(code, os.strerror(code), str(path))
        with real(path, mode) as f:
            yield f

    return atomic_file


@pytest.mark.parametrize("code, line", [(errno.ENOSPC, "no space left on the device writing"),
                                        (errno.EDQUOT, "no space left on the device writing"),
                                        (errno.EFBIG, "file too large writing"),
                                        (errno.EROFS, "the file system is read-only")])
def test_a_failed_write_is_one_line_after_the_ranking_is_shown(run, tmp_path, monkeypatch, code, line):
    monkeypatch.setattr(screen_command, "atomic_file", failing(code, "screen.json"))
    result = run("--out", str(tmp_path / "out"))
    assert result.exit_code == 1
    assert line in result.stderr and "screen.json" in result.stderr and "Traceback" not in result.stderr
    assert result.stdout.startswith("objreg screen") and "Ranking" in result.stdout  # shown before the write
    assert not (tmp_path / "out" / "screen.json").exists()
    assert not (tmp_path / "out" / LOCK_FILE).exists() or _unlocked(tmp_path / "out")


def _unlocked(directory):
    lock(directory).release()  # would raise were the lock still held
    return True


def _cli(args, limit=None):
    """The console script in a process of its own (signals; a file-size limit)."""
    code = "import sys; from objreg.cli import main; sys.argv = ['objreg', *sys.argv[1:]]; main()"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}

    def limited():
        import resource

        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return subprocess.Popen([sys.executable, "-c", code, "screen", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, preexec_fn=limited if limit else None)


def test_a_real_file_size_limit_is_one_line(tmp_path):
    process = _cli(["--candidates", "mlm,sop", "--budget", "2", *SMALL, "--out", str(tmp_path / "out")], limit=8000)
    out, err = process.communicate(timeout=600)
    assert process.returncode == 1, err
    assert "file too large writing" in err and "screen.png" in err and "Traceback" not in err
    assert "Ranking" in out
    assert json.loads((tmp_path / "out" / "screen.json").read_text())["downstream"] == "qa"  # what fitted stays


@pytest.mark.parametrize("signals, code", [([signal.SIGINT], 130), ([signal.SIGTERM], 143),
                                           ([signal.SIGINT, signal.SIGINT], 130)],
                         ids=["Ctrl-C", "SIGTERM", "Ctrl-C twice"])
def test_a_signal_stops_after_the_candidate_in_flight_and_keeps_what_finished(tmp_path, signals, code):
    out = tmp_path / "out"
    # Twice: a longer budget, so that the second signal lands while the candidate still trains.
    budget = "3" if len(signals) == 1 else "12"
    process = _cli(["--candidates", "mlm,sop,clm", "--budget", budget, *SMALL, "--out", str(out)])
    lines, waiting = [], list(signals)
    for line in process.stderr:  # the first signal as the second candidate starts training
        lines.append(line)
        first = len(waiting) == len(signals)
        if (first and "screening sop" in line) or (not first and "stopping once the candidate in flight" in line):
            # A second signal only once the first was handled (two pending signals are one).
            process.send_signal(waiting.pop(0))
            if not waiting:
                break
    stdout, rest = process.communicate(timeout=600)
    err = "".join(lines) + rest
    assert process.returncode == code, err
    assert "Aborted" not in err and "Traceback" not in err and "Stopped with" in err
    report = json.loads((out / "screen.json").read_text())
    assert report["stopped"] and "Ranking" in stdout and "- not run: clm: stopped before its turn" in stdout
    by_name = {e["candidate"]: e for e in report["candidates"]}
    assert by_name["mlm"]["runnable"] and by_name["mlm"]["rank"] is not None
    assert by_name["clm"]["reason"] == "stopped before its turn"
    if len(signals) == 1:  # the candidate in flight finished
        assert by_name["sop"]["runnable"] and by_name["sop"]["steps"] == int(budget)
    else:  # the second signal abandoned it
        assert by_name["sop"]["reason"] == "stopped while it trained (its run was abandoned)", err
    assert not (out / LOCK_FILE).exists()
