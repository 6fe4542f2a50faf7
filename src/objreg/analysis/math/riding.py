"""Per-example dots riding the training backward: ``⟨∇ℓ_{k,i}, v⟩`` for every objective ``k`` and
row ``i`` from the loop's own forward and backward pass, no pass of their own.

:class:`RidingDots` is :class:`~objreg.analysis.math.ghost.GhostDots` (the same closed-form rules
for ``nn.Linear``, ``transformers``' ``Conv1D``, ``nn.Embedding`` and ``nn.LayerNorm``, a module's
own ``jvp`` for anything else) with two things added for a pass it does not run itself:

* **which objective a module call belongs to.** The loop names each objective's per-example
  losses as it computes them (:meth:`RidingDots.mark`); the module calls made since the previous
  mark are that objective's. So each objective's forward must run on its own (one backbone pass
  per objective, as objreg's own loop does); a backbone pass shared by two losses would be
  given to the first one marked.
* **the loop's weighting.** The backward is of whatever the loop makes of the losses
  (``Σ_k α_k mean(ℓ_k)``, a sum, per-example weights), so the gradient reaching a module is
  ``c_i ∂ℓ_i/∂y`` with ``c_i = ∂L/∂ℓ_i``, read off the losses by a tensor hook. Each row's dot is
  divided by its ``c_i``: ``⟨∇ℓ_i, v⟩`` whatever the weighting. Where ``c_i = 0`` (a row or an
  objective the loop gave no weight) the backward carries nothing of row ``i``: its dot is not
  known (:meth:`RidingDots.unmeasured` names those rows).

``nn.MultiheadAttention`` multiplies by its ``out_proj``'s weight without calling ``out_proj``:
the attention counts those parameters as its own, through its own jvp. Any other parameter used
outside the forward of the module registering it is invisible to the hooks; walking the losses'
autograd graph once per objective (:meth:`RidingDots.unseen`) tells which, so that the caller
refuses them by name instead of leaving their share out.

Module calls never marked (another computation under the same hooks, such as a probe's own
passes) cost nothing: their gradients are not contracted. The rows must be independent, as for
ghost dots (never for batch-coupled losses).

A linear layer whose output is wider than its input (an LM head over the vocabulary) contracts
only the rows whose output gradient is not zero: a masked-token loss has gradient at the masked
positions alone, so the head's dot costs that share of the positions.

With ``per_example=True`` the linear layers (``nn.Linear``, ``Conv1D``) run
:class:`~objreg.analysis.math.per_example_linear.PerExampleLinear` instead: their backward forms
the weight gradient example by example and the dots come out of those, for a share of ``1/T`` of
the layer's own product instead of a product as large as its forward; the step's gradients then
differ from an unmeasured step's by rounding.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, jvp

from objreg.analysis.math.autograd_graph import depends_on, sequence_now
from objreg.analysis.math.functional import Params
from objreg.analysis.math.ghost import GhostDots, GhostUnsupportedError
from objreg.analysis.math.ghost_rules import batched_dot, is_conv1d, live_rows_dot, plain_embedding
from objreg.analysis.math.per_example_linear import Slot, per_example_forward
from objreg.analysis.math.riding_calls import ModuleCall, Segment
from objreg.analysis.math.rng_replay import replaying_rng, rng_state
from objreg.core.errors import InvalidParameterError


class RidingDots(GhostDots):
    """Every marked objective's per-example dots with each of ``directions``, from the
    backward passes run while the hooks are on (module docstring).

    Args:
        model: The module the loop calls (its own forward, not a ``functional_call``).
        directions: ``v``s keyed like ``model.named_parameters()``; parameters they do not name
            contribute nothing.
        per_example: Linear layers form their weight gradients example by example (module
            docstring); their ``forward`` is replaced inside the block.
    """

    absorb_attention = True

    def __init__(self, model: nn.Module, directions: Sequence[Params], per_example: bool = False,
                 traced: Collection[str] = (), spans: bool = False):
        if not directions:
            raise InvalidParameterError("RidingDots needs at least one direction")
        super().__init__(model, directions[0], batch_size=0, more=list(directions[1:]))
        self.directions = list(directions)
        self.per_example = per_example
        self._patched: list[nn.Module] = []
        self.pending: list[ModuleCall] = []
        self.segments: list[Segment] = []
        #: False while the caller runs computations of its own (their calls are not recorded).
        self.recording = True
        #: Names of the parameters whose modules' calls a marked objective's backward reached.
        self.reached: set[str] = set()
        #: Objectives already checked: the others' losses have their autograd graph walked at
        #: :meth:`mark`, to tell which measured parameters they depend on (:meth:`unseen`).
        self.traced = set(traced)
        self.called: set[str] = set()  # the measured parameters whose modules' calls were recorded
        #: With ``spans``, each owner's call as the autograd sequence numbers of the nodes it
        #: created, and the parameters it owns: a use of a parameter by a node outside every span
        #: of its owners is a use the hooks cannot see (:meth:`unseen`).
        self.spans: list[tuple[int, int, frozenset[str]]] | None = [] if spans else None
        self._span_starts: dict[int, list[int]] = {}
        self._rng: dict[int, tuple] = {}  # a generic module's call → the generators' state at its start

    def _attach(self, module: nn.Module, own: dict[str, str]) -> None:
        linear = type(module) is nn.Linear or is_conv1d(module)
        if self.per_example and linear and set(own) <= {"weight", "bias"} and "forward" not in vars(module):
            # Its own forward records the call: no forward hook (a hook sends every call down
            # nn.Module's slower path).
            module.forward = per_example_forward(module, is_conv1d(module), self._opener(own))
            self._patched.append(module)
        else:
            if not (type(module) in (nn.Linear, nn.LayerNorm) or is_conv1d(module) or plain_embedding(module)):
                # Its contribution replays its forward (a jvp): with the generators as they were
                # at the call, the replay draws the call's own dropout masks, and the loop's
                # stream is left as it was.
                self._handles.append(module.register_forward_pre_hook(self._save_rng))
            super()._attach(module, own)

    def _save_rng(self, module: nn.Module, args: tuple) -> None:
        if self._recorded():
            self._rng[id(module)] = rng_state(args)

    def __enter__(self) -> RidingDots:
        super().__enter__()
        if self.spans is not None:
            for module, own in self.owners:
                names = frozenset(own.values())
                self._handles.append(module.register_forward_pre_hook(self._span_start))
                self._handles.append(module.register_forward_hook(
                    lambda m, args, output, names=names: self._span_end(m, names)))
        return self

    def _span_start(self, module: nn.Module, args: tuple) -> None:
        if self._recorded():
            self._span_starts.setdefault(id(module), []).append(sequence_now())

    def _span_end(self, module: nn.Module, names: frozenset[str]) -> None:
        starts = self._span_starts.get(id(module))
        if self._recorded() and starts:
            self.spans.append((starts.pop(), sequence_now(), names))

    def __exit__(self, *exc: object) -> None:
        for module in self._patched:
            del module.forward
        self._patched.clear()
        super().__exit__(*exc)

    def mark(self, name: str, losses: torch.Tensor) -> torch.Tensor:
        """Name the per-example losses ``[B]`` of objective ``name``, computed by the module calls
        made since the last mark; returns ``losses`` as they are.

        Raises:
            InvalidParameterError: ``losses`` is not a differentiable ``[B]`` tensor, no measured
                module ran since the last mark, or one ran on another number of rows.
        """
        if not isinstance(losses, torch.Tensor) or losses.dim() != 1 or not losses.dtype.is_floating_point:
            got = f"a tensor of shape {list(losses.shape)}" if isinstance(losses, torch.Tensor) else type(losses).__name__
            raise InvalidParameterError(f"the losses of {name!r} must be one loss per example, a floating tensor of "
                                        f"shape [B]; got {got}")
        if not losses.requires_grad:
            raise InvalidParameterError(f"the losses of {name!r} do not require grad (computed under "
                                        f"torch.no_grad(), or detached?): no backward would carry their dots")
        calls, self.pending = self.pending, []
        if not calls:
            # Measured parameters it uses whose modules never ran: used outside those modules.
            unseen = depends_on(losses, self._measured())[0] - self.called
            if unseen:
                raise InvalidParameterError(unseen_message([name], sorted(unseen)))
            raise InvalidParameterError(
                f"no module owning a measured parameter ran since the last objective was marked: mark the losses "
                f"of {name!r} right after the forward pass that computed them")
        rows = losses.shape[0]
        wrong = next((c for c in calls if c.rows != rows), None)
        if wrong is not None:
            raise InvalidParameterError(
                f"{type(wrong.module).__name__} ran on {wrong.rows} rows but the losses of {name!r} have {rows}: "
                f"the dots ride a forward whose every module maps the batch's rows (batch first)")
        segment = Segment(name, rows, [[] for _ in self.directions], calls=len(calls))
        if name not in self.traced:
            segment.depends, segment.outside = depends_on(losses, self._measured(), self.spans)
        for call in calls:
            call.segment = segment
            if call.slot is not None:
                call.slot.take = self._taker(call)

        def take(cotangent: torch.Tensor) -> None:
            segment.cotangent = cotangent.detach() if segment.cotangent is None else segment.cotangent + cotangent

        segment.hooks.append(losses.register_hook(take))
        self.segments.append(segment)
        return losses

    def _measured(self) -> dict[int, str]:
        """``id`` of every measured parameter → its name."""
        names: dict[int, str] = {}
        for module, own in self.owners:
            for local, name in own.items():
                names[id(_attribute(module, local))] = name
        return names

    def unseen(self) -> dict[str, list[str]]:
        """Objective → the measured parameters its losses depend on that no contraction covered
        (used outside the forward of the module that registers them, which the hooks watch: the
        dots would leave their share out); objectives not in ``traced``, and only those missing."""
        out: dict[str, list[str]] = {}
        for segment in self.segments:
            if segment.depends is not None and segment.cotangent is not None:
                missing = (segment.depends - segment.reached) | segment.outside
                if missing:
                    out.setdefault(segment.name, [])
                    out[segment.name] += [n for n in sorted(missing) if n not in out[segment.name]]
        return out

    def unmeasured(self) -> dict[str, torch.Tensor]:
        """Objective → ``[B]`` bool, the rows whose loss the backward gave no weight (``∂L/∂ℓ_i =
        0``: an objective weighted 0, a row masked out of the loss). Their gradient never reached
        the hooks, so their dots are unknown (NaN in :meth:`by_objective`)."""
        out: dict[str, list[torch.Tensor]] = {}
        for segment in self.segments:
            zero = (segment.cotangent == 0) if segment.cotangent is not None else \
                torch.zeros(segment.rows, dtype=torch.bool)
            out.setdefault(segment.name, []).append(zero.cpu())
        return {name: torch.cat(parts) for name, parts in out.items()}

    def by_objective(self) -> dict[str, list[torch.Tensor]]:
        """Objective → ``[B]`` float64 dots with each direction, rows in the order marked (an
        objective marked several times in a pass, micro-batches, has their rows one after the
        other). A segment no backward reached gives NaN rows."""
        out: dict[str, list[list[torch.Tensor]]] = {}
        for segment in self.segments:
            if segment.cotangent is None:  # its losses were never backpropagated
                dots = [torch.full((segment.rows,), float("nan"), dtype=torch.float64) for _ in self.directions]
            else:
                scale = segment.cotangent.double()
                dots = [(torch.stack(parts).double().sum(0) if parts else torch.zeros_like(scale)) / scale
                        for parts in segment.contributions]
            held = out.setdefault(segment.name, [[] for _ in self.directions])
            for column, d in zip(held, dots):
                column.append(d)
        return {name: [torch.cat(column) for column in columns] for name, columns in out.items()}

    def clear(self) -> None:
        """Forget the pass (its calls and contributions), keeping the hooks."""
        for segment in self.segments:
            for hook in segment.hooks:
                hook.remove()
        self.pending, self.segments, self.called = [], [], set()

    def _recorded(self) -> bool:
        """Whether a module call made now is the loop's own, to be recorded."""
        return not self._replaying and self.recording and torch.is_grad_enabled()

    def _opener(self, own: dict[str, str]) -> Callable[[nn.Module, torch.Tensor], Slot | None]:
        """The slot of a per-example linear call on ``x``, recorded as the loop's; None for a
        call that is not the loop's (the module then runs its own forward)."""

        def open_slot(module: nn.Module, x: torch.Tensor) -> Slot | None:
            differentiated = x.requires_grad or any(p is not None and p.requires_grad
                                                    for p in (module.weight, module.bias))
            if not self._recorded() or not differentiated:  # nothing of this call is differentiated
                return None
            if x.dim() < 2:
                raise GhostUnsupportedError(f"{type(module).__name__} was called on a tensor of shape {tuple(x.shape)}: "
                                            f"dots riding the backward need every measured module to map the batch's rows")
            slot = Slot()
            self.pending.append(ModuleCall(module, {}, (x,), {}, own, x.shape[0], slot=slot))
            self.called.update(own.values())
            return slot

        return open_slot

    def _hook(self, own: dict[str, str]) -> Callable[..., Any]:
        def forward_hook(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
            if not self._recorded():
                return
            batch_dim = 0
            if isinstance(module, nn.MultiheadAttention) and isinstance(output, tuple):
                output = output[0]  # the attention's output (its weights are not used by a loss)
                batch_dim = 0 if module.batch_first else 1
                if isinstance(output, torch.Tensor) and output.dim() < 3:
                    raise GhostUnsupportedError("nn.MultiheadAttention was called on one unbatched sequence: dots "
                                                "riding the backward need the batch's rows")
            rng = self._rng.pop(id(module), None)
            if not isinstance(output, torch.Tensor) or not output.requires_grad:
                return  # nothing of this call is differentiated
            if plain_embedding(module) and args and isinstance(args[0], torch.Tensor) and args[0].dim() < 2:
                raise GhostUnsupportedError(
                    f"dots riding the backward need per-row embedding look-ups; {type(module).__name__} was called "
                    f"with an index tensor of shape {tuple(args[0].shape)} (positions shared by every row, say): "
                    f"pass ids of shape [B, T]")
            if output.dim() == 0:
                raise GhostUnsupportedError(f"{type(module).__name__} returned a scalar: dots riding the backward "
                                            f"need every module owning measured parameters to map the batch's rows")
            call = ModuleCall(module, {local: _attribute(module, local) for local in own}, args, kwargs, own,
                         output.shape[batch_dim], batch_dim=batch_dim, rng=rng)
            self.pending.append(call)
            self.called.update(own.values())
            output.register_hook(lambda g: self._contract(call, g))

        return forward_hook

    def _contract(self, call: ModuleCall, g: torch.Tensor) -> None:
        segment = call.segment
        if segment is None:  # not a marked objective's (a computation the caller runs under the hooks)
            return
        self.reached.update(call.own.values())
        segment.reached.update(call.own.values())
        with torch.no_grad():
            for parts, direction in zip(segment.contributions, self.directions):
                d = {local: direction[name] for local, name in call.own.items()}
                parts.append(self._contribution(call, g, d))

    def _taker(self, call: ModuleCall) -> Callable[[int, torch.Tensor, torch.Tensor | None], None]:
        """Receives a per-example linear call's gradients chunk by chunk (its slot's ``take``)."""
        segment = call.segment
        own = call.own
        # Each direction's (weight flattened, bias) for this layer, None where it does not name it.
        directions = [(direction[own["weight"]].reshape(-1) if "weight" in own and own["weight"] in direction else None,
                       direction.get(own["bias"]) if "bias" in own else None) for direction in self.directions]
        parts: list[torch.Tensor] = []

        def take(first: int, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
            with torch.no_grad():
                flat = weight.flatten(1)
                dots = []
                for v_weight, v_bias in directions:
                    dot = bias @ v_bias.to(bias.dtype) if bias is not None and v_bias is not None else None
                    if v_weight is not None:
                        v_weight = v_weight.to(weight.dtype)
                        dot = flat @ v_weight if dot is None else torch.addmv(dot, flat, v_weight)
                    dots.append(dot if dot is not None else flat.new_zeros(len(weight)))
            if first == 0:
                self.reached.update(own.values())
                segment.reached.update(own.values())
                if len(weight) < call.rows:  # in chunks: the rows are filled in as they come
                    dots = [torch.cat([dot, dot.new_zeros(call.rows - len(weight))]) for dot in dots]
                parts[:] = dots
                for column, part in zip(segment.contributions, parts):
                    column.append(part)
            else:
                for part, dot in zip(parts, dots):
                    part[first: first + len(dot)] = dot

        return take

    def _contribution(self, call: ModuleCall, g: torch.Tensor, d: Params) -> torch.Tensor:
        module, args = call.module, call.args
        wide = (type(module) is nn.Linear or is_conv1d(module)) and len(args) == 1 and not call.kwargs
        if wide and g.shape[-1] > args[0].shape[-1]:
            # Conv1D stores its weight [in, out]: nn.Linear's layout is its transpose.
            linear = {k: v.T if k == "weight" else v for k, v in d.items()} if is_conv1d(module) else d
            sparse = live_rows_dot(args[0], g, linear)
            if sparse is not None:
                return sparse
        with replaying_rng(call.rng):
            if isinstance(module, nn.MultiheadAttention):
                self._replaying = True
                try:
                    _, tangent = jvp(lambda p: functional_call(module, p, args, call.kwargs)[0], (call.values,), (d,))
                finally:
                    self._replaying = False
                if call.batch_dim:
                    tangent, g = tangent.transpose(0, call.batch_dim), g.transpose(0, call.batch_dim)
                return batched_dot(tangent, g)
            return self._dot(module, call.values, args, call.kwargs, g, d)


def unseen_message(objectives: Sequence[str], names: Sequence[str]) -> str:
    """The refusal of parameters the riding hooks cannot see (:meth:`RidingDots.unseen`)."""
    return (f"the losses of {', '.join(map(repr, objectives))} depend on {len(names)} measured parameter(s) used "
            f"outside the forward of the module that registers them, which the riding hooks cannot see: "
            f"{', '.join(map(repr, names[:8]))}; their share of the dots would be left out. Leave them out of "
            f"shared=, or measure with TransferProbe")


def _attribute(module: nn.Module, dotted: str) -> torch.Tensor:
    """``module``'s tensor at ``dotted`` (``out_proj.weight``): a parameter, or the tensor a
    ``functional_call`` put in its place."""
    for part in dotted.split("."):
        module = getattr(module, part)
    return module  # type: ignore[return-value]


