"""What the split of an Adam step costs in memory and on disk, computed (docs/performance.md,
"Attribution memory and checkpoints", quotes :func:`cost_table`).

Under Adam the probe keeps every coalition's moments (:mod:`objreg.analysis.math.shapley`): two
parameter-sized tensors per tracked coalition, ``2(2ⁿ − 2)`` for ``n`` players. Adam itself keeps
two, so the moments are ``2ⁿ − 2`` times the optimizer's own state. A checkpoint of ``objreg
analyze`` holds the model, the optimizer's state and the moments (the records and generators
beside them are small). :func:`moments_warning` says when the moments would outgrow
:data:`WARNING_MULTIPLE` times the optimizer's state (and :data:`WARNING_FLOOR` bytes), naming
what shrinks them.

A probed step holds more than that: the directions it takes Hessian-vector products along (each
objective's gradient and, under Adam, each part of the step and each point of the exact
counterfactual's stencil) are parameter-sized, and a re-fitted head moves every one of them into
its fit set's features (the products themselves are dotted as they are made). The peak resident memory of ``objreg analyze`` per optimizer and head, fitted to
measured runs, is benchmarks/peak_model.py's (docs/performance.md, "A probed step's peak
memory"): measurements live beside the benchmarks, not here.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping

import torch

from objreg.analysis.math.shapley import CoalitionMoments

#: The moments warn above this multiple of the optimizer's own state (Adam: two tensors) ...
WARNING_MULTIPLE = 4.0
#: ... when they take at least this many bytes (a small model's moments are no concern).
WARNING_FLOOR = 1 << 30
GIB = float(1 << 30)

#: Models of the table: name → parameters (all of them shared with the downstream task).
TABLE_MODELS = {
    "BERT-base (BertForMaskedLM)": 109_514_298,
    "GPT-2 small (GPT2LMHeadModel)": 124_439_808,
    "objreg `--model bert-base` (8,000-token vocabulary)": 91_593_216,
    "1B": 1_000_000_000,
    "7B": 7_000_000_000,
}


def moment_tensors(players: int) -> int:
    """Parameter-sized tensors the coalition moments of ``players`` players hold."""
    return CoalitionMoments([f"player{k}" for k in range(players)]).tensors


def attribution_bytes(parameters: int, players: int, dtype: torch.dtype = torch.float32,
                      moments_dtype: torch.dtype | None = None) -> dict[str, int]:
    """Bytes of the model, of Adam's state, of the coalition moments (in ``moments_dtype``, None:
    the parameters' ``dtype``) and of a checkpoint holding all three."""
    size = torch.empty((), dtype=dtype).element_size()
    moment_size = torch.empty((), dtype=moments_dtype or dtype).element_size()
    model, adam = parameters * size, 2 * parameters * size
    moments = moment_tensors(players) * parameters * moment_size
    return {"model": model, "optimizer": adam, "moments": moments, "checkpoint": model + adam + moments}


def moments_warning(parameters: int, players: int, dtype: torch.dtype, moments_dtype: torch.dtype | None = None,
                    elsewhere: bool = False) -> str | None:
    """The warning for coalition moments above :data:`WARNING_MULTIPLE` times the optimizer's
    state and :data:`WARNING_FLOOR` bytes, naming the options; None below either (or where they
    are kept on another device than the parameters: ``elsewhere``)."""
    sizes = attribution_bytes(parameters, players, dtype, moments_dtype)
    multiple = sizes["moments"] / sizes["optimizer"]
    if elsewhere or multiple <= WARNING_MULTIPLE or sizes["moments"] < WARNING_FLOOR:
        return None
    return (
        f"the Adam coalition moments of the step's split over {players} players hold "
        f"{moment_tensors(players)} parameter-sized tensors ({sizes['moments'] / GIB:.1f} GiB, {multiple:.0f}× the "
        f"optimizer's own state, and in every checkpoint): TransferProbe(moments_dtype=torch.bfloat16) halves them, "
        f"moments_device=\"cpu\" keeps them off the accelerator, fewer objectives need fewer (each one doubles "
        f"them), and plain SGD none; objreg analyze --checkpoint-every N writes them less often "
        f"(docs/performance.md, \"Attribution memory and checkpoints\")")


def warn_of_moments(coalitions: CoalitionMoments, shared: Mapping[str, torch.Tensor]) -> None:
    """Warn (:func:`moments_warning`) where the coalition moments over the ``shared`` parameters
    would outgrow the optimizer's own state; for the probe's constructor (the warning points at its caller)."""
    like = next(iter(shared.values()))
    message = moments_warning(sum(p.numel() for p in shared.values()), len(coalitions.players), like.dtype,
                              coalitions.dtype, coalitions.device is not None and coalitions.device != like.device)
    if message is not None:
        warnings.warn(message, UserWarning, stacklevel=3)


def cost_table(players: tuple[int, ...] = (2, 3, 4)) -> str:
    """The Markdown table of docs/performance.md: per model and number of players, the moments
    in float32 and bfloat16, their multiple of Adam's state, and a float32 checkpoint."""
    lines = ["| model | parameters | players | moments, float32 | moments, bfloat16 | × Adam's state | "
             "checkpoint (model + AdamW + float32 moments) |",
             "|---|---|---|---|---|---|---|"]
    for name, count in TABLE_MODELS.items():
        for n in players:
            full = attribution_bytes(count, n)
            half = attribution_bytes(count, n, moments_dtype=torch.bfloat16)
            lines.append(f"| {name} | {count / 1e6:,.1f} M | {n} | {full['moments'] / GIB:,.2f} GiB | "
                         f"{half['moments'] / GIB:,.2f} GiB | {full['moments'] / full['optimizer']:.0f}× | "
                         f"{full['checkpoint'] / GIB:,.2f} GiB |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(cost_table())
