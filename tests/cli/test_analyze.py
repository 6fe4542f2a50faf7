"""``objreg analyze`` through the CLI: the JSON report, the terminal summary, and bad input."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import torch
from click.testing import CliRunner

import objreg
from objreg.cli import make_cli

SMALL = ["--steps", "2", "--batch-size", "4", "--seq-len", "48", "--eval-size", "8",
         "--head-fit-size", "16"]


@pytest.fixture
def run():
    cli = make_cli(lambda: objreg.get_plugin_manager(load_entrypoints=False))

    def invoke(*args: str):
        return CliRunner().invoke(cli, ["analyze", *args], catch_exceptions=False)

    return invoke


def test_json_report_is_the_only_thing_on_stdout(run):
    result = run("--pretrain", "mlm,sop", "--downstream", "qa", *SMALL, "--weights", "mlm=1,sop=0.5", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["pretrain"] == ["mlm", "sop"] and report["downstream"] == "qa"
    assert report["config"]["shared_parameters"] > 0
    assert report["config"]["weights"] == {"mlm": 1.0, "sop": 0.5}
    assert [s["weights"] for s in report["steps"]] == [{"mlm": 1.0, "sop": 0.5}] * 2
    assert set(report["summary"]["alignment"]) == {"mlm", "sop"}


def test_objective_parameters_reach_the_objective(run):
    result = run("--pretrain", "mlm", *SMALL, "--param", "mlm.mask_prob=0.3", "--json")
    assert json.loads(result.stdout)["config"]["objective_params"]["mlm"]["mask_prob"] == 0.3


def test_terminal_summary(run, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")  # as the README's test runs the main job: no wrapped table rows
    result = run("--pretrain", "clm,mlm", *SMALL, "--out", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    for text in ("clm", "mlm", "cosine", "downstream loss D", "predicted (first + second)", "counterfactual:",
                 "Second-order interaction", "Taylor prediction", "Update split: sgd",
                 "Pre-training examples that helped the downstream task most", "What this run tells",
                 "What it cannot tell", "What to run next"):
        assert text in result.stdout
    # The alignment table's rows start with the objectives' names.
    rows = {line.split()[0] for line in result.stdout.splitlines() if line.startswith(("clm ", "mlm "))}
    assert rows == {"clm", "mlm"}
    for name in ("report.json", "report.csv", "steps.jsonl", "config.json", "alignment.png", "taylor.png"):
        assert (tmp_path / "out" / name).is_file()


@pytest.mark.e2e
def test_schedule_spectrum_and_optimizer_reach_the_report(run):
    result = run("--pretrain", "mlm,sop", *SMALL, "--schedule", "mlm=step:1", "--spectrum", "1", "--steps", "1",
                 "--optimizer", "adamw", "--lr", "1e-4", "--attribution-top", "2", "--hvp-method", "double_backward",
                 "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["config"]["schedule"]["mlm"] == "step:1:1:0"
    assert [len(s["eigenvalues"]) for s in report["summary"]["spectrum"]] == [1]
    assert report["config"]["hvp_method"] == "double_backward"
    assert report["summary"]["update_rule"].startswith("adamw")
    assert len(report["summary"]["attribution"]["helpful"]) <= 2


@pytest.mark.parametrize(
    "args, message",
    [
        (["--pretrain", "mlm,nosuch"], "unknown objective 'nosuch'"),
        (["--pretrain", ","], "no pre-training objective"),
        (["--pretrain", "mlm", "--downstream", "qaa"], "unknown downstream task 'qaa'. Did you mean 'qa'"),
        (["--pretrain", "mlm", "--steps", "0"], "steps must be a positive integer"),
        (["--pretrain", "mlm", "--batch-size", "-2"], "batch_size must be a positive integer"),
        (["--pretrain", "mlm", "--lr", "nan"], "lr must be a positive finite number"),
        (["--pretrain", "mlm", "--lr", "0"], "lr must be a positive finite number"),
        (["--pretrain", "mlm,sop", "--weights", "mlm=abc"], "weight for 'mlm' must be a number"),
        (["--pretrain", "mlm", "--weights", "sop=1"], "'sop', which is not a selected objective"),
        (["--pretrain", "mlm", "--param", "mlm.nosuch=1"], "unknown parameter of 'mlm' 'nosuch'"),
        (["--pretrain", "mlm", "--param", "mask_prob=1"], "malformed --param"),
        (["--pretrain", "mlm", "--optimizer", "lamb"], "optimizer must be one of"),
        (["--pretrain", "mlm", "--corpus", "missing/corpus.txt"], "does not exist"),
        (["--pretrain", "mlm", "--model", "nosuch"], "unknown model 'nosuch'"),
        (["--pretrain", "mlm", "--schedule", "mlm=warmup:3"], "unknown schedule shape 'warmup'"),
        (["--pretrain", "mlm", "--schedule", "sop=cosine"], "schedule given for 'sop', which is not a selected"),
        (["--pretrain", "mlm", "--spectrum", "-1"], "spectrum must be an integer ≥ 0"),
        (["--pretrain", "mlm", "--head-warmup-steps", "5"], "--head-warmup-steps 5 warms up a frozen head; the "
         "re-fitted head (--downstream-head refit, the default) is solved exactly at every probe and takes no "
         "warm-up: leave out --head-warmup-steps, or add --downstream-head frozen"),
        (["--pretrain", "mlm", "--hvp-method", "fd"], "hvp_method must be one of"),
        (["--resume", "run", "--steps", "3", "--pretrain", "mlm"],
         "--resume takes every setting from the run's config.json; drop --steps, --pretrain"),
    ],
)
def test_bad_input_is_one_line_and_exit_1(run, args, message):
    result = run(*args)
    assert result.exit_code == 1
    assert_one_error_line(result.stderr, message)
    assert "Traceback" not in result.output


def assert_one_error_line(stderr: str, message: str) -> None:
    """The error is one line, the last; before it at most the plain progress lines of the stages
    that ran (``[0:00:01] loading corpus ...``: stderr is no terminal here)."""
    *progress, last = stderr.strip().splitlines()
    assert last.startswith("Error: ") and message in last, stderr
    assert all(re.match(r"\[\d+:\d\d:\d\d\] ", line) for line in progress), stderr


@pytest.mark.e2e
def test_unknown_objective_in_a_real_process_names_the_alternatives():
    done = subprocess.run(
        [sys.executable, "-m", "objreg", "analyze", "--pretrain", "mlm,nosuch", "--downstream", "qa"],
        capture_output=True, text=True, timeout=1800,  # bounds a hang only
    )
    assert done.returncode == 1 and done.stdout == ""
    assert "Traceback" not in done.stderr
    line, = done.stderr.strip().splitlines()
    assert "nosuch" in line and all(f" {name}," in line or f" {name}." in line for name in ("clm", "mlm", "sop"))


def test_bad_files_and_settings_are_one_line_and_exit_1(run, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    one_sentence = tmp_path / "short.txt"
    one_sentence.write_text("".join(f"Only one sentence in document {i} here.\n\n" for i in range(40)))
    malformed = tmp_path / "bad.json"
    malformed.write_text('{"data": [')
    wrong_shape = tmp_path / "shape.json"
    wrong_shape.write_text('{"data": [{"title": "x"}]}')
    cases = [
        (["--pretrain", "mlm", "--corpus", str(empty)], "is empty"),
        (["--pretrain", "sop", "--corpus", str(one_sentence)], "sop"),
        (["--pretrain", "mlm", "--downstream-data", str(malformed)], "not valid JSON"),
        (["--pretrain", "mlm", "--downstream-data", str(wrong_shape)], "has no 'paragraphs' key"),
        (["--pretrain", "mlm", "--model", str(tmp_path / "no" / "model/")], "does not exist"),
        (["--pretrain", "mlm", "--seq-len", "4"], "seq_len must be at least"),
        (["--pretrain", "mlm", "--char-noise", "2"], "char_noise must be a rate"),
        (["--pretrain", "mlm", "--param", "mlm.mask_prob=2"], "must lie in"),
    ]
    if not torch.cuda.is_available():
        cases.append((["--pretrain", "mlm", "--device", "cuda"], "CUDA is not available"))
    for args, message in cases:
        result = run(*args, "--steps", "1", "--eval-size", "4", "--head-fit-size", "8")
        assert result.exit_code == 1, (args, result.output)
        assert_one_error_line(result.stderr, message)
        assert "Traceback" not in result.output


def test_a_run_outside_the_taylor_regime_gets_a_one_line_warning(run):
    import io

    from rich.console import Console

    from objreg.cli.analyze import _render

    report = json.loads(run("--pretrain", "mlm", *SMALL, "--json").stdout)
    regime = report["summary"]["taylor_regime"]

    def rendered(inside):
        out = io.StringIO()
        report["summary"]["taylor_regime"] = {**regime, "inside": inside, "steps_outside": [] if inside else [0]}
        _render(report, Console(file=out, width=200))
        return [line for line in out.getvalue().splitlines() if line.startswith("warning:")]

    assert rendered(True) == []
    (line,) = rendered(False)
    assert line.startswith("warning: outside the Taylor regime at 1 of 2 probed steps")


def test_the_terminal_says_what_the_counterfactual_is_and_whether_adaptive_weights_oscillated(run):
    import io

    from rich.console import Console

    from objreg.cli.analyze import _render

    report = json.loads(run("--pretrain", "mlm,sop", *SMALL, "--json").stdout)
    alignment = report["summary"]["alignment"]["mlm"]
    assert alignment["predicted_contribution"] == pytest.approx(
        alignment["first_order_contribution"] + alignment["second_order_share"])
    # The objectives' shares add up to the run's prediction (to float32 rounding: the parts' first-order
    # terms against the step read off the parameters).
    shares = sum(a["predicted_contribution"] for a in report["summary"]["alignment"].values())
    assert shares == pytest.approx(report["summary"]["predicted_improvement"], rel=1e-4)
    report["summary"]["adaptive"] = {"rule": "quadratic", "predicted_improvement": 0.1,
                                     "best_constant_predicted_improvement": 0.2, "beat_best_constant": False,
                                     "warning": "the weights oscillated (mlm reversed 3 of 4 moves): ..."}
    out = io.StringIO()
    _render(report, Console(file=out, width=200))
    text = out.getvalue()
    assert "pred. 1st+2nd" in text and "pred.: the improvement of D (+: D fell)" in text
    assert f"{alignment['predicted_contribution']:+.4g}" in text
    # The error quoted under the counterfactual is the benchmark's, named as such, not this run's.
    assert "a local estimate: not measured on this run; in the benchmark (" in text
    assert report["summary"]["counterfactual"]["scope"]["measured_in"] in text
    assert "adaptive:quadratic: predicted improvement 0.1 against 0.2 for the best constant weights (did not" in text
    assert "warning: the weights oscillated (mlm reversed 3 of 4 moves)" in text


@pytest.mark.e2e
def test_the_adam_counterfactual_best_weights_realise_their_predicted_gain(run):
    # One Adam step of the default job: re-running it with the counterfactual's best weights
    # realises the gain over the weights used that the report predicted, to within 20%.
    job = ["--pretrain", "mlm,sop", "--downstream", "qa", "--optimizer", "adam", "--lr", "1e-4", "--steps", "1",
           "--head-fit-size", "64"]  # a smaller fit set than the default keeps the re-fitted D* cheap here
    result = run(*job, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    best = report["summary"]["counterfactual"]["best"]
    assert best["weights"] != {"mlm": 1.0, "sop": 1.0} and best["gain_over_used"] > 0
    weights = ",".join(f"{name}={value!r}" for name, value in best["weights"].items())
    again = run(*job, "--weights", weights, "--json")
    assert again.exit_code == 0, again.output
    rerun = json.loads(again.stdout)
    realised = report["steps"][0]["actual_delta"] - rerun["steps"][0]["actual_delta"]
    assert realised == pytest.approx(best["gain_over_used"], rel=0.2), (realised, best)

