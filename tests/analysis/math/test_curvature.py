"""Hessian-vector products against central finite differences of the gradient."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import objreg
from objreg.analysis.math.curvature import Curvature, hvp_double_backward, hvp_forward_over_reverse
from objreg.analysis.math.taylor import asymmetry, gram


def gradient(fn, shared):
    params = {n: t.clone().requires_grad_(True) for n, t in shared.items()}
    return dict(zip(params, torch.autograd.grad(fn.mean(params), list(params.values()))))


@pytest.mark.parametrize("hvp", [hvp_forward_over_reverse, hvp_double_backward])
def test_hvp_equals_central_differences_of_the_gradient(build, direction, hvp):
    fn, shared = build("mlm")
    v = direction(shared)
    eps = 1e-5
    plus = gradient(fn, {n: t + eps * v[n] for n, t in shared.items()})
    minus = gradient(fn, {n: t - eps * v[n] for n, t in shared.items()})
    product = hvp(fn.mean, shared, v)
    worst = max(float((product[n] - (plus[n] - minus[n]) / (2 * eps)).abs().max()) for n in shared)
    scale = max(float(product[n].abs().max()) for n in shared)
    assert worst / scale <= 1e-4


def test_forward_over_reverse_equals_double_backward(build, direction):
    fn, shared = build("sop")
    v = direction(shared)
    a = hvp_forward_over_reverse(fn.mean, shared, v)
    b = hvp_double_backward(fn.mean, shared, v)
    for n in shared:
        assert torch.allclose(a[n], b[n], rtol=1e-8, atol=1e-12)


def test_double_backward_hvp_is_symmetric(build, direction):
    # A Hessian is symmetric: uᵀ(Hv) = vᵀ(Hu).
    fn, shared = build("clm")
    v, u = direction(shared), direction(shared, seed=2)
    product, other = hvp_double_backward(fn.mean, shared, v), hvp_double_backward(fn.mean, shared, u)
    left = sum((u[n] * product[n]).sum() for n in shared)
    right = sum((v[n] * other[n]).sum() for n in shared)
    assert torch.allclose(left, right, rtol=1e-8)


def test_hvp_without_any_second_derivative_is_one_clear_error(build, direction):
    fn, shared = build("clm", attention="sdpa")
    with pytest.raises(objreg.InvalidParameterError, match="attention='math'"):
        Curvature([fn], shared).matvec(direction(shared))


def flat_max(params):
    return max(float(t.abs().max()) for t in params.values())


@pytest.mark.parametrize("method", ["forward_over_reverse", "double_backward"])
def test_curvature_over_chunks_equals_the_whole_batch(build, direction, method):
    # Several directions at once (batched), over chunks of the set, against one HVP each of the mean.
    fn, shared = build("mlm")
    directions = [direction(shared, seed=s) for s in (1, 2, 3)]
    operator = Curvature(list(fn.chunks(2)), shared, method, max_directions=2)
    gradient_d, products = operator.gradient_and_products(directions)
    assert operator.method == method and operator.matvecs == 3
    expected_gradient = gradient(fn, shared)
    assert all(torch.allclose(gradient_d[n], expected_gradient[n], rtol=1e-9, atol=1e-13) for n in shared)
    for v, product in zip(directions, products):
        expected = hvp_forward_over_reverse(fn.mean, shared, v)
        scale = flat_max(expected)
        assert max(float((product[n] - expected[n]).abs().max()) for n in shared) <= 1e-10 * scale


def test_curvature_products_equal_central_differences(build, direction):
    fn, shared = build("sop")
    v = direction(shared, seed=4)
    eps = 1e-5
    plus = gradient(fn, {n: t + eps * v[n] for n, t in shared.items()})
    minus = gradient(fn, {n: t - eps * v[n] for n, t in shared.items()})
    _, (product,) = Curvature(list(fn.chunks(4)), shared).gradient_and_products([v])
    worst = max(float((product[n] - (plus[n] - minus[n]) / (2 * eps)).abs().max()) for n in shared)
    assert worst / flat_max(product) <= 1e-4


def test_interaction_matrix_is_symmetric(build, direction):
    # S_ij = g_iᵀ H g_j from k HVPs: computed both ways round, the two halves agree (float64).
    fn, shared = build("clm")
    gradients = [direction(shared, seed=s) for s in (5, 6, 7)]
    _, products = Curvature([fn], shared).gradient_and_products(gradients)
    s_matrix = gram(gradients, products)
    assert asymmetry(s_matrix) <= 1e-8
    assert np.abs(s_matrix).max() > 0


def test_curvature_falls_back_to_double_backward(build, direction, monkeypatch):
    fn, shared = build("mlm")
    v = direction(shared)
    reference = Curvature([fn], shared, "double_backward").matvec(v)

    def no_forward_mode(*args):
        raise NotImplementedError("Trying to use forward AD with an operator that does not support it")

    monkeypatch.setattr(Curvature, "_forward_over_reverse", no_forward_mode)
    operator = Curvature([fn], shared)
    product = operator.matvec(v)
    assert operator.method == "double_backward"
    assert all(torch.equal(product[n], reference[n]) for n in shared)


def test_curvature_method_is_checked(build):
    fn, shared = build("clm")
    with pytest.raises(objreg.InvalidParameterError, match="HVP method must be one of auto"):
        Curvature([fn], shared, "finite_differences")


@pytest.mark.parametrize("method", ["forward_over_reverse", "double_backward"])
def test_dots_over_chunks_are_the_dots_of_the_whole_sets_products(build, direction, method):
    """gradient_and_dots, each chunk's product dotted as it is made, against one float64 HVP of the
    whole set per direction dotted afterwards; a vector naming only some parameters dots only those,
    and the kept entries are the products'."""
    fn, shared = build("mlm")
    directions = [direction(shared, seed=s) for s in (1, 2, 3)]
    some = sorted(shared)[:2]
    partial = {n: direction(shared, seed=9)[n] for n in some}
    against = [[directions[0], directions[1]], [directions[2]], [partial, directions[0], directions[2]]]
    operator = Curvature(list(fn.chunks(2)), shared, method, max_directions=2)
    gradient_d, dots, kept = operator.gradient_and_dots(directions, against, keep=some)
    assert operator.method == method and operator.matvecs == 3 and dots.dtype == torch.float64
    expected_gradient = gradient(fn, shared)
    assert all(torch.allclose(gradient_d[n], expected_gradient[n], rtol=1e-9, atol=1e-13) for n in shared)
    for k, (v, vectors) in enumerate(zip(directions, against)):
        product = hvp_forward_over_reverse(fn.mean, shared, v)
        for j, a in enumerate(vectors):
            expected = float(sum((a[n] * product[n]).sum() for n in a))
            assert float(dots[k, j]) == pytest.approx(expected, rel=1e-10, abs=1e-14)
        assert sorted(kept[k]) == some
        assert all(torch.allclose(kept[k][n], product[n], rtol=1e-9, atol=1e-14) for n in some)
    assert float(dots[1, 1]) == 0.0  # direction 1 has one vector: the rest of its row stays 0
