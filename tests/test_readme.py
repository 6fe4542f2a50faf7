"""The README stays true: its Python examples run (with those of docs/usage.md, where its longer
material lives), its commands run, CI runs its test command, and the output it shows is what the
code prints.

The main job's output block and the output shown after a Python example ("It prints ...") are
written by code: ``python tests/test_readme.py --write`` runs them (one thread, the main job on an
80-column pseudo-terminal) and writes their output into README.md with the commit and date; the
tests run them again and compare every line, numbers to 1% (another machine's float rounding may
move a last digit, a stale README moves far more).
"""

from __future__ import annotations

import datetime
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
#: The README's examples beyond the main job live in docs/usage.md: they run and are written the same way.
USAGE_PATH = ROOT / "docs" / "usage.md"
USAGE = USAGE_PATH.read_text(encoding="utf-8")
PAGES = {ROOT / "README.md": README, USAGE_PATH: USAGE}
#: The environment the README's outputs are made and checked in: one thread, so one machine
#: prints the same numbers every time.
ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1"}
#: The main job's output block: its command line, then the output.
MAIN_BLOCK = re.compile(r"(```text\n\$ (objreg analyze [^\n]*)\n)(.*?)(```)", re.S)
#: A Python example followed by the output it prints.
PRINTS = re.compile(r"(```python\n((?:(?!```).)*)```\n\nIt prints[^\n]*:\n\n```text\n)(.*?)(```)", re.S)
#: Where README says when its outputs were written.
STAMP = re.compile(r"last at commit `[0-9a-f]+`, \d{4}-\d{2}-\d{2}")
NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?%?")
#: A line of the example lists: score, objective, steps, text.
EXAMPLE_LINE = re.compile(r"^ +[-+][\d.e+-]+  \S+ +step ")


def blocks(language: str) -> list[str]:
    """The fenced blocks of README.md, then of docs/usage.md."""
    return [block for text in PAGES.values() for block in re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)]


def test_the_readme_opens_with_its_two_commands_and_stays_short():
    lines = README.splitlines()
    first = "\n".join(lines[:30])
    main = next(part.strip() for block in blocks("bash") for part in block.split("&&") if "objreg analyze" in part)
    assert main in first and first.rstrip().count("pytest") >= 1, "README's two set-up commands must come first"
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; long material goes to docs/"


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


# -- comparing outputs ------------------------------------------------------------------------------


def _value(text: str) -> float:
    return float(text.replace(",", "").rstrip("%"))


def _unit(text: str) -> float:
    """One unit in the last digit ``text`` prints (``44.5%``: 0.1; ``1.2e-05``: 1e-06)."""
    mantissa, _, exponent = text.replace(",", "").rstrip("%").lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    return 10.0 ** (-decimals + (int(exponent) if exponent else 0))


def _close(expected: str, got: str, rel: float) -> bool:
    a, b = _value(expected), _value(got)
    return abs(a - b) <= max(rel * max(abs(a), abs(b)), _unit(expected), _unit(got))


def differences(expected: str, got: str, rel: float = 0.01) -> list[str]:
    """Where ``got`` differs from ``expected``: line by line, the text outside numbers exactly and
    the numbers to ``rel`` (or one unit in their last digit); the example lists' lines as a set
    (equal scores may come in either order)."""
    def split(text: str) -> tuple[list[str], list[str]]:
        lines = [line.rstrip() for line in text.strip("\n").splitlines()]
        return [x for x in lines if not EXAMPLE_LINE.match(x)], sorted(x for x in lines if EXAMPLE_LINE.match(x))

    found = []
    for want, have in zip(split(expected), split(got)):
        if len(want) != len(have):
            found.append(f"{len(want)} lines expected, {len(have)} printed:\n" + "\n".join(have))
            continue
        for a, b in zip(want, have):
            if NUMBER.sub("#", a) != NUMBER.sub("#", b) or not all(
                    _close(x, y, rel) for x, y in zip(NUMBER.findall(a), NUMBER.findall(b))):
                found.append(f"README: {a}\nprinted: {b}")
    return found


def test_differences_read_numbers_to_one_percent_and_text_exactly():
    shown = "D 2.7569 → 2.7793 over 16 steps\n  mlm 54%  [-0.768, 0.476]  1,486,336\n    +0.00248  mlm      step 7     a"
    assert differences(shown, shown) == []
    assert differences(shown, shown.replace("2.7569", "2.7570").replace("54%", "55%")) == []  # rounding
    assert differences(shown, shown.replace("2.7793", "2.8900"))  # 4% off: stale
    assert differences(shown, shown.replace("16 steps", "16 probes"))
    assert differences(shown, shown.replace("1,486,336", "1,586,336"))
    assert differences(shown, shown + "\nanother line")
    swapped = "    +0.00248  mlm      step 11    b\n    +0.00248  mlm      step 7     a"
    assert differences(swapped, "\n".join(reversed(swapped.splitlines()))) == []


