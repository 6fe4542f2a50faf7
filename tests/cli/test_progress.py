"""The progress of ``objreg analyze`` on stderr: stage lines, a bar with an ETA and seconds per step
once the first step is timed, the latest probe's numbers; plain lines where stderr is no terminal."""

from __future__ import annotations

import io
import json
import re

import pytest
from click.testing import CliRunner
from rich.console import Console

import objreg
from objreg.cli import make_cli
from objreg.cli.progress import TRAINING, RunDisplay, clock_text, cosine_text

SMALL = ["--steps", "2", "--batch-size", "4", "--seq-len", "48", "--eval-size", "8", "--head-warmup-steps", "5",
         "--head-fit-size", "16", "--downstream-head", "frozen"]


def record(step: int) -> dict:
    return {
        "step": step, "weights": {"mlm": 1.0, "sop": 0.5}, "downstream_loss": 3.14159, "downstream_loss_after": 3.1,
        "actual_delta": -0.04159, "predicted_delta": {"first_order": -0.05, "second_order": 0.01},
        "alignment": {
            "mlm": {"dot": 0.5602, "cosine": 0.0112, "ci95": [0.11, 1.01], "conflict_fraction": 0.375},
            "sop": {"dot": -0.008745, "cosine": -0.0013, "ci95": [-0.0765, 0.094], "conflict_fraction": 0.5},
        },
    }


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def display(live: bool, total: int = 20):
    out = io.StringIO()
    console = Console(file=out, width=200, force_terminal=live, color_system=None)
    clock = Clock()
    return RunDisplay(console, total, live=live, clock=clock), out, clock, console


def rendered(view: RunDisplay, console: Console) -> str:
    with console.capture() as capture:
        console.print(view._render())
    return capture.get()


def test_clock_text():
    assert clock_text(65.2) == "0:01:05" and clock_text(3725) == "1:02:05"


def test_a_cosine_that_rounds_to_zero_is_no_signed_zero():
    assert cosine_text(-0.00034) == "-3e-04" and cosine_text(0.0123) == "+0.012" and cosine_text(0.0) == "+0.000"


def test_the_live_bar_fits_an_80_column_terminal():
    out = io.StringIO()
    console = Console(file=out, width=80, force_terminal=True, color_system=None)
    clock = Clock()
    view = RunDisplay(console, 1000, live=True, clock=clock)
    view.status(TRAINING)
    clock.now += 3725.0
    view.step(0, None)
    bar = rendered(view, console).splitlines()
    assert len(bar) == 1 and "ETA" in bar[0] and "s/step" in bar[0], bar


def test_live_bar_gets_an_eta_and_seconds_per_step_with_the_first_step_and_shows_the_probe():
    view, out, clock, console = display(live=True)
    view.status("loading corpus 'default'")
    clock.now += 0.4
    view.status("fitting the downstream head (100 steps on 1,024 examples)")
    assert "fitting the downstream head" in rendered(view, console)  # the stage in flight, with a spinner
    clock.now += 13.0
    view.status(TRAINING)
    # Stage lines: each finished stage with its time, the head fit included.
    assert re.search(r"✓ +0\.4 s  loading corpus 'default'", out.getvalue())
    assert re.search(r"✓ +13\.0 s  fitting the downstream head", out.getvalue())
    before = rendered(view, console)
    assert "0/20 steps" in before and "ETA after the first step" in before
    clock.now += 3.0
    view.step(0, record(0))
    after = rendered(view, console)
    assert "1/20 steps" in after and "ETA 0:00:57" in after and "3.00 s/step" in after  # 19 steps × 3 s
    # The probe's numbers as improvements (positive: D fell), the report's sign.
    for number in ("3.1416 → 3.1000", "improvement +0.04159", "predicted +0.05", "+0.04 (with second order)",
                   "+0.5602", "+0.011", "-0.008745", "-0.001"):
        assert number in after, number
    clock.now += 3.0
    view.step(1, None)  # an unprobed step keeps the latest probe's numbers
    assert "2/20 steps" in rendered(view, console) and "probe at step 0" in rendered(view, console)


