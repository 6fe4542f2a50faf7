"""The pure Taylor-term helpers: Gram matrices, pair splits, relative error."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from objreg.analysis.transfer import asymmetry, gram, quadratic_by_pair, relative_error, upper_pairs, weighted_sum


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
