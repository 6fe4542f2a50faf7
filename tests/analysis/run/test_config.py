from __future__ import annotations

import pytest

import objreg
from objreg.analysis.run.config import FROZEN_WARMUP_STEPS, AnalysisConfig, parse_weights
from objreg.core.errors import InvalidParameterError


def test_weights_default_to_one_and_parse_from_text():
    assert parse_weights(None, ["mlm", "sop"]) == {"mlm": 1.0, "sop": 1.0}
    assert parse_weights("mlm=2, sop=0.5", ["mlm", "sop"]) == {"mlm": 2.0, "sop": 0.5}
    assert AnalysisConfig(pretrain=("mlm",), weights="mlm=3").weights == {"mlm": 3.0}


@pytest.mark.parametrize(
    "weights, message",
    [
        ("mlm=abc", "weight for 'mlm' must be a number"),
        ("mlm", "malformed weight 'mlm'"),
        ("=1", "malformed weight"),
        ("nsp=1", "'nsp', which is not a selected objective"),
        ("mlm=-1", "finite and ≥ 0"),
        ("mlm=inf", "finite and ≥ 0"),
        ("mlm=0,sop=0", "all objective weights are zero"),
    ],
)
def test_bad_weights(weights, message):
    with pytest.raises(objreg.InvalidParameterError, match=message):
        parse_weights(weights, ["mlm", "sop"])


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("steps", 0, "steps must be a positive integer"),
        ("steps", -3, "steps must be a positive integer"),
        ("batch_size", 0, "batch_size must be a positive integer"),
        ("lr", 0.0, "lr must be a positive finite number"),
        ("lr", float("nan"), "lr must be a positive finite number"),
        ("lr", float("inf"), "lr must be a positive finite number"),
        ("lr", -1e-3, "lr must be a positive finite number"),
        ("optimizer", "lamb", "optimizer must be one of sgd, adam, adamw"),
        ("dtype", "float16", "dtype must be one of float32, float64"),
        ("seq_len", 4, "seq_len must be at least 8"),
        ("head_warmup_steps", -1, "head_warmup_steps must be an integer ≥ 0"),
        ("objective_params", {"clm": {}}, "parameters given for objectives not selected: clm"),
    ],
)
def test_bad_settings(field, value, message):
    with pytest.raises(objreg.InvalidParameterError, match=message):
        AnalysisConfig(pretrain=("mlm", "sop"), **{field: value})


def test_empty_or_repeated_pretrain():
    with pytest.raises(objreg.InvalidParameterError, match="no pre-training objective"):
        AnalysisConfig(pretrain=())
    with pytest.raises(objreg.InvalidParameterError, match="repeat"):
        AnalysisConfig(pretrain=("mlm", "mlm"))


def test_devices():
    assert AnalysisConfig(pretrain=("mlm",), device="cpu").resolved_device().type == "cpu"
    with pytest.raises(objreg.InvalidParameterError, match="auto, cpu or cuda"):
        AnalysisConfig(pretrain=("mlm",), device="tpu").resolved_device()


def test_cuda_without_cuda_is_a_device_error(monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    with pytest.raises(objreg.DeviceError, match="CUDA is not available"):
        AnalysisConfig(pretrain=("mlm",), device="cuda").resolved_device()


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("spectrum", -1, "spectrum must be an integer ≥ 0"),
        ("spectrum", 1.5, "spectrum must be an integer ≥ 0"),
        ("attribution_top", -2, "attribution_top must be an integer ≥ 0"),
        ("hvp_method", "magic", "hvp_method must be one of auto, forward_over_reverse, double_backward"),
        ("schedule", "mlm=warmup", "unknown schedule shape 'warmup'"),
    ],
)
def test_bad_analysis_settings(field, value, message):
    with pytest.raises(objreg.InvalidParameterError, match=message):
        AnalysisConfig(pretrain=("mlm", "sop"), **{field: value})


def test_a_warm_up_is_a_frozen_heads_alone():
    frozen = AnalysisConfig(pretrain=("mlm",), downstream_head="frozen")
    assert frozen.head_warmup_steps == FROZEN_WARMUP_STEPS
    assert AnalysisConfig(pretrain=("mlm",)).head_warmup_steps == 0
    assert AnalysisConfig(pretrain=("mlm",), head_warmup_steps=0).head_warmup_steps == 0
    with pytest.raises(InvalidParameterError, match=r"head_warmup_steps=5 warms up a frozen head.*"
                                                    r"leave out head_warmup_steps=, or add downstream_head=frozen"):
        AnalysisConfig(pretrain=("mlm",), head_warmup_steps=5)

