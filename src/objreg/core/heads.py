"""How the host builds the declared heads on a backbone, with the head kinds plugins register,
and the initialisation every weight of objreg gets."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from objreg.core.errors import InvalidParameterError
from objreg.core.providers import HeadKind
from objreg.core.types import HeadSpec


def check_head_specs(specs: Sequence[HeadSpec], kinds: Mapping[str, HeadKind]) -> None:
    """Names unique, non-empty and free of ``.`` (they become parameter-name segments); kinds
    registered; sizes given where the kind needs one."""
    names = [spec.name for spec in specs]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise InvalidParameterError(f"head name(s) declared more than once: {', '.join(duplicates)}")
    for spec in specs:
        if not spec.name or "." in spec.name:
            raise InvalidParameterError(f"head name {spec.name!r} must be non-empty and contain no '.'")
        if spec.kind not in kinds:
            raise InvalidParameterError(
                f"head {spec.name!r} has unknown kind {spec.kind!r}; registered kinds: {', '.join(sorted(kinds))}"
            )
        if kinds[spec.kind].needs_outputs and spec.num_outputs < 1:
            raise InvalidParameterError(
                f"head {spec.name!r} of kind {spec.kind!r} needs num_outputs >= 1, got {spec.num_outputs}"
            )


def build_heads(
    specs: Sequence[HeadSpec], backbone: nn.Module, kinds: Mapping[str, HeadKind], generator: torch.Generator
) -> nn.ModuleDict:
    """The heads for ``specs`` on ``backbone``, keyed by name: built on the meta device (so layer
    constructors draw nothing from the global RNG), materialised where the backbone lives, tied
    to it (each head's ``tie(backbone)``), then initialised from ``generator`` except for the
    Parameters they share with the backbone."""
    check_head_specs(specs, kinds)
    reference = next(backbone.parameters())
    with torch.device("meta"):
        heads = nn.ModuleDict({spec.name: kinds[spec.kind].build(spec, backbone) for spec in specs})
    heads.to_empty(device=reference.device)
    heads.to(reference.dtype)
    for head in heads.values():
        if hasattr(head, "tie"):
            head.tie(backbone)
    init_weights(heads, generator, skip=backbone.parameters())
    return heads


@torch.no_grad()
def init_weights(module: nn.Module, generator: torch.Generator, skip: object = ()) -> None:
    """BERT's init from ``generator``: normal(0, 0.02) weights, zero biases, LayerNorm ones/zeros.

    Modules are visited in registration order and a shared Parameter only once; Parameters in
    ``skip`` (an iterable of Parameters) are left alone. So the draws depend on nothing but the
    architecture and the generator state.
    """
    seen: set[int] = {id(p) for p in skip}  # type: ignore[attr-defined]
    for sub in module.modules():
        for name, param in sub.named_parameters(recurse=False):
            if id(param) in seen:
                continue
            seen.add(id(param))
            if isinstance(sub, nn.LayerNorm):
                param.fill_(1.0 if name == "weight" else 0.0)
            elif name == "bias":
                param.zero_()
            else:
                param.normal_(0.0, 0.02, generator=generator)
