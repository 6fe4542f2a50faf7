"""``make_probe``: the one way to create a probe; its ``mode`` chooses what it measures and how.

- ``full``: everything ``objreg analyze`` measures at a step (per-example dots, ``S`` by
  Hessian-vector products, the step's split, the Taylor check):
  :class:`~.transfer_probe.TransferProbe`.
- ``in_run``: every example's ``⟨∇ℓ_i, ∇D⟩`` from the loop's own backward, ``∇D`` refreshed every
  few steps: :class:`~.in_run.InRunAlignment`.
- ``sharded``: the full probe's records of a model sharded with FSDP2, each process passing its
  own rows: :class:`~.sharded.ShardedProbe`.
- ``first_order``: the step's first-order predicted drop ``−∇D·Δθ`` at the cost of one gradient
  of ``D`` (``objreg screen``'s): :class:`~.first_order.FirstOrderProbe`.

The arguments every mode shares keep one name and meaning (``eval_batches``, ``fit_batches``,
``refit_head``, ``shared``, ``weights``); what only some modes take is refused, by name, in
the others, so an argument never does nothing unsaid. The classes stay importable under their own
names; :func:`make_probe` is what the docs show (docs/probe.md, "One front door").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from objreg.analysis.probe.first_order import FirstOrderProbe
from objreg.analysis.probe.in_run import InRunAlignment
from objreg.analysis.probe.settings import ProbeSettings
from objreg.analysis.probe.sharded import ShardedProbe
from objreg.analysis.probe.transfer_probe import TransferProbe
from objreg.core.errors import InvalidParameterError

MODES = ("full", "in_run", "sharded", "first_order")

#: What each mode takes beyond the shared arguments (its class's keyword arguments of those names).
MODE_OPTIONS = {
    "full": ("steps", "batch_coupled", "whole_batches", "decode"),
    "in_run": ("refresh_every", "per_example"),
    "sharded": ("steps", "batch_coupled", "decode"),
    "first_order": ("second_order",),
}

AnyProbe = TransferProbe | InRunAlignment | ShardedProbe | FirstOrderProbe


def make_probe(
    model: nn.Module,
    downstream: Any,
    *,
    mode: str = "full",
    objectives: Mapping[str, Any] | None = None,
    optimizer: Any = None,
    eval_batches: Any = None,
    weights: Mapping[str, float] | None = None,
    shared: Any = None,
    refit_head: Any = None,
    fit_batches: Any = None,
    settings: ProbeSettings | None = None,
    **options: Any,
) -> AnyProbe:
    """Create a probe of ``model``'s training against ``downstream``.

    Args:
        model: The trained module (a ``DistributedDataParallel`` wrapper is unwrapped; for
            ``sharded``, the ``fully_shard``-ed model).
        downstream: ``fn(model, batch) -> [B]``, the downstream per-example loss, or an objreg ``Task``.
        mode: ``full``, ``in_run``, ``sharded`` or ``first_order`` (module docstring).
        objectives: Name → per-example loss ``fn(model, batch) -> [B]`` (or an objreg
            ``Objective``). ``full`` and ``sharded`` need them; ``in_run`` takes none (the loop
            names each objective's losses with ``probe.losses(name, losses)``), nor does
            ``first_order`` (it reads the step off the parameters).
        optimizer: The loop's optimizer. ``full`` and ``sharded`` need it; ``in_run`` takes it
            in ``probe.attach(optimizer)``, if at all; ``first_order`` takes none.
        eval_batches: The fixed evaluation set defining ``D`` (one batch or a list).
        weights: The loop's objective weights ``α_k`` (``full``, ``sharded``; default 1).
        shared: The parameters measured on (default: every trainable parameter both ``D`` and
            some objective reach).
        refit_head, fit_batches: Re-fit the downstream head at every probed point (``D*``)
            on ``fit_batches`` (every mode; ``sharded``: the sharded model's module or names).
        settings: How the probe computes (:class:`~objreg.analysis.probe.settings.ProbeSettings`;
            ``full`` and ``sharded``: the other modes take none).
        **options: What only this mode takes (:data:`MODE_OPTIONS`): ``full``: ``steps``,
            ``batch_coupled``, ``whole_batches``, ``decode``; ``sharded``: the same but
            ``whole_batches`` (each process passes its own rows); ``in_run``: ``refresh_every``,
            ``per_example``; ``first_order``: ``second_order``.

    Returns:
        The probe: a :class:`~.transfer_probe.TransferProbe`, :class:`~.in_run.InRunAlignment`,
        :class:`~.sharded.ShardedProbe` or :class:`~.first_order.FirstOrderProbe`; its ``mode``
        attribute names the mode.

    Raises:
        InvalidParameterError: an unknown mode, or an argument the mode does not take or needs
            (the message names it and what the mode takes).
    """
    if mode not in MODES:
        raise InvalidParameterError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    unknown = sorted(set(options) - set(MODE_OPTIONS[mode]))
    if unknown:
        takes = ", ".join(MODE_OPTIONS[mode]) or "no options of its own"
        raise InvalidParameterError(f"mode {mode} does not take {', '.join(unknown)} (it takes {takes})")
    if settings is not None and not isinstance(settings, ProbeSettings):
        raise InvalidParameterError(f"settings must be an objreg.ProbeSettings, got {type(settings).__name__}")
    given = {"objectives": objectives, "optimizer": optimizer, "weights": weights, "shared": shared,
             "refit_head": refit_head, "fit_batches": fit_batches}
    if mode in ("full", "sharded"):  # ShardedProbe runs a TransferProbe on the gathered model
        _require(mode, objectives=objectives, optimizer=optimizer)
        probe_class = TransferProbe if mode == "full" else ShardedProbe
        return probe_class(model, objectives, downstream, optimizer, eval_batches=eval_batches, weights=weights,
                           shared=shared, refit_head=refit_head, fit_batches=fit_batches,
                           **(settings or ProbeSettings()).as_arguments(), **options)
    _refuse_settings(mode, settings)
    if mode == "in_run":
        _refuse(mode, given, ("objectives", "optimizer", "weights"),
                "the loop names each objective's losses with probe.losses(name, losses), and "
                "probe.attach(optimizer) takes the optimizer")
        return InRunAlignment(model, downstream, eval_batches=eval_batches, shared=shared,
                              refit_head=refit_head, fit_batches=fit_batches, **options)
    _refuse(mode, given, ("objectives", "optimizer", "weights"),
            "it reads the step the loop took off the parameters, before and after optimizer.step()")
    return FirstOrderProbe(model, downstream, eval_batches=eval_batches, shared=shared, refit_head=refit_head,
                               fit_batches=fit_batches, **options)


def _require(mode: str, **needed: Any) -> None:
    missing = [name for name, value in needed.items() if value is None]
    if missing:
        raise InvalidParameterError(f"mode {mode} needs {' and '.join(missing)}")


def _refuse(mode: str, given: Mapping[str, Any], names: tuple[str, ...], why: str) -> None:
    present = [name for name in names if given[name] is not None]
    if present:
        raise InvalidParameterError(f"mode {mode} does not take {', '.join(present)}: {why}")


def _refuse_settings(mode: str, settings: ProbeSettings | None) -> None:
    changed = settings.changed() if settings is not None else {}
    if changed:
        raise InvalidParameterError(f"mode {mode} takes no probe settings (they set how the full and sharded probes "
                                    f"compute), got {', '.join(sorted(changed))}")
