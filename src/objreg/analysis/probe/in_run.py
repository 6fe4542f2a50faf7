"""``InRunAlignment``: first-order alignment at about the cost of the training step itself.

:class:`~objreg.analysis.probe.transfer_probe.TransferProbe` measures after the loop's backward,
with passes of its own: every objective's gradient, the per-example dots, ``∇D``, the HVPs. The
first-order alignment alone, every example's ``⟨∇ℓ_i, ∇D⟩``, needs none of them:

* the dots **ride the loop's own backward** (:class:`~objreg.analysis.math.riding.RidingDots`:
  forward hooks keep each layer's input, tensor hooks contract its output gradient with ``∇D``
  by ghost's closed-form rules), so they cost a share of one forward pass;
* ``∇D`` (one gradient of the downstream loss, as costly as a training step when the evaluation
  set is as large as the batch) is **computed every ``refresh_every`` steps** and reused in
  between. Its staleness is measured each time it is replaced: the cosine between the ``∇D``
  used and the fresh one, and how much the step's dots change between them (the step the
  refresh happens on rides both directions).

With ``refresh_every=1`` the dots are today's (:func:`~objreg.analysis.math.per_sample.per_sample_dots`
with a fresh ``∇D``), except that they are of the loop's own pass: in training mode (dropout
included) where the probe measures in ``eval()`` mode. ``D`` is whatever the downstream object
says: a frozen head's loss, or ``D*`` of a re-fitted head (its exact gradient, through the fit).
"""

from __future__ import annotations

import math
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from torch import nn

from objreg.analysis.math.downstream import Downstream
from objreg.analysis.math.functional import Params, flat_dot, flat_norm, named_shared
from objreg.analysis.math.riding import RidingDots, unseen_message
from objreg.analysis.math.stats import mean_ci95
from objreg.analysis.probe.arguments import (
    Quiet,
    build_downstream,
    downstream_reached,
    inner_optimizer,
    unwrapped_model,
    user_group,
)
from objreg.analysis.records import InRunRecord, RidingAlignment, Staleness
from objreg.core.errors import InvalidParameterError, ProbeStateError
from objreg.core.handles import Task

#: ``∇D`` is recomputed every this many steps unless told otherwise: the step it is refreshed on
#: costs far more than the steps between (docs/performance.md, "Probe cost", measures both).
DEFAULT_REFRESH_EVERY = 32


