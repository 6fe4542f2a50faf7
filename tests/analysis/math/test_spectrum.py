"""Lanczos (scipy eigsh on HVPs) against the eigenvalues of a dense Hessian of a tiny model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import objreg
from objreg.analysis.math.curvature import Curvature
from objreg.analysis.math.spectrum import eigenvector_alignment, flatten, orient, top_eigenpairs, unflatten

#: A few hundred of the tiny model's parameters, so the dense Hessian stays small.
SUBSET = ("backbone.blocks.1.attention.out.weight", "backbone.blocks.1.norm2.weight", "backbone.blocks.1.norm2.bias",
          "backbone.blocks.1.mlp.down.bias", "backbone.final_norm.weight", "backbone.final_norm.bias")


@pytest.fixture
def problem(build):
    fn, shared = build("mlm")
    subset = {n: shared[n] for n in SUBSET}
    return fn, subset


def dense_hessian(fn, subset):
    """The dense Hessian by reverse-over-reverse autograd, one row per parameter. (Not
    ``torch.func.hessian``: on torch 2.13 its vmapped second derivative of ``layer_norm``'s weight
    is wrong, off by 5e-4 here and asymmetric; finite differences agree with this one to 1e-12.)"""

    def flat_loss(vector):
        return fn.mean(_split(vector, subset))

    vector = torch.cat([t.reshape(-1) for t in subset.values()])
    return torch.autograd.functional.hessian(flat_loss, vector).detach().numpy()


def _split(vector, like):
    out, start = {}, 0
    for name, t in like.items():
        out[name] = vector[start:start + t.numel()].reshape(t.shape)
        start += t.numel()
    return out


def test_flatten_round_trip(problem):
    _, subset = problem
    back = unflatten(flatten(subset), subset)
    assert all(torch.equal(back[n], subset[n]) and back[n].dtype == subset[n].dtype for n in subset)


def test_top_eigenvalues_match_the_dense_hessian(problem):
    fn, subset = problem
    dense = dense_hessian(fn, subset)
    assert np.allclose(dense, dense.T, rtol=0, atol=1e-10 * np.abs(dense).max())
    expected = np.sort(np.linalg.eigvalsh(dense))[::-1][:3]
    curvature = Curvature([fn], subset)
    values, vectors, calls = top_eigenpairs(curvature.matvec, subset, 3, tol=1e-10)
    assert np.allclose(values, expected, rtol=1e-8, atol=1e-10 * abs(expected[0]))
    assert calls == curvature.matvecs > 3
    # Each returned vector is a unit eigenvector of the dense Hessian.
    for j in range(3):
        v = vectors[:, j]
        assert np.linalg.norm(v) == pytest.approx(1.0, rel=1e-9)
        assert np.allclose(dense @ v, values[j] * v, atol=1e-6 * abs(expected[0]))


def test_largest_algebraic_not_largest_magnitude(problem):
    # "LA" must return the top of the spectrum even where a negative eigenvalue is larger in size.
    fn, subset = problem
    shift = 10.0 * float(np.abs(np.linalg.eigvalsh(dense_hessian(fn, subset))).max())
    curvature = Curvature([fn], subset)

    def shifted(v):  # H − shift·I: every eigenvalue negative, the smallest huge
        product = curvature.matvec(v)
        return {n: product[n] - shift * v[n] for n in v}

    values, _, _ = top_eigenpairs(shifted, subset, 1, tol=1e-10)
    top = np.linalg.eigvalsh(dense_hessian(fn, subset)).max()
    assert values[0] == pytest.approx(top - shift, rel=1e-8)


def test_alignment_and_orientation(problem):
    fn, subset = problem
    values, vectors, _ = top_eigenpairs(Curvature([fn], subset).matvec, subset, 2, tol=1e-10)
    first = unflatten(vectors[:, 0], subset)
    flipped = orient(vectors, {n: -t for n, t in first.items()})
    assert np.allclose(flipped[:, 0], -vectors[:, 0])
    cosines = eigenvector_alignment(vectors, {"v1": first, "scaled": {n: 3 * t for n, t in first.items()}})
    assert cosines["v1"][0] == pytest.approx(1.0, rel=1e-9) and abs(cosines["v1"][1]) < 1e-8
    assert cosines["scaled"] == pytest.approx(cosines["v1"], abs=1e-12)


def test_spectrum_size_is_checked(problem):
    fn, subset = problem
    size = sum(t.numel() for t in subset.values())
    for k in (0, size):
        with pytest.raises(objreg.InvalidParameterError, match="spectrum size must be between 1 and"):
            top_eigenpairs(Curvature([fn], subset).matvec, subset, k)
