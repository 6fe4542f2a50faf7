"""The data types that cross the plugin boundary: Param, ObjectiveInfo, Vocabulary, Corpus and
the tensor bundles."""

from __future__ import annotations

import json
import math

import pytest
import torch

import objreg
from objreg import (
    Corpus,
    CorruptedBatch,
    HeadSpec,
    InvalidParameterError,
    ObjectiveInfo,
    Param,
    TokenBatch,
    UnknownNameError,
    Vocabulary,
)

# -- Param.coerce ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [("true", True), ("True", True), (" YES ", True), ("1", True), ("false", False), ("no", False), ("0", False)],
)
def test_bool_from_string(text, expected):
    result = Param("flag", False, "h", bool).coerce(text)
    assert result is expected


def test_bool_rejects_other_strings():
    with pytest.raises(InvalidParameterError, match=r"owner: parameter 'flag' must be bool, got 'maybe'"):
        Param("flag", False, "h", bool).coerce("maybe", owner="owner")


@pytest.mark.parametrize("value", [0.5, 2])
def test_bool_rejects_non_boolean_numbers(value):
    with pytest.raises(InvalidParameterError):
        Param("flag", False, "h", bool).coerce(value)


def test_int_from_string_and_integral_float():
    p = Param("n", 1, "h", int)
    assert p.coerce("7") == 7 and type(p.coerce("7")) is int
    assert p.coerce(3.0) == 3 and type(p.coerce(3.0)) is int


@pytest.mark.parametrize("value", [1.5, "1.5", "seven", math.inf, math.nan, None])
def test_int_rejects_non_integers(value):
    with pytest.raises(InvalidParameterError, match="parameter 'n' must be int"):
        Param("n", 1, "h", int).coerce(value)


def test_float_from_string():
    result = Param("p", 0.1, "h", float).coerce("0.25")
    assert result == 0.25 and type(result) is float
    assert Param("p", 0.1, "h", float).coerce("1e-3") == pytest.approx(1e-3)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", math.inf, math.nan, "1e400"])
def test_float_rejects_non_finite(value):
    with pytest.raises(InvalidParameterError, match="must be finite"):
        Param("p", 0.1, "h", float).coerce(value)


def test_float_rejects_garbage():
    with pytest.raises(InvalidParameterError, match="must be float, got 'abc'"):
        Param("p", 0.1, "h", float).coerce("abc")


@pytest.mark.parametrize(("value", "ok"), [(0.0, True), (1.0, True), (0.5, True), (-0.01, False), (1.01, False)])
def test_bounds_inclusive(value, ok):
    p = Param("p", 0.1, "h", float, 0.0, 1.0)
    if ok:
        assert p.coerce(value) == value
    else:
        with pytest.raises(InvalidParameterError, match=r"must lie in \[0.0, 1.0\]"):
            p.coerce(value)


def test_one_sided_bounds():
    low_only = Param("n", 1, "h", int, low=1)
    assert low_only.coerce(10**9) == 10**9
    with pytest.raises(InvalidParameterError, match=r"\[1, None\]"):
        low_only.coerce(0)
    high_only = Param("x", 0.0, "h", float, high=2.0)
    assert high_only.coerce(-1e6) == -1e6
    with pytest.raises(InvalidParameterError):
        high_only.coerce("2.5")


def test_choices():
    p = Param("mode", "a", "h", str, choices=("a", "b"))
    assert p.coerce("b") == "b"
    with pytest.raises(InvalidParameterError, match="must be one of a, b, got 'c'"):
        p.coerce("c")
    numeric = Param("k", 2, "h", int, choices=(2, 4))
    assert numeric.coerce("4") == 4
    with pytest.raises(InvalidParameterError, match="one of 2, 4"):
        numeric.coerce("3")


def test_param_type_must_be_simple():
    with pytest.raises(InvalidParameterError, match="type must be one of"):
        Param("x", [], "h", list)


def test_errors_are_objreg_errors_and_value_errors():
    with pytest.raises(ValueError):
        Param("n", 1, "h", int).coerce("x")
    with pytest.raises(objreg.ObjregError):
        Param("n", 1, "h", int).coerce("x")


# -- ObjectiveInfo ------------------------------------------------------------------------------


