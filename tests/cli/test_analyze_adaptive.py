"""``objreg analyze --schedule adaptive``: the weights follow the probes, the report holds the
counterfactual best weights."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import objreg
from objreg.analysis.run.adaptive import make_rule
from objreg.cli import make_cli

SMALL = ["--batch-size", "4", "--seq-len", "48", "--eval-size", "8",
         "--head-fit-size", "16"]


@pytest.mark.e2e
def test_adaptive_schedule_follows_the_probes_and_reports_the_counterfactual(tmp_path):
    cli = make_cli(lambda: objreg.get_plugin_manager(load_entrypoints=False))
    result = CliRunner().invoke(cli, ["analyze", "--pretrain", "mlm,sop", "--downstream", "qa", "--schedule",
                                      "adaptive", "--steps", "8", *SMALL, "--out", str(tmp_path / "run"), "--json"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    by_step = report["summary"]["weights_by_step"]
    assert len(by_step["mlm"]) == 8 and len(set(by_step["mlm"])) > 1
    # Each step's weights are what the rule makes of the probes before it (every step is probed).
    config = report["config"]
    rule = make_rule("quadratic", config["weights"], optimizer=config["optimizer"], lr=config["lr"],
                     radius=config["trust_radius"], smoothing=config["adaptive_smoothing"])
    expected = [dict(config["weights"])] + [rule.update(step) for step in report["steps"][:-1]]
    assert [{k: by_step[k][t] for k in by_step} for t in range(8)] == expected
    assert all(sum(w.values()) == pytest.approx(2.0) for w in expected)
    best = report["summary"]["counterfactual"]["best"]
    assert sum(best["weights"].values()) == pytest.approx(2.0)
    assert best["first_plus_second_order"] >= report["summary"]["counterfactual"]["constant_mean_weights"][
        "first_plus_second_order"]
    assert (tmp_path / "run" / "counterfactual.png").stat().st_size > 10_000
