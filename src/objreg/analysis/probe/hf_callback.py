"""``ProbeCallback``: the transfer probe inside a Hugging Face ``Trainer.train()``.

The callback wraps the trainer's ``compute_loss`` to see each step's batch (the dict
``compute_loss`` receives, every key the collator made), and on every ``every``-th optimizer step
measures in ``on_pre_optimizer_step`` (after the backward and the gradient clipping) and finishes
in ``on_optimizer_step`` (after ``optimizer.step()``): :class:`~objreg.analysis.probe.transfer_probe.TransferProbe`
does the work. Under Adam the other steps are tracked (each objective's gradient, one backward
each). Records go to :attr:`ProbeCallback.records`, and with ``out_dir`` to ``steps.jsonl`` as
they come and ``report.json``/``report.csv`` at the end; with ``tensorboard=True``, to TensorBoard.

This module imports ``transformers``; ``import objreg`` does not load it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from torch import nn
from transformers import TrainerCallback

from objreg.analysis.probe.tensorboard import TensorBoardScalars
from objreg.analysis.probe.transfer_probe import LossFn, Measurement, TransferProbe
from objreg.analysis.probe.writer import RunWriter
from objreg.analysis.records import StepRecord
from objreg.core.errors import InvalidParameterError, ProbeStateError


class ProbeCallback(TrainerCallback):
    """Probes every ``every`` optimizer steps of ``trainer`` (and its first), and attaches itself.

    Args:
        trainer: The ``transformers.Trainer`` (its ``compute_loss`` is wrapped to see each batch).
        objectives: Name → ``fn(model, inputs) -> [B]``: the objective's per-sample losses on the
            batch ``compute_loss`` receives.
        downstream: ``fn(model, batch) -> [B]``, the downstream per-sample loss.
        eval_batches: The fixed evaluation set defining ``D`` (a batch or a list of batches).
        every: Probe every this many optimizer steps.
        weights: The objectives' weights in the trainer's loss (default 1).
        out_dir: Where to write ``steps.jsonl`` (as it goes) and ``report.json``, ``report.csv`` (at the end).
        tensorboard: Also write scalars to ``out_dir/tensorboard`` (needs the ``tensorboard`` package).
        downstream_name: The downstream task's name in the report.
        **options: Passed to :class:`~objreg.analysis.probe.transfer_probe.TransferProbe` (``shared``,
            ``per_sample_method``, ``hvp_method``, ``eval_dtype``, ``seed``, ``batch_coupled``).

    Raises:
        InvalidParameterError: a bad argument, or gradient accumulation (each optimizer step must
            be one ``compute_loss`` call).
    """

    def __init__(self, trainer: Any, objectives: Mapping[str, LossFn], downstream: LossFn, eval_batches: Any, *,
                 every: int = 1, weights: Mapping[str, float] | None = None, out_dir: str | Path | None = None,
                 tensorboard: bool = False, downstream_name: str = "downstream", **options: Any):
        if not hasattr(trainer, "compute_loss") or not hasattr(trainer, "add_callback"):
            raise InvalidParameterError(f"trainer must be a transformers.Trainer, got {type(trainer).__name__}")
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise InvalidParameterError(f"every must be a positive integer, got {every!r}")
        if trainer.args.gradient_accumulation_steps != 1:
            raise InvalidParameterError("the probe needs one batch per optimizer step: set "
                                        "gradient_accumulation_steps=1 (got "
                                        f"{trainer.args.gradient_accumulation_steps})")
        if tensorboard and out_dir is None:
            raise InvalidParameterError("tensorboard=True writes under out_dir: give out_dir")
        self.objectives, self.downstream, self.eval_batches = dict(objectives), downstream, eval_batches
        self.every, self.weights, self.options = every, weights, options
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.downstream_name = downstream_name
        self.writer = RunWriter(self.out_dir) if self.out_dir is not None else None
        self.scalars = TensorBoardScalars(self.out_dir / "tensorboard") if tensorboard else None
        self.records: list[StepRecord] = []
        self.probe: TransferProbe | None = None
        self._inputs: Any = None
        self._pending: Measurement | None = None
        trainer.compute_loss = self._capturing(trainer.compute_loss)
        trainer.add_callback(self)

    def _capturing(self, compute_loss: Callable[..., Any]) -> Callable[..., Any]:
        def compute_loss_seen(model: nn.Module, inputs: Any, *args: Any, **kwargs: Any) -> Any:
            if model.training and self._inputs is None:  # the step's batch (not an evaluation's)
                self._inputs = inputs
            return compute_loss(model, inputs, *args, **kwargs)

        return compute_loss_seen

    def on_train_begin(self, args: Any, state: Any, control: Any, model: nn.Module | None = None,
                       optimizer: Any = None, **kwargs: Any) -> None:
        if self.probe is None:
            self.probe = TransferProbe(model, self.objectives, self.downstream, optimizer,
                                       eval_batches=self.eval_batches, weights=self.weights, **self.options)
            if self.writer is not None:
                self.writer.start_steps()

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._inputs = None

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._inputs is None:
            raise ProbeStateError("the probe saw no batch this step: the trainer's compute_loss was not called")
        batches = {name: self._inputs for name in self.objectives}
        if state.global_step % self.every == 0:
            self._pending = self.probe.measure(batches, step=state.global_step)
        else:
            self.probe.track(batches)

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._pending is None:
            return
        record = self.probe.finish(self._pending)
        self._pending = None
        self.records.append(record)
        if self.writer is not None:
            self.writer.append_step(record)
        if self.scalars is not None:
            self.scalars.add(record)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.writer is not None and self.records:
            self.writer.write_report(self.probe.report(self.downstream_name))
        if self.scalars is not None:
            self.scalars.close()
