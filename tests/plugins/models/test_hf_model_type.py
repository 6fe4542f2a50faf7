"""A model directory whose config.json names a model type this transformers does not know is one
line naming it (not transformers' three sentences); a known type still opens."""

from __future__ import annotations

import json

import pytest

import objreg

pytest.importorskip("transformers")
from objreg.plugins.models import hf  # noqa: E402


@pytest.mark.parametrize("model_type", ["objreg-nosuch", "bert2", "Bert", "", 7])
def test_an_unknown_model_type_is_one_line(tmp_path, model_type):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
    with pytest.raises(objreg.DataError, match=f"config.json's model_type {model_type!r} is not one transformers") as e:
        hf._open_directory(str(tmp_path), {})
    assert "\n" not in str(e.value)


def test_a_config_without_a_model_type_is_one_line(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(objreg.DataError, match="config.json names no model_type") as e:
        hf._open_directory(str(tmp_path), {})
    assert "\n" not in str(e.value)


def test_a_known_model_type_opens(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 8, "num_attention_heads": 2,
                                                      "num_hidden_layers": 1, "intermediate_size": 8,
                                                      "vocab_size": 20}))
    _, _, config, kind, kwargs = hf._open_directory(str(tmp_path), {})
    assert config.model_type == "bert" and kind == "encoder" and kwargs["add_pooling_layer"] is False
