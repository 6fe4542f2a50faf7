"""Hessian-vector products of a scalar loss of the shared parameters.

Forward-over-reverse (``jvp`` of ``grad``) needs no second graph and is the default; the
double-backward fallback serves models without forward-mode derivatives.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.func import grad, jvp

from objreg.analysis.functional import Params, requiring_grad
from objreg.analysis.per_sample import derivative_unsupported
from objreg.core.errors import InvalidParameterError


def hvp_forward_over_reverse(loss: Callable[[Params], torch.Tensor], shared: Params, direction: Params) -> Params:
    _, product = jvp(grad(loss), (shared,), (direction,))
    return product


def hvp_double_backward(loss: Callable[[Params], torch.Tensor], shared: Params, direction: Params) -> Params:
    params = requiring_grad(shared)
    grads = torch.autograd.grad(loss(params), list(params.values()), create_graph=True)
    projected = sum((g * direction[n]).sum() for g, n in zip(grads, params))
    products = torch.autograd.grad(projected, list(params.values()), allow_unused=True)
    return {n: torch.zeros_like(t) if h is None else h for (n, t), h in zip(params.items(), products)}


def hvp(loss: Callable[[Params], torch.Tensor], shared: Params, direction: Params) -> tuple[Params, str]:
    """``H v`` for the Hessian ``H`` of ``loss`` at ``shared``, and the method used.

    Raises:
        InvalidParameterError: the model has neither derivative an exact HVP needs.
    """
    try:
        return hvp_forward_over_reverse(loss, shared, direction), "forward_over_reverse"
    except (NotImplementedError, RuntimeError) as error:
        if not derivative_unsupported(error):
            raise
    try:
        return hvp_double_backward(loss, shared, direction), "double_backward"
    except (NotImplementedError, RuntimeError) as error:
        if not derivative_unsupported(error):
            raise
        raise InvalidParameterError(
            f"Hessian-vector products need forward-mode or double-backward derivatives, and this model has "
            f"neither ({str(error).splitlines()[0]}); use the math attention path (config attention='math')"
        ) from None
