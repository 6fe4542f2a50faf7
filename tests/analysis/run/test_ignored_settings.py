"""A setting a run would silently ignore is refused before any work, in the caller's words:
``checkpoint_every`` without a run directory."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

import objreg
from objreg.cli import make_cli

SMALL = {"steps": 2, "batch_size": 2, "seq_len": 32, "eval_size": 4}


@pytest.mark.parametrize("settings, message", [
    ({"checkpoint_every": 5}, "checkpoint_every= is for a run with out_dir=DIR"),
    ({"checkpoint_every": 2}, "checkpoint_every= is for a run with out_dir=DIR"),
    ({"checkpoint_every": 5, "out_dir": None}, "checkpoint_every= is for a run with out_dir=DIR"),
])
def test_a_setting_the_run_would_ignore_is_refused_in_keywords(settings, message):
    stages = []
    with pytest.raises(objreg.InvalidParameterError, match=message) as error:
        objreg.analyze(["mlm"], "qa", on_status=stages.append, **SMALL, **settings)
    assert stages == [] and "--" not in str(error.value)


@pytest.mark.parametrize("args, message", [
    (["--checkpoint-every", "3"], "--checkpoint-every is for a run with --out DIR"),
    (["--checkpoint-every", "2", "--json"], "--checkpoint-every is for a run with --out DIR"),
])
def test_the_command_line_refuses_them_naming_its_flags(args, message):
    cli = make_cli(lambda: objreg.get_plugin_manager(load_entrypoints=False))
    result = CliRunner().invoke(cli, ["analyze", "--pretrain", "mlm", "--steps", "2", *args])
    assert result.exit_code == 1 and message in result.stderr
    assert "loading corpus" not in result.stderr and "Traceback" not in result.stderr


def test_checkpoint_every_with_a_run_directory_is_taken(tmp_path):
    report = objreg.analyze(["mlm"], "qa", out_dir=tmp_path / "run", checkpoint_every=2, **SMALL)
    assert len(report.steps) == 2 and (tmp_path / "run" / "report.json").is_file()