class InRunAlignment:
    """Every example's ``⟨∇ℓ_i, ∇D⟩`` from the training loop's own backward, ``∇D`` recomputed
    every ``refresh_every`` steps (module docstring; docs/probe.md, "In-run alignment").

    Args:
        model: The trained module (a ``DistributedDataParallel`` or ``torch.compile`` wrapper is
            unwrapped); the loop calls it as usual.
        downstream: ``fn(model, batch) -> [B]``, the downstream per-example loss, an objreg
            ``Task``, or a built :class:`~objreg.analysis.math.downstream.Downstream` (a
            re-fitted head's ``RefitDownstream`` too).
        eval_batches: The fixed evaluation set defining ``D`` (one batch or a list).
        refresh_every: Recompute ``∇D`` every this many steps (1: every step).
        shared: Names of the parameters measured on (default: every trainable parameter ``D``
            reaches, a re-fitted head's own parameters left out).
        refit_head, fit_batches: Re-fit the downstream head at every refresh (``D*``), as
            :class:`~objreg.analysis.probe.transfer_probe.TransferProbe` does.
        per_example: Linear layers form their weight gradients example by example inside the
            step and the dots come out of those (:mod:`~objreg.analysis.math.per_example_linear`):
            riding then costs little beyond the step, whose gradients differ from an unmeasured
            step's by rounding (so its trajectory is no longer bit-identical to one without).

    Use it around each step (``with alignment.step(): ...``) or :meth:`attach` it to the
    optimizer; in both, name each objective's per-example losses with :meth:`losses` after its
    forward pass and before the backward. :attr:`records` holds one record per step.
    """

    mode = "in_run"  # objreg.make_probe's name for it

    def __init__(
        self, model: nn.Module, downstream: Callable[[nn.Module, Any], torch.Tensor] | Task | Downstream, *,
        eval_batches: Any = None, refresh_every: int = DEFAULT_REFRESH_EVERY,
        shared: Sequence[str] | None = None, refit_head: nn.Module | Sequence[str] | None = None,
        fit_batches: Any = None, per_example: bool = False,
    ):
        model = unwrapped_model(model)
        if isinstance(refresh_every, bool) or not isinstance(refresh_every, int) or refresh_every < 1:
            raise InvalidParameterError(f"refresh_every must be a positive integer (steps between two ∇D), got "
                                        f"{refresh_every!r}")
        if not isinstance(per_example, bool):
            raise InvalidParameterError(f"per_example must be True or False, got {per_example!r}")
        self.model = model
        self.refresh_every = refresh_every
        self.per_example = per_example
        group = downstream.group if isinstance(downstream, Downstream) else user_group(model)
        self.downstream = build_downstream(model, downstream, eval_batches, group, None, refit_head,
                                           fit_batches)
        self.shared = downstream_reached(model, self.downstream, shared)
        # The default set is narrowed, at the first step, to what the loop's objectives reach
        # (a frozen downstream head's parameters, say, have D's gradient but no objective's).
        self._narrow = shared is None
        self.downstream.shared = self.shared
        _refuse_sequence_first(model, self.shared)
        self.records: list[InRunRecord] = []
        self.direction: Params | None = None  # ∇D in use
        self._direction_norm = 0.0  # its norm, taken once per refresh (a pass over every parameter)
        self.age = 0  # steps ∇D has served since it was computed
        self._stale: Params | None = None  # the ∇D just replaced (ridden once more, for its staleness)
        self._staleness: dict[str, float] | None = None
        self._riding: RidingDots | None = None
        self._handle: Any = None
        self._on_record: Callable[[InRunRecord], None] | None = None
        self._step = 0
        self._traced: set[str] = set()  # objectives whose dependence on the measured set was checked
        self._live: dict[str, Any] = {}  # the hooks in place, for the finaliser below
        weakref.finalize(self, _shut_hooks, self._live)
        self._warned_unmeasured = False

    # -- by hand ---------------------------------------------------------------------------------

    @contextmanager
    def step(self) -> Iterator[InRunAlignment]:
        """The block running one training step's forward and backward: ``∇D`` is refreshed at
        its start when due, and its record appended to :attr:`records` at its end."""
        if self._handle is not None:
            raise ProbeStateError("step() is for an alignment that is not attached: an attached one closes each "
                                  "step at optimizer.step()")
        if self._riding is not None:
            raise ProbeStateError("step() blocks do not nest: close the last step first")
        self._open()
        try:
            yield self
        except BaseException:
            self._shut()
            raise
        self._close()

    def losses(self, name: str, losses: torch.Tensor) -> torch.Tensor:
        """Name objective ``name``'s per-example losses ``[B]``, right after its forward pass (the
        module calls since the last named losses are its); returns ``losses``.

        Raises:
            ProbeStateError: outside a :meth:`step` block of an alignment that is not attached.
            InvalidParameterError: ``losses`` not a differentiable ``[B]`` tensor, or no measured
                module ran on those rows since the last named losses.
        """
        if self._riding is None:
            raise ProbeStateError("losses() marks a step's losses: inside `with alignment.step():`, or after "
                                  "attach()")
        if not isinstance(name, str) or not name:
            raise InvalidParameterError(f"an objective's name must be a non-empty string, got {name!r}")
        return self._riding.mark(name, losses)

    def refresh(self) -> None:
        """Recompute ``∇D`` now, at the model's parameters (the next step rides the fresh one and
        the one it replaces, whose staleness its record reports)."""
        values = {n: p.detach() for n, p in named_shared(self.model, self.shared).items()}
        riding = self._riding
        if riding is not None:
            riding.recording = False  # D's own passes are not the loop's
        try:
            with Quiet(self.model), torch.enable_grad():
                curvature = self.downstream.curvature(self.model, values, "forward_over_reverse")
                fresh, _ = curvature.gradient_and_products([])
        finally:
            if riding is not None:
                riding.recording = True
        fresh = {n: t.detach() for n, t in fresh.items()}
        old, age, norm_old = self.direction, self.age, self._direction_norm
        norm_new = float(flat_norm(fresh))
        self._staleness = None
        if old is not None:
            change = {n: fresh[n] - old[n] for n in fresh}
            self._staleness = {
                "age": age,
                "cosine": float(flat_dot(old, fresh)) / (norm_old * norm_new) if norm_old * norm_new > 0 else 0.0,
                "relative_change": float(flat_norm(change)) / norm_new if norm_new > 0 else 0.0,
            }
        self._stale, self.direction, self.age, self._direction_norm = old, fresh, 0, norm_new

    # -- attached to the optimizer ---------------------------------------------------------------

    def attach(self, optimizer: torch.optim.Optimizer, *, on_record: Callable[[InRunRecord], None] | None = None
               ) -> InRunAlignment:
        """Ride every step's backward until :meth:`detach`: each ``optimizer.step()`` closes the
        step's record (handed to ``on_record``) and refreshes ``∇D`` for the next step when due.
        The loop only names each objective's losses (:meth:`losses`). Returns the alignment.

        Raises:
            InvalidParameterError: ``optimizer`` is not an optimizer, or ``on_record`` not callable.
            ProbeStateError: already attached, or inside a :meth:`step` block.
        """
        optimizer = inner_optimizer(optimizer)
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise InvalidParameterError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if on_record is not None and not callable(on_record):
            raise InvalidParameterError(f"on_record must be callable, got {type(on_record).__name__}")
        if self._handle is not None or self._riding is not None:
            raise ProbeStateError("the alignment is already attached (or inside a step() block)")
        counting = self._live.pop("counting", None)
        if counting is not None:
            counting.remove()
        self._on_record = on_record
        self._open()
        this = weakref.ref(self)

        def after_step(*_: Any) -> None:
            alive = this()
            if alive is not None:
                alive._after_step()

        self._handle = optimizer.register_step_post_hook(after_step)
        self._live["handle"] = self._handle
        self._optimizer = optimizer
        return self

    def detach(self) -> None:
        """Stop riding (a step's marks not yet closed by ``optimizer.step()`` are dropped)."""
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
            # Steps taken while detached are counted, so records after a new attach() carry the
            # optimizer's step numbers.
            this = weakref.ref(self)

            def count(*_: Any) -> None:
                alive = this()
                if alive is not None:
                    alive._step += 1

            self._live["counting"] = self._optimizer.register_step_post_hook(count)
        self._live.pop("handle", None)
        self._shut()

    def _after_step(self) -> None:
        self._close()
        self._open()

    # -- internals -------------------------------------------------------------------------------

    def _open(self) -> None:
        if self.direction is None or self.age >= self.refresh_every:
            self.refresh()
        directions = [self.direction] + ([self._stale] if self._stale is not None else [])
        # The first step also records where each owner's calls sit in the autograd graph, to find
        # a parameter used outside them (a tied weight multiplied by hand, say).
        self._riding = RidingDots(self.model, directions, per_example=self.per_example,
                                  traced=self._traced, spans=not self._traced).__enter__()
        # The riding hooks sit on the model's modules: they go when the alignment is dropped.
        self._live["riding"] = self._riding

    def _shut(self) -> None:
        riding, self._riding = self._riding, None
        self._live.pop("riding", None)
        if riding is not None:
            riding.clear()
            riding.__exit__(None, None, None)

    def _close(self) -> None:
        riding = self._riding
        unreached = [s.name for s in riding.segments if s.cotangent is None]
        dots = riding.by_objective()
        unmeasured = riding.unmeasured()
        unseen = riding.unseen()
        reached = set(riding.reached)
        traced = {s.name for s in riding.segments if s.depends is not None}
        self._shut()
        if not dots:
            raise ProbeStateError(f"step {self._step}: no objective's losses were named; call "
                                  f"alignment.losses(name, losses) after each objective's forward pass")
        if unreached:
            raise ProbeStateError(f"step {self._step}: the losses of {', '.join(map(repr, unreached))} were named "
                                  f"but no backward pass reached them before the step closed")
        if unseen:
            names = sorted({n for missing in unseen.values() for n in missing})
            raise InvalidParameterError(f"step {self._step}: {unseen_message(list(unseen), names)}")
        self._traced |= traced
        if self._narrow and reached:
            self._narrow = False
            self.shared = tuple(n for n in self.shared if n in reached)
            self.downstream.shared = self.shared
            self.direction = {n: self.direction[n] for n in self.shared}
            self._direction_norm = float(flat_norm(self.direction))
        record: InRunRecord = {
            "step": self._step,
            "downstream_grad_age": self.age,
            "downstream_grad_norm": self._direction_norm,
            "alignment": {name: _alignment(columns[0], unmeasured[name]) for name, columns in dots.items()},
            "staleness": None,
        }
        if self._stale is not None and self._staleness is not None:
            staleness: Staleness = {**self._staleness, "dot_change": {  # type: ignore[typeddict-item]
                name: _relative(columns[1][~unmeasured[name]], columns[0][~unmeasured[name]])
                for name, columns in dots.items()}}
            record["staleness"] = staleness
        self._stale, self._staleness = None, None
        flagged = {name: len(a["unmeasured_rows"]) for name, a in record["alignment"].items() if a["unmeasured_rows"]}
        if flagged and not self._warned_unmeasured:
            self._warned_unmeasured = True
            warnings.warn(
                f"step {self._step}: the loop's loss gave no weight to "
                + ", ".join(f"{n} rows of {k!r}" for k, n in flagged.items())
                + " (an objective weighted 0, rows masked out of the loss): their gradient never reached the "
                  "backward, so their dots are unknown; the record lists them in alignment.<k>.unmeasured_rows, "
                  "their dots are null and the means are over the other rows (warned once)",
                UserWarning, stacklevel=4)
        self.records.append(record)
        self._step += 1
        self.age += 1
        if self._on_record is not None:
            self._on_record(record)


