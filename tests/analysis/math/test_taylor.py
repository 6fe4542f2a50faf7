"""The pure Taylor-term helpers: Gram matrices, pair splits, relative error."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from objreg.analysis.math.taylor import (
    asymmetry,
    gram,
    quadratic_by_pair,
    relative_error,
    rounding_floor,
    taylor_errors,
    upper_pairs,
    weighted_sum,
)


def test_gram_is_the_matrix_of_flat_dot_products():
    a = {"x": torch.tensor([1.0, 2.0]), "y": torch.tensor([[3.0]])}
    b = {"x": torch.tensor([0.5, -1.0]), "y": torch.tensor([[2.0]])}
    assert np.array_equal(gram([a, b], [b]), np.array([[0.5 - 2 + 6], [0.25 + 1 + 4]]))


def test_pairs_split_the_quadratic_form():
    m = np.array([[2.0, 1.0, 0.0], [3.0, -4.0, 1.0], [0.0, 1.0, 6.0]])
    names = ["a", "b", "c"]
    assert upper_pairs(names, m) == {"a,a": 2.0, "a,b": 2.0, "a,c": 0.0, "b,b": -4.0, "b,c": 1.0, "c,c": 6.0}
    pairs = quadratic_by_pair(names, m)
    assert pairs == {"a,a": 1.0, "a,b": 2.0, "a,c": 0.0, "b,b": -2.0, "b,c": 1.0, "c,c": 3.0}
    assert sum(pairs.values()) == pytest.approx(0.5 * m.sum())
    assert asymmetry(m) == pytest.approx(2.0 / 6.0)
    assert asymmetry(np.zeros((2, 2))) == 0.0


def test_relative_error_and_sum():
    assert relative_error(1.1, 1.0) == pytest.approx(0.1) and relative_error(-0.9, -1.0) == pytest.approx(0.1)
    assert relative_error(0.5, 0.0) is None
    like = {"x": torch.zeros(2)}
    total = weighted_sum({"p": {"x": torch.tensor([1.0, 2.0])}, "q": {"x": torch.tensor([3.0, -1.0])}}, like)
    assert torch.equal(total["x"], torch.tensor([4.0, 1.0]))
    assert torch.equal(weighted_sum({}, like)["x"], torch.zeros(2))


def test_taylor_errors_and_the_regime():
    # first −1.0, second +0.1, actual −0.92: errors 0.08 and 0.02, the second-order term helps.
    inside = taylor_errors(-1.0, 0.1, -0.92, floor=1e-12)
    assert inside["error"] == pytest.approx({"first_order": 0.08, "first_plus_second_order": 0.02})
    assert inside["scaled_error"] == pytest.approx({"first_order": 0.08, "first_plus_second_order": 0.02})
    assert inside["second_to_first"] == pytest.approx(0.1) and inside["remainder_ratio"] == pytest.approx(0.25)
    assert inside["second_order_helps"] and inside["inside_regime"]
    # The second-order term overshoots: worse than first order alone, and not negligible.
    outside = taylor_errors(-1.0, 0.5, -0.9, floor=1e-12)
    assert not outside["second_order_helps"] and not outside["inside_regime"]
    # It helps, leaving a third of the first-order error: inside; leaving 60% of it: the third-order
    # remainder is as large as the term that corrected it, outside.
    converging = taylor_errors(-1.0, 0.1, -0.85, floor=1e-12)
    assert converging["remainder_ratio"] == pytest.approx(0.05 / 0.15) and converging["inside_regime"]
    barely = taylor_errors(-1.0, 0.1, -0.75, floor=1e-12)
    assert barely["second_order_helps"] and barely["remainder_ratio"] == pytest.approx(0.6)
    assert not barely["inside_regime"]
    # Worse, but both errors within 1% of the first-order term: negligible, inside.
    tiny = taylor_errors(-1.0, 0.004, -0.999, floor=1e-12)
    assert not tiny["second_order_helps"] and tiny["inside_regime"]
    # Errors at the rounding floor say nothing about the regime.
    rounding = taylor_errors(-1e-9, 1e-10, -1.01e-9, floor=1e-10)
    assert rounding["inside_regime"]
    # A vanishing actual change leaves the scaled errors finite (the old relative error blew up).
    small = taylor_errors(-0.01, 0.002, 1e-9, floor=1e-15)
    assert small["scaled_error"]["first_order"] == pytest.approx(1.0, rel=1e-6)
    assert relative_error(-0.01, 1e-9) > 1e6
    zero = taylor_errors(0.0, 0.0, 0.0, floor=0.0)
    assert zero["scaled_error"] == {"first_order": None, "first_plus_second_order": None}
    assert zero["remainder_ratio"] is None and zero["inside_regime"]


def test_the_rounding_floor():
    # u_D (|D_t| + |D_t+1|) + u ‖∇D‖ ‖Δθ‖
    assert rounding_floor(3.0, 2.5, 1e-16, 2.0, 0.5, 1e-8) == pytest.approx(5.5e-16 + 1e-8)
