"""The warning when the downstream head has learnt its fit examples rather than the task: on the
losses alone, and in a run whose head is fitted long on a handful of examples."""

from __future__ import annotations

import warnings

import pytest
from click.testing import CliRunner

import objreg
from objreg.analysis.run.overfit import overfit_warning
from objreg.cli import make_cli

NAMES = {"head_fit_size": "head_fit_size=", "head_warmup_steps": "head_warmup_steps="}


@pytest.mark.parametrize(("fitted", "downstream", "warns"), [
    (0.013, 3.35, True),  # the binary task
    (1.0, 2.5, True),
    (2.82, 2.76, False),  # the default job: the fit set's loss above D
    (0.2, 0.5, False),  # 2.5 times, but only 0.3 apart
    (1.0, 1.9, False),  # 0.9 apart, but under twice
])
def test_it_warns_when_d_is_far_above_the_fit_loss(fitted, downstream, warns):
    message = overfit_warning({"loss_after": fitted, "examples": 8}, downstream, NAMES)
    assert (message is not None) == warns
    if warns:
        assert f"loss {fitted:.4g}" in message and f"D = {downstream:.4g}" in message
        assert "head_fit_size=" in message and "head_warmup_steps=" in message


def test_no_fitted_head_no_warning():
    assert overfit_warning({"loss_after": None, "examples": 0}, 9.0, NAMES) is None
    # A re-fitted head has no warm-up steps to cut: only more examples help.
    refit = overfit_warning({"loss_after": 0.5, "examples": 8}, 3.0, NAMES, refit=True)
    assert NAMES["head_fit_size"] in refit and NAMES["head_warmup_steps"] not in refit
    assert overfit_warning({}, 9.0, NAMES) is None


TINY_FIT = dict(steps=1, batch_size=2, seq_len=48, eval_size=16, head_fit_size=4, head_warmup_steps=400,
                downstream_head="frozen")


def test_a_head_fitted_long_on_four_examples_warns_in_python_and_on_the_command_line():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = objreg.analyze("mlm", "qa", **TINY_FIT)
    fitted, d = report.config["head_warmup"]["loss_after"], report.steps[0]["downstream_loss"]
    assert d >= 2 * fitted and d - fitted >= 0.5  # the head did overfit: the warning is due
    (warning,) = [w for w in caught if "memorising head" in str(w.message)]
    assert "head_fit_size=" in str(warning.message) and "--head" not in str(warning.message)
    cli = make_cli(lambda: objreg.get_plugin_manager(load_entrypoints=False))
    args = [f"--{k.replace('_', '-')}={v}" for k, v in TINY_FIT.items()]
    shown = CliRunner().invoke(cli, ["analyze", "--pretrain", "mlm", *args], catch_exceptions=False)
    assert shown.exit_code == 0
    (line,) = [line for line in shown.stderr.splitlines() if "memorising head" in line]
    assert line.startswith("Warning: the downstream head fits its 4 fit examples") and "--head-fit-size" in line
    # The report says it too, under what it cannot tell (not on stderr alone).
    cannot = shown.stdout[shown.stdout.index("What it cannot tell"):shown.stdout.index("What to run next")]
    assert "memorising head" in " ".join(cannot.split()) and "--head-fit-size" in cannot


def test_the_report_names_a_memorising_head_only_where_the_run_warned():
    from objreg.cli.assessment import assess

    report = objreg.analyze("mlm", "qa", **{**TINY_FIT, "head_warmup_steps": 0}).to_dict()
    cannot = dict(assess(report))["What it cannot tell"]
    assert not any("memorising" in line for line in cannot)
