"""A probe's hooks on the optimizer's step: the steps it takes counted (:func:`step_counter`),
and an attached probe's methods run around each step (:func:`optimizer_hooks`). Both hold the
probe through a weak reference, so a probe its user dropped is collected and its hooks removed.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable
from typing import Any

import torch


def optimizer_hooks(probe: Any, optimizer: torch.optim.Optimizer, pre: Callable[..., None] | None = None,
                    post: Callable[..., None] | None = None) -> list[Any]:
    """The optimizer's step hooks calling ``probe``'s methods ``pre`` and ``post`` through a weak
    reference: the hooks do not keep a probe alive that its user dropped, and they are removed
    when it is collected."""
    this = weakref.ref(probe)

    def calling(method: Callable[..., None]) -> Callable[..., None]:
        def hook(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            alive = this()
            if alive is not None:
                method(alive, optimizer, args, kwargs)
        return hook

    handles = ([optimizer.register_step_pre_hook(calling(pre))] if pre is not None else []) + \
        ([optimizer.register_step_post_hook(calling(post))] if post is not None else [])
    weakref.finalize(probe, _remove_all, list(handles))
    return handles


def _remove_all(handles: list[Any]) -> None:
    for handle in handles:
        handle.remove()


#: The code of torch's wrapper around every optimizer class's ``step`` (it runs the step hooks).
_STEP_WRAPPER = torch.optim.Optimizer.profile_hook_step(lambda *args, **kwargs: None).__code__


def step_counter(probe: weakref.ref) -> Callable[..., None]:
    """An optimizer step post-hook counting the steps for the probe (while it lives). A subclass's
    ``step`` that calls ``super().step()`` runs the hooks twice, once per wrapped ``step``: only the
    outermost call is a step, the one no other wrapper of this optimizer encloses."""

    def count(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        frame, calls = sys._getframe(1), 0
        while frame is not None:
            if frame.f_code is _STEP_WRAPPER and frame.f_locals.get("self") is optimizer:
                calls += 1
            frame = frame.f_back
        alive = probe()
        if alive is not None and calls <= 1:
            alive._steps_taken += 1
            alive._forward = None

    return count
