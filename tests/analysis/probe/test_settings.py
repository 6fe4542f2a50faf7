"""``ProbeSettings``: every value out of its range is one error naming it and what is allowed,
wherever it enters (the settings object, ``TransferProbe``'s keywords, ``analyze``'s config)."""

from __future__ import annotations

import math

import probe_stand_ins as stand_ins
import pytest
import torch
from probe_stand_ins import EVAL, LOSSES, WEIGHTS, task_loss

import objreg
from objreg.analysis.probe.settings import ProbeSettings
from objreg.core.errors import InvalidParameterError

BAD = [
    ({"per_sample_method": "fast"}, "per_sample_method must be one of"),
    ({"hvp_method": "finite_differences"}, "hvp_method must be one of auto"),
    ({"eval_dtype": torch.int64}, "eval_dtype must be a floating torch.dtype or None, got torch.int64"),
    ({"seed": -1}, "seed must be an integer ≥ 0, got -1"),
    ({"seed": True}, "seed must be an integer ≥ 0, got True"),
    ({"spectrum": -3}, "spectrum must be an integer ≥ 0"),
    ({"spectrum": 1.5}, "spectrum must be an integer ≥ 0"),
    ({"counterfactual_radius": 0.0}, "counterfactual_radius must be a finite number > 0"),
    ({"counterfactual_radius": -1.0}, "counterfactual_radius must be a finite number > 0"),
    ({"counterfactual_radius": math.nan}, "counterfactual_radius must be a finite number > 0"),
    ({"counterfactual_radius": math.inf}, "counterfactual_radius must be a finite number > 0"),
    ({"counterfactual_radius": True}, "counterfactual_radius must be a finite number > 0"),
    ({"strict": "yes"}, "strict must be True or False, got 'yes'"),
]


@pytest.mark.parametrize("value, message", BAD, ids=[f"{next(iter(v))}={next(iter(v.values()))!r}" for v, _ in BAD])
def test_a_value_out_of_range_is_refused_by_name(value, message):
    with pytest.raises(InvalidParameterError, match=message.replace("(", r"\(")):
        ProbeSettings(**value)


@pytest.mark.parametrize("value, message", BAD[3:8], ids=[next(iter(v)) for v, _ in BAD[3:8]])
def test_the_transfer_probe_checks_its_keywords_through_the_settings(value, message):
    model, opt = stand_ins.make("sgd")
    with pytest.raises(InvalidParameterError, match=message):
        objreg.TransferProbe(model, LOSSES, task_loss, opt, eval_batches=EVAL, weights=WEIGHTS, **value)


def test_two_problems_are_named_in_one_error():
    with pytest.raises(InvalidParameterError) as raised:
        ProbeSettings(seed=-1, spectrum=-1)
    assert "seed must be" in str(raised.value) and "spectrum must be" in str(raised.value)


def test_changed_names_only_what_differs_from_the_defaults():
    assert ProbeSettings().changed() == {}
    assert ProbeSettings(seed=4, eval_dtype=None, strict=True).changed() == {"seed": 4, "eval_dtype": None,
                                                                            "strict": True}


def test_the_transfer_probe_keeps_its_keywords_as_its_settings():
    model, opt = stand_ins.make("sgd")
    probe = objreg.TransferProbe(model, LOSSES, task_loss, opt, eval_batches=EVAL, weights=WEIGHTS, seed=5,
                                 hvp_method="double_backward", eval_dtype=torch.float32)
    assert probe.settings == ProbeSettings(seed=5, hvp_method="double_backward", eval_dtype=torch.float32)
    assert probe.settings.as_arguments()["seed"] == 5


def test_analyze_probes_with_its_configs_settings():
    config = objreg.AnalysisConfig(pretrain=("mlm", "sop"), seed=7, spectrum=2, trust_radius=0.4,
                                   hvp_method="double_backward", per_sample_method="loop")
    assert config.probe_settings() == ProbeSettings(seed=7, spectrum=2, counterfactual_radius=0.4,
                                                    hvp_method="double_backward", per_sample_method="loop")
