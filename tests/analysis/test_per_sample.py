"""Per-sample dots ⟨∇ℓ_i, v⟩: every fast path against a float64 per-example loop."""

from __future__ import annotations

import pytest
import torch

from objreg.analysis import per_sample
from objreg.analysis.functional import flat_dot


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("name", ["clm", "mlm", "sop"])
def test_jvp_dots_equal_the_float64_loop(build, direction, name):
    fn, shared = build(name)
    v = direction(shared)
    reference = per_sample.dots_loop(fn, shared, v)
    assert rel_err(per_sample.dots_jvp(fn, shared, v), reference) <= 1e-8
    assert rel_err(per_sample.dots_double_backward(fn, shared, v), reference) <= 1e-8
    assert rel_err(per_sample.dots_vmap(fn, shared, v), reference) <= 1e-8


def test_loop_reference_matches_finite_differences(build, direction):
    # The loop is the reference for the others; check it against a central difference of each ℓ_i.
    fn, shared = build("mlm")
    v = direction(shared)
    eps = 1e-6
    plus = fn({n: t + eps * v[n] for n, t in shared.items()})
    minus = fn({n: t - eps * v[n] for n, t in shared.items()})
    assert rel_err(per_sample.dots_loop(fn, shared, v), (plus - minus) / (2 * eps)) <= 1e-6


def test_mean_of_dots_is_the_batch_gradient_dot(build, direction):
    fn, shared = build("sop")
    v = direction(shared)
    params = {n: t.clone().requires_grad_(True) for n, t in shared.items()}
    grads = dict(zip(params, torch.autograd.grad(fn(params).mean(), list(params.values()))))
    dots, _ = per_sample.per_sample_dots(fn, shared, v)
    assert torch.allclose(dots.mean(), flat_dot(grads, v), rtol=1e-10)


def test_auto_falls_back_to_double_backward_without_forward_mode(build, direction, monkeypatch):
    fn, shared = build("mlm")
    v = direction(shared)
    reference = per_sample.dots_loop(fn, shared, v)

    def no_forward_mode(*args):
        raise NotImplementedError("Trying to use forward AD with an operator that does not support it")

    monkeypatch.setattr(per_sample, "dots_jvp", no_forward_mode)
    dots, method = per_sample.per_sample_dots(fn, shared, v)
    assert method == "double_backward"
    assert rel_err(dots, reference) <= 1e-8


def test_auto_falls_back_to_the_loop_on_fused_attention(build, direction):
    # The fused CPU SDPA kernel has neither forward mode nor double backward; auto must still
    # give the exact dots, equal to those of the same weights on the math attention path.
    fn, shared = build("mlm", attention="sdpa")
    math_fn, math_shared = build("mlm", attention="math")
    v = direction(shared)
    with pytest.raises((NotImplementedError, RuntimeError)):
        per_sample.dots_jvp(fn, shared, v)
    dots, method = per_sample.per_sample_dots(fn, shared, v)
    assert method == "loop"
    assert rel_err(dots, per_sample.dots_loop(math_fn, math_shared, v)) <= 1e-8


def test_a_real_error_is_not_swallowed_by_the_fallback(build, direction, monkeypatch):
    fn, shared = build("clm")

    def broken(*args):
        raise RuntimeError("shape mismatch: a bug, not a missing derivative")

    monkeypatch.setattr(per_sample, "dots_jvp", broken)
    with pytest.raises(RuntimeError, match="a bug"):
        per_sample.per_sample_dots(fn, shared, direction(shared))


def test_unknown_method_is_an_error(build, direction):
    fn, shared = build("clm")
    with pytest.raises(Exception, match="jvp, double_backward"):
        per_sample.per_sample_dots(fn, shared, direction(shared), method="magic")


def test_mean_gradient_over_chunks_equals_the_whole_batch(build):
    fn, shared = build("clm")
    params = {n: t.clone().requires_grad_(True) for n, t in shared.items()}
    expected = torch.autograd.grad(fn(params).mean(), list(params.values()))
    gradient, loss = per_sample.mean_gradient(list(fn.chunks(2)), shared)
    assert torch.allclose(loss, fn(shared).mean(), rtol=1e-12)
    for g, e in zip(gradient.values(), expected):
        assert torch.allclose(g, e, rtol=1e-9, atol=1e-14)
