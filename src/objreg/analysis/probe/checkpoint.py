"""A :class:`~objreg.analysis.probe.transfer_probe.TransferProbe` saved and resumed beside the
model's and the optimizer's own state: :meth:`Checkpointed.state_dict` and
:meth:`Checkpointed.load_state_dict` (the state's checks: :mod:`objreg.analysis.probe.state`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from objreg.analysis.math.optimizers import shared_group
from objreg.analysis.math.refit import RefitDownstream
from objreg.analysis.probe.state import check_state, optimizer_settings, parameter_layout
from objreg.core.errors import InvalidParameterError, ProbeStateError

#: Bumped when :meth:`Checkpointed.state_dict` changes shape (older states are refused).
STATE_FORMAT = 2


class Checkpointed:
    """:class:`~objreg.analysis.probe.transfer_probe.TransferProbe`'s checkpoint methods (a mixin:
    they read and restore the probe's engine, records, coalition moments and step counters)."""

    def state_dict(self) -> dict[str, Any]:
        """Everything the probe keeps across steps, as tensors and plain data (``torch.save`` it
        beside the model's and the optimizer's state; it loads with ``weights_only=True``): the
        records, the measured parameters' names, the Adam coalition moments, the example scores,
        the methods chosen and the step counters."""
        engine = self.engine
        return {
            "format": STATE_FORMAT,
            "objectives": list(engine.objectives),
            "shared": list(engine.shared),
            "parameters": parameter_layout(self.shared_parameters),
            "optimizer": self._optimizer_settings(),
            "records": list(self.records),
            "next_step": self._next_step,
            "steps_seen": self._steps_seen,
            "tracked_at": self._tracked_at,
            "coalitions": self.coalitions.state_dict() if self.coalitions is not None else None,
            "attribution": engine.attribution.state_dict(),
            "hvp_method": engine.hvp_method,
            "update_rule": engine.update_rule,
            "methods_used": sorted(engine.methods_used),
            "downstream_resolution": engine.resolution,
            "downstream": self.downstream.state_dict() if isinstance(self.downstream, RefitDownstream) else None,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from the :meth:`state_dict` of a probe made with the same objectives and
        optimizer kind (load the model's and the optimizer's state too).

        Raises:
            InvalidParameterError: a state of another format, other objectives, parameters this
                model lacks, or another optimizer kind (Adam's moments with SGD or back).
            ProbeStateError: a step's measurement is in flight.
        """
        if self._observed is not None or self._attached_measurement is not None:
            raise ProbeStateError("load_state_dict() between observe() and optimizer.step(): load it before the step")
        refit = isinstance(self.downstream, RefitDownstream)
        # Everything checked before anything changes (objreg.analysis.probe.state).
        check_state(state, fmt=STATE_FORMAT, objectives=list(self.engine.objectives), model=self.model,
                    shared_given=self._shared_given, optimizer=self._optimizer_settings(),
                    adam=self.coalitions is not None, refit_head=self.downstream.head if refit else None)
        if refit:
            self.downstream.check_state(state["downstream"], self.model)
        if self.coalitions is not None:
            try:
                self.coalitions.load_state_dict(state["coalitions"])
            except (KeyError, ValueError) as e:
                raise InvalidParameterError(f"the state's Adam coalition moments do not fit this probe: {e}") from None
        engine = self.engine
        engine.shared = self.downstream.shared = tuple(state["shared"])
        self._narrow = False
        self._remember_shared()
        self.records = list(state["records"])
        self._next_step, self._steps_seen = int(state["next_step"]), int(state["steps_seen"])
        self._tracked_at = None if state["tracked_at"] is None else int(state["tracked_at"])
        engine.attribution.load_state_dict(state["attribution"])
        engine.hvp_method, engine.update_rule = state["hvp_method"], state["update_rule"]
        engine.methods_used = set(state["methods_used"])
        engine.resolution = state.get("downstream_resolution")  # measured at the first probe
        if state["downstream"] is not None:
            self.downstream.load_state_dict(state["downstream"])
        self._needs_state = False

    def _optimizer_settings(self) -> dict[str, Any]:
        return optimizer_settings(self.optimizer, shared_group(self.optimizer, self.shared_parameters))
