"""The top of the downstream Hessian's spectrum, by Lanczos on Hessian-vector products.

``scipy.sparse.linalg.eigsh`` (ARPACK's implicitly restarted Lanczos) runs on a
``LinearOperator`` whose matvec flattens a float64 numpy vector into the shared-parameter dict,
takes one HVP in the model's dtype and device, and flattens the product back. ``which="LA"``
asks for the largest *algebraic* eigenvalues: the Hessian may be indefinite, and ``"LM"`` could
return large negative ones. The starting vector is seeded, so the same run gives the same
eigenpairs. The operator must be deterministic, which is why probes run with ``model.eval()``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping

import numpy as np
import torch

from objreg.analysis.math.functional import Params
from objreg.core.errors import InvalidParameterError

#: Relative accuracy asked of each eigenvalue: three significant digits are what a report shows.
DEFAULT_TOL = 1e-3


def flatten(params: Params) -> np.ndarray:
    """One float64 vector of all tensors, in the dict's order."""
    return torch.cat([t.detach().reshape(-1) for t in params.values()]).to("cpu", torch.float64).numpy()


def unflatten(vector: np.ndarray, like: Params) -> Params:
    """The inverse of :func:`flatten`, in the dtype and on the device of ``like``."""
    out, start = {}, 0
    for name, t in like.items():
        stop = start + t.numel()
        out[name] = torch.from_numpy(np.ascontiguousarray(vector[start:stop])).to(t.device, t.dtype).reshape(t.shape)
        start = stop
    return out


def top_eigenpairs(
    hvp: Callable[[Params], Params], like: Params, k: int, *, tol: float = DEFAULT_TOL, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, int]:
    """The ``k`` largest eigenvalues (descending) of the Hessian behind ``hvp``, their unit
    eigenvectors as the columns of a ``[P, k]`` array, and the number of HVPs taken.

    Raises:
        InvalidParameterError: ``k`` is not between 1 and the parameter count − 1.
    """
    from scipy.sparse.linalg import ArpackNoConvergence, LinearOperator, eigsh  # only when a spectrum is asked for

    size = sum(t.numel() for t in like.values())
    if not 1 <= k < size:
        raise InvalidParameterError(f"spectrum size must be between 1 and {size - 1} (the parameter count − 1), got {k}")
    calls = 0

    def matvec(vector: np.ndarray) -> np.ndarray:
        nonlocal calls
        calls += 1
        return flatten(hvp(unflatten(np.asarray(vector, dtype=np.float64).reshape(-1), like)))

    operator = LinearOperator((size, size), matvec=matvec, dtype=np.float64)
    start = np.random.default_rng(seed).standard_normal(size)
    try:
        values, vectors = eigsh(operator, k=k, which="LA", tol=tol, v0=start, ncv=min(size, max(2 * k + 1, 20)))
    except ArpackNoConvergence as error:
        warnings.warn(f"Lanczos found {len(error.eigenvalues)} of {k} eigenvalues before its iteration limit",
                      stacklevel=2)
        values, vectors = error.eigenvalues, error.eigenvectors
    order = np.argsort(values)[::-1]
    return values[order], vectors[:, order], calls


def orient(vectors: np.ndarray, reference: Params) -> np.ndarray:
    """The eigenvectors with signs flipped so each has a non-negative dot with ``reference`` (an
    eigenvector's sign is arbitrary; fixing it against ∇D makes signs comparable across steps)."""
    signs = np.where(flatten(reference) @ vectors < 0, -1.0, 1.0)
    return vectors * signs


def eigenvector_alignment(vectors: np.ndarray, directions: Mapping[str, Params]) -> dict[str, list[float]]:
    """``cos(direction, v_j)`` for each direction and each eigenvector ``v_j``."""
    result = {}
    for name, direction in directions.items():
        flat = flatten(direction)
        norm = float(np.linalg.norm(flat))
        result[name] = [float(flat @ vectors[:, j]) / norm if norm > 0 else 0.0 for j in range(vectors.shape[1])]
    return result