def test_plain_log_has_a_line_per_stage_and_per_probe():
    view, out, clock, _ = display(live=False, total=4)
    view.status("loading corpus 'default'")
    clock.now += 2.0
    view.status(TRAINING)
    clock.now += 5.0
    view.step(0, record(0))
    view.step(1, None)
    clock.now += 5.0
    view.step(2, record(2))
    view.status("writing the report")
    lines = out.getvalue().splitlines()
    assert lines[0] == "[0:00:00] loading corpus 'default'"
    assert lines[1] == "[0:00:02] training with probes: 0/4 steps"
    assert lines[2].startswith("[0:00:07] step 1/4 5.00 s/step, ETA 0:00:15 | D 3.1416 → 3.1000")
    assert "D 3.1416 → 3.1000: improvement +0.04159, predicted +0.05 (first order), +0.04 (with second order)" in lines[2]
    assert "mlm dot +0.5602 cosine +0.011; sop dot -0.008745 cosine -0.001" in lines[2]
    assert lines[3].startswith("[0:00:12] step 3/4 3.33 s/step, ETA 0:00:03 |")
    assert lines[4].startswith("[0:00:12] trained steps 3/4, 3.33 s/step") and lines[5] == "[0:00:12] writing the report"
    assert len(lines) == 6  # the unprobed step printed nothing


def test_the_cli_logs_stages_and_probes_where_stderr_is_no_terminal():
    cli = make_cli(lambda: objreg.get_plugin_manager(load_entrypoints=False))
    result = CliRunner().invoke(cli, ["analyze", "--pretrain", "mlm,sop", *SMALL], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    log = result.stderr
    for stage in ("loading corpus 'default'", "loading downstream data for 'qa'", "building model 'default'",
                  "fitting the downstream head (5 steps on 16 examples)", "training with probes: 0/2 steps"):
        assert stage in log, stage
    probes = [line for line in log.splitlines() if re.match(r"\[\d+:\d\d:\d\d\] step \d/2 ", line)]
    assert len(probes) == 2 and all("mlm dot" in p and "sop dot" in p and "ETA" in p for p in probes)


def test_json_prints_no_progress():
    cli = make_cli(lambda: objreg.get_plugin_manager(load_entrypoints=False))
    result = CliRunner().invoke(cli, ["analyze", "--pretrain", "mlm", *SMALL, "--json"], catch_exceptions=False)
    assert result.exit_code == 0
    assert result.stderr == ""
    json.loads(result.stdout)


@pytest.mark.parametrize("live", [True, False])
def test_a_note_shows_under_the_bar_or_as_a_line(live):
    view, out, _, console = display(live=live)
    view.status(TRAINING)
    view.notify("Ctrl-C: stopping once the step in flight has finished")
    shown = rendered(view, console) if live else out.getvalue()
    assert "stopping once the step in flight has finished" in shown


def test_without_lines_the_live_display_leaves_nothing_behind():
    view, out, clock, console = display(live=True)
    view.lines = False
    view.event("computing with 1 thread (auto: 2 CPUs, load 1.00)")
    view.status("loading corpus 'default'")
    view.status(TRAINING)
    view.step(0, record(0))
    assert "training" in rendered(view, console)  # the live bar is there while it runs
    view.__exit__(None)
    assert out.getvalue().strip() == ""


def test_json_on_a_terminal_shows_a_live_bar_on_stderr_and_only_json_on_stdout():
    # stderr is a pseudo-terminal, stdout a pipe: as `objreg analyze --json > report.json` in a terminal.
    import fcntl
    import os
    import pty
    import struct
    import subprocess
    import sys
    import termios

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OBJREG_LOAD_PLUGINS": "", "TERM": "xterm"}
    env.pop("COLUMNS", None)
    with subprocess.Popen([sys.executable, "-m", "objreg", "analyze", "--pretrain", "mlm", *SMALL, "--json"],
                          stdout=subprocess.PIPE, stderr=follower, stdin=subprocess.DEVNULL, env=env) as process:
        os.close(follower)
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 65536)  # until the child closes the terminal
            except OSError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        report = json.loads(process.stdout.read())
        process.wait()
    os.close(leader)
    errors = b"".join(chunks).decode("utf-8", "replace")
    assert process.returncode == 0 and report["pretrain"] == ["mlm"]
    assert "training" in errors  # the bar was drawn while it ran
    assert "computing with" not in errors and "✓" not in errors  # but no stage lines