def make_info(**kw) -> ObjectiveInfo:
    params = (
        Param("rate", 0.15, "h", float, 0.0, 1.0),
        Param("span", 3, "h", int, low=1),
        Param("flag", False, "h", bool),
    )
    return ObjectiveInfo(name="demo", description="d", params=params, heads=(HeadSpec("lm", "lm"),), **kw)


def test_resolve_params_defaults_and_overrides():
    info = make_info()
    assert dict(info.resolve_params()) == {"rate": 0.15, "span": 3, "flag": False}
    resolved = info.resolve_params({"rate": "0.3", "flag": "yes"})
    assert dict(resolved) == {"rate": 0.3, "span": 3, "flag": True}
    assert info.defaults() == {"rate": 0.15, "span": 3, "flag": False}  # defaults untouched


def test_resolve_params_unknown_name_lists_allowed():
    with pytest.raises(UnknownNameError) as e:
        make_info().resolve_params({"rte": 0.2})
    message = str(e.value)
    assert "unknown parameter of 'demo' 'rte'" in message
    assert "Did you mean 'rate'?" in message
    assert "Available: flag, rate, span." in message


def test_resolve_params_bad_value_names_objective():
    with pytest.raises(InvalidParameterError, match=r"^demo: parameter 'span' must lie in"):
        make_info().resolve_params({"span": 0})


def test_resolve_params_result_is_read_only():
    resolved = make_info().resolve_params({"span": 5})
    with pytest.raises(TypeError):
        resolved["span"] = 6  # type: ignore[index]
    assert resolved["span"] == 5


def test_duplicate_param_names_rejected():
    with pytest.raises(InvalidParameterError, match="duplicate parameter names"):
        ObjectiveInfo(name="x", description="d", params=(Param("a", 1, "h", int), Param("a", 2.0, "h")))


def test_bad_kind_rejected():
    with pytest.raises(InvalidParameterError, match="kind must be"):
        ObjectiveInfo(name="x", description="d", kind="finetune")  # type: ignore[arg-type]


def test_to_dict_is_json_serialisable():
    info = make_info(references=("Somebody 2020",))
    info2 = ObjectiveInfo(
        name="c", description="d", params=(Param("m", "a", "h", str, choices=("a", "b")),)
    )
    data = json.loads(json.dumps(info.to_dict()))
    assert data["name"] == "demo"
    assert data["heads"] == [{"name": "lm", "kind": "lm", "num_outputs": 0}]
    assert [p["type"] for p in data["params"]] == ["float", "int", "bool"]
    assert data["params"][0] == {
        "name": "rate", "default": 0.15, "help": "h", "type": "float", "low": 0.0, "high": 1.0, "choices": None,
    }
    assert json.loads(json.dumps(info2.to_dict()))["params"][0]["choices"] == ["a", "b"]
    # every built-in objective and task serialises too
    registry = objreg.Registry.load(load_entrypoints=False)
    for name in registry.objectives() + registry.tasks():
        assert json.loads(json.dumps(registry.info(name).to_dict()))["name"] == name


# -- Vocabulary ---------------------------------------------------------------------------------


def make_vocab(**kw) -> Vocabulary:
    args = dict(size=20, pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4, special_ids=(0, 1, 2, 3, 4, 9, 17))
    args.update(kw)
    return Vocabulary(**args)


@pytest.mark.parametrize("field", ["pad_id", "unk_id", "cls_id", "sep_id", "mask_id"])
@pytest.mark.parametrize("value", [-1, 20, 1000])
def test_vocabulary_core_ids_out_of_range(field, value):
    with pytest.raises(InvalidParameterError, match=rf"Vocabulary.{field}={value} is outside \[0, 20\)"):
        make_vocab(**{field: value})


@pytest.mark.parametrize(
    "kw", [{"special_ids": (0, 1, 2, 3, 4, 25)}, {"sentinel_ids": (21,)}, {"named_ids": {"[X]": 99}}]
)
def test_vocabulary_other_ids_out_of_range(kw):
    with pytest.raises(InvalidParameterError):
        make_vocab(**kw)


