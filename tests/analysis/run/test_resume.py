"""Resumable runs: an interrupted ``--out`` run, resumed, ends with an uninterrupted run's numbers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

import objreg
from objreg.analysis.run.resume import CHECKPOINT

SMALL = dict(steps=4, batch_size=4, seq_len=48, eval_size=8, head_fit_size=32)
CLI_SMALL = ["--steps", "6", "--batch-size", "4", "--seq-len", "48", "--eval-size", "8", "--head-fit-size", "32"]


class Stop(Exception):
    pass


def _stop_after(k):
    def on_step(step, record):
        if step == k - 1:
            raise Stop

    return on_step


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("whole") / "run"
    report = objreg.analyze("mlm,sop", "qa", **SMALL, optimizer="adam", lr=1e-3, probe_every=2, out_dir=out)
    return report, out


@pytest.mark.e2e
def test_interrupted_and_resumed_run_gives_the_same_summary(uninterrupted, tmp_path):
    whole, whole_dir = uninterrupted
    out = tmp_path / "run"
    with pytest.raises(Stop):
        objreg.analyze("mlm,sop", "qa", **SMALL, optimizer="adam", lr=1e-3, probe_every=2, out_dir=out,
                       on_step=_stop_after(2))
    assert (out / CHECKPOINT).is_file() and not (out / "report.json").exists()
    # A line of the step in flight (written before the kill) must be dropped on resume.
    with open(out / "steps.jsonl", "a") as f:
        f.write('{"step": 99, "half": tru')
    steps_seen = []
    resumed = objreg.analyze(resume=out, on_step=lambda s, r: steps_seen.append(s))
    assert steps_seen == [2, 3]  # continues at the next step, does not redo finished ones
    assert json.dumps(resumed.summary) == json.dumps(whole.summary)
    assert resumed.to_json() == whole.to_json()
    assert (out / "steps.jsonl").read_text() == (whole_dir / "steps.jsonl").read_text()
    assert (out / "report.json").read_text() == (whole_dir / "report.json").read_text()
    assert not (out / CHECKPOINT).exists()  # removed once the report is in place


@pytest.mark.e2e
def test_resume_refuses_a_finished_run_and_other_settings(uninterrupted, tmp_path):
    _, whole_dir = uninterrupted
    with pytest.raises(objreg.InvalidParameterError, match="already finished"):
        objreg.analyze(resume=whole_dir)
    with pytest.raises(objreg.InvalidParameterError, match="drop steps"):
        objreg.analyze(resume=whole_dir, steps=3)


def test_resume_with_other_settings_names_them_as_keyword_arguments(tmp_path):
    with pytest.raises(objreg.InvalidParameterError,
                       match=r"^resume takes every setting from the run's config.json; drop pretrain, out_dir, steps$"):
        objreg.analyze(pretrain="mlm", resume=tmp_path, out_dir=tmp_path / "elsewhere", steps=3)


def test_resume_without_a_usable_checkpoint_is_one_clear_error(tmp_path):
    with pytest.raises(objreg.DataError, match="no config.json"):
        objreg.analyze(resume=tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"pretrain": ["mlm"], **SMALL}))
    with pytest.raises(objreg.DataError, match=f"no {CHECKPOINT}"):
        objreg.analyze(resume=tmp_path)
    (tmp_path / CHECKPOINT).write_bytes(b"not a checkpoint")
    # A run directory records its inputs in run.json before its first step; without it nothing is resumed.
    with pytest.raises(objreg.DataError, match="no run.json"):
        objreg.analyze(resume=tmp_path)


def _cli(*args, **kwargs):
    env = {**os.environ, "OBJREG_RAISE_ERRORS": "0"}
    return subprocess.Popen([sys.executable, "-m", "objreg", "analyze", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kwargs)


@pytest.mark.e2e
def test_kill_9_then_resume_matches_an_uninterrupted_run(tmp_path, stderr_until):
    killed, whole = tmp_path / "killed", tmp_path / "whole"
    process = _cli("--pretrain", "mlm", *CLI_SMALL, "--out", str(killed))
    reference = _cli("--pretrain", "mlm", *CLI_SMALL, "--out", str(whole))
    steps = killed / "steps.jsonl"
    # The run reports each probed step on stderr once its line of steps.jsonl is written.
    stderr_until(process, lambda _: steps.exists() and len(steps.read_text().splitlines()) >= 2, "two steps")
    os.kill(process.pid, signal.SIGKILL)
    process.communicate()
    assert process.returncode == -signal.SIGKILL
    assert not (killed / "report.json").exists()
    reference.communicate()
    assert reference.returncode == 0

    resumed = subprocess.run([sys.executable, "-m", "objreg", "analyze", "--resume", str(killed)],
                             capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    report = json.loads((killed / "report.json").read_text())
    expected = json.loads((whole / "report.json").read_text())
    assert len(report["steps"]) == 6
    assert json.dumps(report["summary"]) == json.dumps(expected["summary"])
    again = subprocess.run([sys.executable, "-m", "objreg", "analyze", "--resume", str(killed), "--steps", "3"],
                           capture_output=True, text=True)
    assert again.returncode != 0 and "Traceback" not in again.stderr
    assert "--resume takes every setting" in again.stderr and len(again.stderr.strip().splitlines()) == 1
