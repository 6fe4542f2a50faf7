"""Errors in the caller's words: ``objreg.analyze`` and ``AnalysisConfig`` called from Python name
keyword arguments; the command line names its flags."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

import objreg
from objreg.analysis.run.naming import as_keywords, command_line, option
from objreg.cli import make_cli


@pytest.mark.parametrize(("flagged", "keywords"), [
    ("--seq-len 64 is too short for 't5'", "seq_len=64 is too short for 't5'"),
    ("pass --downstream-data with a SQuAD v1.1/v2.0 JSON file", "pass downstream_data= with a SQuAD v1.1/v2.0 JSON file"),
    ("lower --batch-size, --seq-len or --spectrum", "lower batch_size=, seq_len= or spectrum="),
    ("--out 'runs/a' exists", "out_dir='runs/a' exists"),
    ("e.g. --pretrain mlm,sop", "e.g. pretrain=mlm,sop"),
    ("use --device cpu", "use device=cpu"),
    ("an objective's --param", "an objective's objective_params="),
    ("use --nproc-per-node 2 (one process per GPU)", "use --nproc-per-node 2 (one process per GPU)"),  # torchrun's
    ("a value -- like this --", "a value -- like this --"),
])
def test_flags_of_settings_become_keyword_arguments(flagged, keywords):
    assert as_keywords(flagged) == keywords


def test_option_names_a_setting_as_its_caller_does():
    assert option("head_fit_size") == "head_fit_size="
    assert option("out_dir") == "out_dir="
    with command_line():
        assert option("head_fit_size") == "--head-fit-size" and option("out_dir") == "--out"


def test_python_callers_get_keyword_arguments_in_errors():
    with pytest.raises(objreg.InvalidParameterError) as config_error:
        objreg.AnalysisConfig(pretrain=())
    assert "pretrain=mlm,sop" in str(config_error.value) and "--" not in str(config_error.value)
    with pytest.raises(objreg.InvalidParameterError) as run_error:
        objreg.analyze("mlm", "qa", batch_size=4096, seq_len=4096)
    message = str(run_error.value)
    assert "batch_size=4096" in message and "seq_len=4096" in message and "--" not in message


def test_the_command_line_keeps_its_flags():
    result = CliRunner().invoke(make_cli(lambda: objreg.get_plugin_manager(load_entrypoints=False)),
                                ["analyze", "--pretrain", "mlm", "--batch-size", "4096", "--seq-len", "4096"])
    assert result.exit_code == 1
    assert "--batch-size 4096" in result.stderr and "--seq-len 4096" in result.stderr
    assert "batch_size=" not in result.stderr
