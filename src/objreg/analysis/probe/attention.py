"""Attention the probe can differentiate.

The probe takes forward-mode derivatives (``jvp``), second derivatives (Hessian-vector products)
and ``vmap``s of the model. PyTorch's fused attention kernels (``scaled_dot_product_attention``'s
flash and memory-efficient kernels, on the CPU too) have none of them, but its math kernel is
plain matrix products and a softmax, which have all. So the probe runs the model with the math
kernel alone (:func:`derivable_attention`): a Hugging Face model with its default attention
(``attn_implementation="sdpa"``) is measured as it is, with the same numbers as its eager
attention. Attention implementations outside PyTorch (flash-attention 2/3, flex attention,
kernels from the Hub) cannot be switched so and are refused when the probe is made
(:func:`check_attention`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from objreg.core.errors import InvalidParameterError

#: ``attn_implementation`` values the probe differentiates: eager attention, and SDPA through its math kernel.
DERIVABLE = ("eager", "sdpa")


@contextmanager
def derivable_attention() -> Iterator[None]:
    """``scaled_dot_product_attention`` through its math kernel only, while the probe runs."""
    with sdpa_kernel(SDPBackend.MATH):
        yield


def check_attention(model: nn.Module) -> None:
    """Refuse, in one line, a model (or a submodule) configured with an attention implementation
    the probe cannot differentiate."""
    for module in model.modules():
        implementation = getattr(getattr(module, "config", None), "_attn_implementation", None)
        if isinstance(implementation, str) and implementation not in DERIVABLE:
            name = type(module).__name__
            raise InvalidParameterError(
                f"{name} uses attn_implementation={implementation!r}, which has no forward-mode or second "
                f"derivatives for the probe; load it with attn_implementation=\"eager\" (or the default \"sdpa\", "
                f"which the probe runs through its math kernel)"
            )
