"""The README stays true: its Python examples run, its commands run, and CI runs its test command."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from objreg.cli import cli
from objreg.experiments._support import shared_data

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, flags=re.S)


def test_ci_runs_the_readme_test_command():
    test_command = next(line for block in blocks("bash") for line in block.splitlines() if line.endswith("pytest"))
    assert test_command in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()


def test_bash_setup_lines_are_what_ci_runs():
    # Every step of the README's bash blocks is either an objreg command (run below) or a setup
    # step that .ci/run takes on a clean checkout.
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    steps = [part.strip() for block in blocks("bash") for line in block.splitlines() for part in line.split("&&")]
    setup = [step for step in steps if step and not step.startswith("objreg ")]
    assert setup and all(step.replace("-e .", "-e '.[test]'") in ci for step in setup), setup


@pytest.mark.e2e
@pytest.mark.parametrize("index", range(len(blocks("python"))))
def test_python_examples_run(index):
    code = blocks("python")[index]
    if "../shared/data" in code:  # the shared data where the experiments find it (the same folder by default)
        data = shared_data()
        if not data.is_dir():
            pytest.skip(f"the example reads the shared data, and {data} is absent")
        code = code.replace("../shared/data", str(data))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=1800, cwd=ROOT)  # bounds a hang only
    assert done.returncode == 0, done.stderr


def command_lines() -> list[str]:
    lines = [line.split("#")[0].strip() for block in blocks("bash") for line in block.splitlines()]
    return [line for line in lines if line.startswith("objreg ")]


@pytest.mark.e2e
@pytest.mark.parametrize("line", command_lines())
def test_commands_run(line):
    result = CliRunner().invoke(cli, shlex.split(line)[1:], catch_exceptions=False)
    assert result.exit_code == 0, result.output


@pytest.mark.e2e
def test_main_job_prints_real_numbers():
    # The README's main job, exactly as written there, in a real process.
    main = next(part.strip() for block in blocks("bash") for part in block.split("&&") if "objreg analyze" in part)
    done = subprocess.run(main.split(), capture_output=True, text=True, timeout=1800, cwd=ROOT,  # bounds a hang only
                          env={**os.environ, "COLUMNS": "120"})
    assert done.returncode == 0, done.stderr
    rows = {line.split("│")[1].strip(): line for line in done.stdout.splitlines() if line.startswith("│")}
    assert set(rows) == {"mlm", "sop"}
    numbers = [float(x) for x in re.findall(r"[-+]?\d+\.\d+", rows["mlm"])]
    assert any(abs(x) > 0 for x in numbers)
    assert "first-order predicted improvement" in done.stdout