def test_normal_token_weights_zero_exactly_at_special_ids():
    vocab = make_vocab()
    weights = vocab.normal_token_weights()
    assert weights.shape == (20,)
    for i in range(20):
        assert weights[i].item() == (0.0 if i in vocab.special_ids else 1.0)
    assert torch.equal(vocab.special_id_tensor(), torch.tensor([0, 1, 2, 3, 4, 9, 17]))


def test_named_ids_read_only_and_copied():
    source = {"[NLU]": 7}
    vocab = make_vocab(named_ids=source)
    source["[NLU]"] = 8
    assert vocab.named_ids["[NLU]"] == 7
    with pytest.raises(TypeError):
        vocab.named_ids["[NLU]"] = 9  # type: ignore[index]
    with pytest.raises(AttributeError):
        vocab.size = 5  # type: ignore[misc]


def test_vocabulary_is_hashable():
    assert hash(make_vocab()) == hash(make_vocab())


# -- Corpus.split ----------------------------------------------------------------------------------


def test_corpus_split_every_tenth_held_out():
    docs = tuple((f"Document {i} first.", f"Document {i} second.") for i in range(37))
    corpus = Corpus("c", docs, "desc")
    train, heldout = corpus.split()
    assert heldout.documents == tuple(docs[i] for i in (9, 19, 29))
    assert train.documents == tuple(d for i, d in enumerate(docs) if i not in (9, 19, 29))
    assert set(train.documents).isdisjoint(heldout.documents)
    assert sorted(train.documents + heldout.documents) == sorted(docs)
    assert train.name == "c" and heldout.name == "c (held out)"
    assert train.num_sentences + heldout.num_sentences == corpus.num_sentences == 74
    assert corpus.split() == (train, heldout)  # deterministic


def test_corpus_split_other_period():
    docs = tuple((f"D{i}.",) for i in range(7))
    train, heldout = Corpus("c", docs).split(heldout_every=3)
    assert heldout.documents == (docs[2], docs[5])
    assert len(train.documents) == 5


# -- tensor bundles -----------------------------------------------------------------------------


def _distinct(shape, offset):
    return torch.arange(int(torch.tensor(shape).prod())).reshape(shape) + offset


def test_token_batch_select_slices_every_field():
    B, T = 5, 4
    batch = TokenBatch(*(_distinct((B, T), 100 * k) for k in range(7)))  # surprisal included
    assert TokenBatch(*batch[:6]).select(slice(1, 4)).surprisal is None
    for index in (torch.tensor([3, 0]), slice(1, 4)):
        picked = batch.select(index)
        assert isinstance(picked, TokenBatch)
        rows = list(range(B))[index] if isinstance(index, slice) else index.tolist()
        assert picked.batch_size == len(rows)
        for name, full, part in zip(TokenBatch._fields, batch, picked):
            assert torch.equal(part, torch.stack([full[r] for r in rows])), name


def test_corrupted_batch_select_slices_every_field_including_extras():
    B, T = 6, 3
    extras = {"order_label": torch.arange(B) * 10, "positions": _distinct((B, 2), 7), "w": torch.rand(B, 2, 2)}
    batch = CorruptedBatch(*(_distinct((B, T), 100 * k) for k in range(5)), extras)
    for index in (torch.tensor([5, 1, 1]), slice(2, 5)):
        picked = batch.select(index)
        assert isinstance(picked, CorruptedBatch)
        rows = list(range(B))[index] if isinstance(index, slice) else index.tolist()
        assert picked.batch_size == len(rows)
        for name, full, part in zip(CorruptedBatch._fields[:5], batch[:5], picked[:5]):
            assert torch.equal(part, torch.stack([full[r] for r in rows])), name
        assert set(picked.extras) == set(extras)
        for key, value in extras.items():
            assert torch.equal(picked.extras[key], torch.stack([value[r] for r in rows])), key
    # the original extras dict is untouched
    assert batch.extras["order_label"].shape == (B,)


def test_corrupted_batch_to_keeps_extras():
    batch = CorruptedBatch(*(torch.zeros(2, 3, dtype=torch.long) for _ in range(5)), {"x": torch.ones(2)})
    moved = batch.to("cpu")
    assert isinstance(moved, CorruptedBatch) and torch.equal(moved.extras["x"], torch.ones(2))