# -- the main job ---------------------------------------------------------------------------------


def main_job() -> tuple[str, str]:
    """The main job's command line as README's output block shows it, and its output there."""
    match = MAIN_BLOCK.search(README)
    assert match, "README.md has no ```text block starting with `$ objreg analyze ...`"
    return match.group(2), match.group(3)


def test_the_output_block_shows_the_readme_main_job():
    main = next(part.strip() for block in blocks("bash") for part in block.split("&&") if "objreg analyze" in part)
    assert main_job()[0] == main


def run_main_job(terminal) -> str:
    command, _ = main_job()
    code, out, err = terminal(shlex.split(command)[1:], 80, ONE_THREAD, ROOT)
    assert code == 0, err
    return out


@pytest.mark.e2e
def test_main_job_prints_the_readme_block_within_80_columns(terminal):
    # The README's main job, as written there, in a real process on an 80-column terminal.
    out = run_main_job(terminal)
    wide = [line for line in out.splitlines() if len(line) > 80]
    assert not wide, wide
    assert not differences(main_job()[1], out), "\n\n".join(differences(main_job()[1], out)) + (
        "\n\nREADME.md is out of date: python tests/test_readme.py --write")


def test_the_output_block_is_stamped_with_a_commit():
    assert STAMP.search(README), "README.md's outputs carry no commit: python tests/test_readme.py --write"


# -- the examples -------------------------------------------------------------------------------------


def prints_after(code: str) -> str | None:
    """The output README shows after the Python example ``code`` (None: it shows none)."""
    return next((m.group(3) for text in PAGES.values() for m in PRINTS.finditer(text) if m.group(2) == code), None)


def run_example(code: str) -> subprocess.CompletedProcess:
    if "../shared/data" in code:  # the shared data where the experiments find it (the same folder by default)
        data = shared_data()
        if not data.is_dir():
            pytest.skip(f"the example reads the shared data, and {data} is absent")
        code = code.replace("../shared/data", str(data))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=1800, cwd=ROOT,
                          env=ONE_THREAD)  # bounds a hang only


@pytest.mark.e2e
@pytest.mark.parametrize("index", range(len(blocks("python"))))
def test_python_examples_run(index):
    code = blocks("python")[index]
    done = run_example(code)
    assert done.returncode == 0, done.stderr
    shown = prints_after(code)
    if shown is not None:
        assert not differences(shown, done.stdout), "\n".join(differences(shown, done.stdout)) + (
            "\n\nREADME.md is out of date: python tests/test_readme.py --write")


def command_lines() -> list[str]:
    lines = [line.split("#")[0].strip() for block in blocks("bash") for line in block.splitlines()]
    return [line for line in lines if line.startswith("objreg ")]


@pytest.mark.e2e
@pytest.mark.parametrize("line", command_lines())
def test_commands_run(line):
    result = CliRunner().invoke(cli, shlex.split(line)[1:], catch_exceptions=False)
    assert result.exit_code == 0, result.output


# -- writing README's outputs ---------------------------------------------------------------------


def write() -> None:
    """Run the main job and every Python example README shows the output of; write their outputs,
    the commit and the date into README.md."""
    from conftest import run_on_terminal  # this file runs as a script here: tests/ is on sys.path

    command, _ = main_job()
    code, out, err = run_on_terminal(shlex.split(command)[1:], 80, ONE_THREAD, ROOT)
    if code != 0:
        raise SystemExit(f"{command} failed:\n{err}")
    shown = "\n".join(line.rstrip() for line in out.strip("\n").splitlines())
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT,
                            check=True).stdout.strip()
    for path, text in PAGES.items():
        if text is README:  # the main job's block (docs/usage.md shows other commands' lines)
            text = MAIN_BLOCK.sub(lambda m: m.group(1) + shown + "\n" + m.group(4), text, count=1)
        for match in list(PRINTS.finditer(text)):
            done = run_example(match.group(2))
            if done.returncode != 0:
                raise SystemExit(f"an example failed:\n{done.stderr}")
            text = text.replace(match.group(0), match.group(1) + done.stdout + match.group(4))
        text = STAMP.sub(f"last at commit `{commit}`, {datetime.date.today().isoformat()}", text)
        path.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        raise SystemExit("usage: python tests/test_readme.py --write")
    write()
