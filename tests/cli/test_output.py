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
         "--head-warmup-steps", "5", "--head-fit-size", "16", "--spectrum", "2", "--weights", "mlm=1,sop=0.5",
         "--downstream-head", "frozen"]  # a fit set this small overfits a re-fitted head (a warning on stderr)


def printed_numbers(report: dict) -> dict[str, list[str]]:
    """What the terminal report prints for each number of the JSON report, by the line it belongs
    to (an objective's row holds all of its numbers)."""
    summary, config = report["summary"], report["config"]
    rows = {}
    for name, a in summary["alignment"].items():
        rows[name] = [f"{a['dot']:.4g}", f"[{a['ci95'][0]:.3g}, {a['ci95'][1]:.3g}]", f"{a['cosine']:+.3f}",
                      f"{a['conflict_fraction']:.0%}", f"{a['grad_norm']:.3g}",
                      f"{a['predicted_contribution']:+.4g}"]
        if any(w != 1 for w in config["weights"].values()):
            rows[name].append(f"×{config['weights'][name]:g}")
    names = report["pretrain"]
    for i, a in enumerate(names):
        rows[f"S {a}"] = [f"{summary['second_order'][f'{a},{b}' if i <= j else f'{b},{a}']:.4g}"
                          for j, b in enumerate(names)]
    rows["first order"] = [f"{summary['first_order_term']:+.4g}", f"{summary['first_order_relative_error']:.1%}"]
    rows["predicted"] = [f"{summary['predicted_improvement']:+.4g}", f"{summary['taylor_relative_error']:.1%}"]
    rows["actual"] = [f"{summary['actual_improvement']:+.4g}"]
    rows["downstream loss"] = [f"{summary['initial_downstream_loss']:.4f}", f"{summary['final_downstream_loss']:.4f}"]
    for title, entries in (("helped", summary["attribution"]["helpful"]), ("hurt", summary["attribution"]["harmful"])):
        for k, e in enumerate(entries):
            rows[f"{e['objective']} {title}{k}"] = [f"{e['score']:+.3g}", f"step {','.join(map(str, e['steps']))}"]
    for entry in summary["spectrum"]:  # the eigenvalues wrap between numbers: one line each at least
        for k, value in enumerate(entry["eigenvalues"]):
            rows[f"eigenvalue {entry['step']}.{k}"] = [f"{value:.4g}"]
    return rows


#: Rows printed as prose, wrapped at the terminal's width.
PROSE = {"downstream loss"}


def assert_every_number_in_full(text: str, report: dict) -> None:
    lines = text.splitlines()
    # Nothing cut, but the example texts of the attribution lists (on a terminal they end at its edge).
    examples = re.compile(r"^ +[+-][\d.e+-]+  \w+ +step ")
    assert "…" not in "".join(line for line in lines if not examples.match(line))
    for row, numbers in printed_numbers(report).items():
        if row in PROSE:  # wrapped between words: each number whole, on whichever line it falls
            words = text.split()
            assert all(n in words for n in numbers), (row, numbers, text)
            continue
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


def rendered(report: dict, width: int = 80, threads: str | None = "1 thread (auto: 2 CPUs, load 1.93)") -> str:
    out = io.StringIO()
    _render(report, Console(file=out, width=width, force_terminal=True, color_system=None, soft_wrap=True), threads)
    return out.getvalue()


def test_every_line_fits_80_columns_and_the_header_names_the_threads(report_and_text):
    report, _ = report_and_text
    text = rendered(report)
    assert not [line for line in text.splitlines() if len(line) > 80]
    assert text.startswith("objreg analyze  device=cpu, 1 thread (auto: 2 CPUs, load 1.93)")
    # The weights are not all 1: each objective's row says its own.
    assert [line.split()[:2] for line in text.splitlines() if line.startswith(("mlm ×", "sop ×"))] == [
        ["mlm", "×1"], ["sop", "×0.5"]]


def test_the_report_ends_with_what_it_tells_what_it_cannot_and_what_next(report_and_text):
    report, _ = report_and_text
    lines = rendered(report).splitlines()
    headings = [i for i, line in enumerate(lines) if line in ("What this run tells", "What it cannot tell",
                                                               "What to run next")]
    assert len(headings) == 3 and headings == sorted(headings)
    assert all(lines[i + 1].startswith("- ") for i in headings)  # each with its statements
    assert lines[-1].startswith(("- ", "  "))  # the report ends with the suggestions
    told = " ".join(" ".join(lines[headings[0]:]).split())
    summary = report["summary"]
    assert f"from {summary['initial_downstream_loss']:.4f} to {summary['final_downstream_loss']:.4f}" in told
    assert f"--seed {report['config']['seed'] + 1}" in told


def test_lines_that_say_nothing_for_the_run_are_left_out(report_and_text):
    report, _ = report_and_text
    assert "counterfactual:" in rendered(report)
    one = json.loads(json.dumps(report))
    one["pretrain"] = ["mlm"]
    one["summary"]["alignment"] = {"mlm": one["summary"]["alignment"]["mlm"]}
    one["summary"]["second_order"] = {"mlm,mlm": one["summary"]["second_order"]["mlm,mlm"]}
    one["config"]["weights"] = {"mlm": 1.0}
    one["summary"]["weights_by_step"] = {"mlm": [1.0] * 3}
    text = rendered(one)
    assert "counterfactual" not in text.split("What this run tells")[0]  # one objective: no other weights
    assert " ×1" not in text  # every weight 1: no weights shown
    assert "--pretrain mlm,OTHER" in " ".join(text.split())


def test_relative_error_n_a_is_explained(report_and_text):
    report, _ = report_and_text
    assert "n/a" not in rendered(report)
    cancelled = json.loads(json.dumps(report))
    cancelled["summary"]["taylor_relative_error"] = cancelled["summary"]["first_order_relative_error"] = None
    scaled = cancelled["summary"]["taylor_error"]["scaled"]
    text = " ".join(rendered(cancelled, width=200).split())
    assert "n/a: the steps' actual changes cancel over the run" in text
    assert f"{scaled['first_order']:.1%} (first order) and {scaled['first_plus_second_order']:.1%}" in text


def test_the_header_says_the_schedule(report_and_text):
    report, _ = report_and_text
    assert "schedule=" not in rendered(report, width=200)
    for specs, shown in (({"mlm": "adaptive:quadratic", "sop": "adaptive:quadratic"}, "schedule=adaptive:quadratic"),
                         ({"mlm": "linear:1:0", "sop": "constant"}, "schedule=mlm=linear:1:0")):
        changed = json.loads(json.dumps(report))
        changed["config"]["schedule"] = specs
        assert shown in rendered(changed, width=200).split("Alignment with")[0]  # in the header


def test_many_objectives_give_the_interaction_as_pairs_on_a_narrow_terminal(report_and_text):
    report, _ = report_and_text
    names = [f"objective{i}" for i in range(9)]
    many = json.loads(json.dumps(report))
    many["pretrain"] = names
    many["summary"]["second_order"] = {f"{a},{b}": float(i + j) for i, a in enumerate(names)
                                       for j, b in enumerate(names) if i <= j}
    text = rendered(many)
    section = text.split("Second-order interaction")[1].split("Taylor prediction")[0]
    assert "objective0,objective8 8" in section and "objective8,objective8 16" in section
    assert not [line for line in section.splitlines() if len(line) > 80]


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
