"""A probe record as named scalars, and those scalars written to TensorBoard.

TensorBoard is where many training runs are already watched: :class:`TensorBoardScalars` writes,
per probed step, each objective's alignment (dot, cosine, update cosine, conflict fraction),
``S``, and the Taylor prediction next to the actual change, through
``torch.utils.tensorboard`` (which needs the ``tensorboard`` package).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from objreg.analysis.records import StepRecord
from objreg.core.errors import InvalidParameterError

ALIGNMENT_FIELDS = ("dot", "cosine", "update_cosine", "conflict_fraction", "grad_norm")


def record_scalars(record: StepRecord) -> dict[str, float]:
    """``tag → value`` for one ``steps[]`` record (fields that are None are left out)."""
    scalars: dict[str, Any] = {
        "downstream/loss": record["downstream_loss"],
        "downstream/grad_norm": record["downstream_grad_norm"],
        "taylor/predicted_first_order": record["predicted_delta"]["first_order"],
        "taylor/predicted_first_plus_second_order": sum(record["predicted_delta"].values()),
        "taylor/actual": record["actual_delta"],
        "update/norm": record["update"]["norm"],
    }
    for name, alignment in record["alignment"].items():
        for field in ALIGNMENT_FIELDS:
            scalars[f"alignment/{name}/{field}"] = alignment.get(field)
        scalars[f"loss/{name}"] = record["losses"].get(name)
        scalars[f"weight/{name}"] = record["weights"].get(name)
    for pair, value in record["second_order"].items():
        scalars[f"second_order/{pair}"] = value
    return {tag: float(value) for tag, value in scalars.items() if value is not None}


class TensorBoardScalars:
    """Writes :func:`record_scalars` of each record at its step to a TensorBoard ``log_dir``.

    Raises:
        InvalidParameterError: the ``tensorboard`` package is not installed.
    """

    def __init__(self, log_dir: str | Path):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise InvalidParameterError(
                "TensorBoard scalars need the tensorboard package (pip install tensorboard)"
            ) from None
        self.writer = SummaryWriter(str(log_dir))

    def add(self, record: StepRecord) -> None:
        for tag, value in record_scalars(record).items():
            self.writer.add_scalar(tag, value, record["step"])
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
