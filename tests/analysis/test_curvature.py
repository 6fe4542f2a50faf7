"""Hessian-vector products against central finite differences of the gradient."""

from __future__ import annotations

import pytest
import torch

import objreg
from objreg.analysis import curvature


def gradient(fn, shared):
    params = {n: t.clone().requires_grad_(True) for n, t in shared.items()}
    return dict(zip(params, torch.autograd.grad(fn.mean(params), list(params.values()))))


def test_hvp_equals_central_differences_of_the_gradient(build, direction):
    fn, shared = build("mlm")
    v = direction(shared)
    eps = 1e-5
    plus = gradient(fn, {n: t + eps * v[n] for n, t in shared.items()})
    minus = gradient(fn, {n: t - eps * v[n] for n, t in shared.items()})
    product, method = curvature.hvp(fn.mean, shared, v)
    assert method == "forward_over_reverse"
    worst = max(float((product[n] - (plus[n] - minus[n]) / (2 * eps)).abs().max()) for n in shared)
    scale = max(float(product[n].abs().max()) for n in shared)
    assert worst / scale <= 1e-4


def test_forward_over_reverse_equals_double_backward(build, direction):
    fn, shared = build("sop")
    v = direction(shared)
    a = curvature.hvp_forward_over_reverse(fn.mean, shared, v)
    b = curvature.hvp_double_backward(fn.mean, shared, v)
    for n in shared:
        assert torch.allclose(a[n], b[n], rtol=1e-8, atol=1e-12)


def test_hvp_falls_back_without_forward_mode(build, direction, monkeypatch):
    fn, shared = build("clm")
    v = direction(shared)

    def no_forward_mode(*args):
        raise NotImplementedError("Trying to use forward AD with an operator that does not support it")

    monkeypatch.setattr(curvature, "hvp_forward_over_reverse", no_forward_mode)
    product, method = curvature.hvp(fn.mean, shared, v)
    assert method == "double_backward"
    u = direction(shared, seed=2)
    # A Hessian is symmetric: uᵀ(Hv) = vᵀ(Hu).
    other, _ = curvature.hvp(fn.mean, shared, u)
    left = sum((u[n] * product[n]).sum() for n in shared)
    right = sum((v[n] * other[n]).sum() for n in shared)
    assert torch.allclose(left, right, rtol=1e-8)


def test_hvp_without_any_second_derivative_is_one_clear_error(build, direction):
    fn, shared = build("clm", attention="sdpa")
    with pytest.raises(objreg.InvalidParameterError, match="attention='math'"):
        curvature.hvp(fn.mean, shared, direction(shared))