def _shut_hooks(live: dict[str, Any]) -> None:
    """Remove what an alignment that was dropped still had in place (its riding hooks, its
    optimizer hook)."""
    riding = live.pop("riding", None)
    if riding is not None:
        riding.clear()
        riding.__exit__(None, None, None)
    for key in ("handle", "counting"):
        handle = live.pop(key, None)
        if handle is not None:
            handle.remove()


def _refuse_sequence_first(model: nn.Module, shared: Sequence[str]) -> None:
    """A sequence-first ``nn.Transformer*Layer``'s linear layers and norms see ``[T, B, ...]``: their
    rows are positions, not examples (silently so where ``T = B``). Its attention alone is fine."""
    for path, module in model.named_modules():
        layer = isinstance(module, (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer))
        if layer and not module.self_attn.batch_first:
            prefix = f"{path}." if path else ""
            inside = [n for n in shared if n.startswith(prefix) and not n.startswith(f"{prefix}self_attn.")
                      and not n.startswith(f"{prefix}multihead_attn.")]
            if inside:
                raise InvalidParameterError(
                    f"{type(module).__name__} {path or '(the model)'} is sequence-first (batch_first=False): its "
                    f"layers see [T, B, ...], not one row per example, so the dots would mix examples; build it "
                    f"with batch_first=True, or leave {inside[0]!r} and the layer's other parameters out of shared=")


def _alignment(dots: torch.Tensor, unmeasured: torch.Tensor) -> RidingAlignment:
    """The record of one objective's dots; rows the loss gave no weight are listed, not averaged
    (their dot is unknown: null in ``dots``; with no other row, the statistics are null too)."""
    values = dots.cpu().numpy()
    skipped = unmeasured.numpy()
    kept = values[~skipped]
    rows = [None if skip else float(v) for v, skip in zip(values, skipped)]
    missing = [int(i) for i in np.flatnonzero(skipped)]
    if kept.size == 0:
        return {"dot": None, "ci95": None, "conflict_fraction": None, "dots": rows, "unmeasured_rows": missing}
    mean, low, high = mean_ci95(kept)
    return {"dot": float(mean), "ci95": [float(low), float(high)],
            "conflict_fraction": float(np.mean(kept < 0)), "dots": rows, "unmeasured_rows": missing}


def _relative(then: torch.Tensor, now: torch.Tensor) -> float:
    scale = float(now.norm())
    difference = float((then - now).norm())
    return difference / scale if scale > 0 else (0.0 if difference == 0 else math.inf)
