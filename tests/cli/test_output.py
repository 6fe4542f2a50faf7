"""Output that survives redirection: ``objreg analyze ... > log.txt`` holds every number of the
terminal report in full, checked against ``--json``; tables never cut a number, whatever the width."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys

import pytest
from click.testing import CliRunner
from rich.console import Console

import objreg
from objreg.cli import make_cli
from objreg.cli.analyze import _render

SMALL = ["--pretrain", "mlm,sop", "--steps", "3", "--batch-size", "4", "--seq-len", "48", "--eval-size", "8",
         "--head-warmup-steps", "5", "--head-fit-size", "16", "--spectrum", "2"]


def printed_numbers(report: dict) -> dict[str, list[str]]:
    """What the terminal report prints for each number of the JSON report, by the line it belongs
    to (an objective's row holds all of its numbers)."""
    summary, config = report["summary"], report["config"]
    rows = {}
    for name, a in summary["alignment"].items():
        rows[name] = [f"{a['dot']:.4g}", f"[{a['ci95'][0]:.3g}, {a['ci95'][1]:.3g}]", f"{a['cosine']:+.3f}",
                      f"{a['conflict_fraction']:.0%}", f"{a['grad_norm']:.3g}",
                      f"{a['predicted_contribution']:+.4g}", f"{config['weights'][name]:g}"]
    names = report["pretrain"]
    for i, a in enumerate(names):
        rows[f"S {a}"] = [f"{summary['second_order'][f'{a},{b}' if i <= j else f'{b},{a}']:.4g}"
                          for j, b in enumerate(names)]
    rows["first order"] = [f"{summary['first_order_term']:+.4g}", f"{summary['first_order_relative_error']:.1%}"]
    rows["predicted"] = [f"{summary['predicted_improvement']:+.4g}", f"{summary['taylor_relative_error']:.1%}"]
    rows["actual"] = [f"{summary['actual_improvement']:+.4g}"]
    rows["downstream loss"] = [f"{summary['initial_downstream_loss']:.4f}", f"{summary['final_downstream_loss']:.4f}",
                               f"{summary['first_order_term']:.4g}", f"{summary['actual_improvement']:.4g}"]
    for title, entries in (("helped", summary["attribution"]["helpful"]), ("hurt", summary["attribution"]["harmful"])):
        for k, e in enumerate(entries):
            rows[f"{e['objective']} {title}{k}"] = [f"{e['score']:+.3g}", f"step {','.join(map(str, e['steps']))}"]
    for entry in summary["spectrum"]:  # the eigenvalues wrap between numbers: one line each at least
        for k, value in enumerate(entry["eigenvalues"]):
            rows[f"eigenvalue {entry['step']}.{k}"] = [f"{value:.4g}"]
    return rows


def assert_every_number_in_full(text: str, report: dict) -> None:
    lines = text.splitlines()
    # Nothing cut, but the example texts of the attribution lists (on a terminal they end at its edge).
    examples = re.compile(r"^ +[+-][\d.e+-]+  \w+ +step ")
    assert "…" not in "".join(line for line in lines if not examples.match(line))
    for row, numbers in printed_numbers(report).items():
        head = {"S": row.split()[-1], "eigenvalue": ""}.get(row.split()[0], row.split()[0])
        candidates = [line for line in lines if head in line and all(n in line for n in numbers)]
        assert candidates, (row, numbers, text)


@pytest.fixture(scope="module")
def report_and_text(tmp_path_factory):
    """One run: its terminal report (stdout is no terminal here) and the same run's report.json."""
    out = tmp_path_factory.mktemp("out") / "run"
    cli = make_cli(lambda: objreg.get_plugin_manager(load_entrypoints=False))
    result = CliRunner().invoke(cli, ["analyze", *SMALL, "--out", str(out)], catch_exceptions=False,
                                env={"COLUMNS": "40"})  # a narrow width is ignored: this is no terminal
    assert result.exit_code == 0, result.output
    return json.loads((out / "report.json").read_text()), result.stdout


def test_report_to_a_file_holds_every_number_in_full(report_and_text):
    report, text = report_and_text
    assert_every_number_in_full(text, report)


@pytest.mark.parametrize("width", [30, 60, 80, 120])
def test_a_narrow_terminal_wraps_text_but_never_cuts_a_number(report_and_text, width):
    report, _ = report_and_text
    out = io.StringIO()
    _render(report, Console(file=out, width=width, force_terminal=True, color_system=None, soft_wrap=True))
    assert_every_number_in_full(out.getvalue(), report)


@pytest.mark.e2e
def test_redirected_output_matches_the_json_report(tmp_path):
    # The user's command, in a real process with stdout to a file, against --json of the same run.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "80"}
    command = [sys.executable, "-m", "objreg", "analyze", *SMALL]
    with open(tmp_path / "log.txt", "w") as log:
        done = subprocess.run(command, stdout=log, stderr=subprocess.PIPE, text=True, env=env, timeout=1800)
    assert done.returncode == 0, done.stderr
    as_json = subprocess.run([*command, "--json"], capture_output=True, text=True, env=env, timeout=1800)
    assert as_json.returncode == 0, as_json.stderr
    assert as_json.stderr == ""
    assert_every_number_in_full((tmp_path / "log.txt").read_text(), json.loads(as_json.stdout))
