"""Every table fits an 80-column terminal: ``objreg analyze``'s report, ``objreg list`` (no
identifier split across lines) and ``objreg experiment list`` (one line per experiment), each run
in a real process on a pseudo-terminal 80 columns wide. README's main job is checked the same way
in tests/test_readme.py."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import objreg
from objreg.cli import make_cli

NO_PLUGINS = {"OBJREG_LOAD_PLUGINS": ""}


def wide_lines(text: str, width: int = 80) -> list[str]:
    return [line for line in text.splitlines() if len(line) > width]


@pytest.fixture(scope="module")
def environment():
    import os

    return {**os.environ, **NO_PLUGINS, "OMP_NUM_THREADS": "1"}


def test_list_fits_80_columns_and_splits_no_name(terminal, environment):
    code, out, err = terminal(["list"], 80, environment)
    assert code == 0, err
    assert not wide_lines(out), wide_lines(out)
    data = json.loads(CliRunner().invoke(make_cli(lambda: objreg.get_plugin_manager(load_entrypoints=False)),
                                         ["list", "--json"]).stdout)
    names = [*(o["name"] for o in data["objectives"]), *(t["name"] for t in data["tasks"]),
             *(m["name"] for m in data["modifiers"]), *(p["name"] for p in data["providers"]),
             *(k["name"] for k in data["head_kinds"]), "objreg.toolkit.modifiers", "objreg.corpora.hf_datasets"]
    words = {word.strip("'(),:") for line in out.splitlines() for word in line.split()}
    assert not [name for name in names if name not in words and name not in out], names
    for name in names:  # whole on one line, never folded into two
        assert any(name in line for line in out.splitlines()), name


def test_list_keeps_its_tables_where_they_fit(terminal, environment):
    code, out, _ = terminal(["list"], 400, environment)
    assert code == 0
    assert "┃ name" in out  # a wide terminal gets the tables


def test_experiment_list_is_one_line_per_experiment_within_80_columns(terminal, environment):
    code, out, err = terminal(["experiment", "list"], 80, environment)
    assert code == 0, err
    assert not wide_lines(out), wide_lines(out)
    lines = out.strip("\n").splitlines()
    described = objreg.experiments.describe()
    heading = "software checks, not claims of the literature:"
    assert [line.split()[0] for line in lines[:-1] if line != heading] == [row["name"] for row in described]
    assert "objreg experiment show NAME" in lines[-1]
    # The software checks come after the claims, under their own heading.
    kinds = [row["kind"] for row in described]
    assert lines.index(heading) == kinds.index("software check") and "claim" not in kinds[kinds.index("software check"):]


def test_experiment_list_to_a_file_holds_each_claim_whole_on_its_line():
    out = CliRunner().invoke(make_cli(), ["experiment", "list"]).stdout.splitlines()
    described = objreg.experiments.describe()
    assert len(out) == len(described) + 2  # the software checks' heading and the closing hint
    out = [line for line in out if not line.startswith("software checks")]
    for line, row in zip(out, described):
        assert line.startswith(row["name"]) and line.endswith(row["claim"])


def test_experiment_show_gives_claim_source_and_rule():
    row = objreg.experiments.describe()[0]
    cli = make_cli()
    shown = CliRunner().invoke(cli, ["experiment", "show", row["name"]])
    assert shown.exit_code == 0, shown.output
    flat = " ".join(shown.stdout.split())
    for key in ("claim", "source", "rule"):
        assert " ".join(row[key].split()) in flat
    assert json.loads(CliRunner().invoke(cli, ["experiment", "show", row["name"], "--json"]).stdout) == row
    unknown = CliRunner().invoke(cli, ["experiment", "show", "nsp-vs-spo"])
    assert unknown.exit_code == 1 and "unknown experiment 'nsp-vs-spo'" in unknown.stderr
    assert "Did you mean 'nsp-vs-sop'" in unknown.stderr


SMALL = ["--steps", "2", "--batch-size", "4", "--seq-len", "48", "--eval-size", "8",
         "--head-fit-size", "16"]


@pytest.mark.parametrize("extra", [["--pretrain", "mlm,sop,wwm", "--weights", "mlm=1,sop=0.5,wwm=0.25",
                                    "--spectrum", "2"],
                                   ["--pretrain", "clm,contrastive", "--schedule", "adaptive"]], ids=["weights", "adaptive"])
def test_analyze_report_fits_80_columns(terminal, environment, extra):
    code, out, err = terminal(["analyze", *extra, *SMALL], 80, environment)
    assert code == 0, err
    assert not wide_lines(out), wide_lines(out)
    assert out.splitlines()[0].startswith("objreg analyze  device=cpu, 1 thread (OMP_NUM_THREADS)")
    assert "What to run next" in out
    if "adaptive" in extra:
        assert "schedule=adaptive:quadratic" in out


@pytest.mark.parametrize("name", ["mlm", "ul2", "qa", "token_classification"])
def test_show_fits_80_columns(terminal, environment, name):
    code, out, err = terminal(["show", name], 80, environment)
    assert code == 0, err
    assert not wide_lines(out), wide_lines(out)
    assert "Parameters" in out


def test_corrupt_fits_80_columns_its_grid_cut_to_the_terminal(terminal, environment):
    text = ("The committee approved the budget for the new library after a long debate. Members argued about the "
            "roof, the windows and the reading rooms until late in the evening.")
    code, out, err = terminal(["corrupt", "mlm", "--text", text], 80, environment)
    assert code == 0, err
    assert not wide_lines(out), wide_lines(out)
    assert "Attention mask of row 0 (first 31 of" in out  # (80 - 17) // 2 positions
