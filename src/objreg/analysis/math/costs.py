"""What the split of an Adam step costs in memory and on disk, computed (docs/performance.md,
"Attribution memory and checkpoints", quotes :func:`cost_table`).

Under Adam the probe keeps every coalition's moments (:mod:`objreg.analysis.math.shapley`): two
parameter-sized tensors per tracked coalition, ``2(2ⁿ − 2)`` for ``n`` players. Adam itself keeps
two, so the moments are ``2ⁿ − 2`` times the optimizer's own state. A checkpoint of ``objreg
analyze`` holds the model, the optimizer's state and the moments (the records and generators
beside them are small). :func:`moments_warning` says when the moments would outgrow
:data:`WARNING_MULTIPLE` times the optimizer's state (and :data:`WARNING_FLOOR` bytes), naming
what shrinks them.

A probed step holds more than that: the Hessian-vector products of every direction it takes
(each objective's gradient and, under Adam, each part of the step and each point of the exact
counterfactual's stencil) are parameter-sized, and a re-fitted head's curvature needs a second
set of them. :func:`probe_peak` gives the peak resident memory of ``objreg analyze`` per optimizer
and head, a multiple of the shared parameters' bytes plus an activation term, fitted to the runs
of :data:`PEAK_RUNS` (docs/performance.md, "A probed step's peak memory"); :func:`peak_table`
prints it for the models of the table.
"""

from __future__ import annotations

import functools
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


#: Runs of benchmarks/probe_memory.py (``objreg analyze``, 3 objectives, CPU; docs/performance.md,
#: "A probed step's peak memory"): (optimizer, downstream head, shared parameters, hidden size,
#: layers, fit rows, seq_len, peak resident bytes).
PEAK_RUNS: list[tuple[str, str, int, int, int, int, int, int]] = [
    ("adamw", "refit", 1486336, 128, 2, 16, 32, 932995072),
    ("adamw", "refit", 1486336, 128, 2, 64, 64, 1174462464),
    ("adamw", "refit", 5338624, 256, 4, 16, 32, 2081849344),
    ("adamw", "refit", 5338624, 256, 4, 64, 64, 2902343680),
    ("adamw", "refit", 7656320, 320, 4, 16, 32, 2750705664),
    ("adamw", "frozen", 1486336, 128, 2, 16, 32, 840720384),
    ("adamw", "frozen", 1486336, 128, 2, 64, 64, 986648576),
    ("adamw", "frozen", 5338624, 256, 4, 16, 32, 1743863808),
    ("sgd", "refit", 1486336, 128, 2, 16, 32, 665165824),
    ("sgd", "refit", 1486336, 128, 2, 64, 64, 839393280),
    ("sgd", "refit", 5338624, 256, 4, 16, 32, 1153036288),
]


def fit_peak(runs: list[tuple[str, str, int, int, int, int, int, int]] = PEAK_RUNS
             ) -> dict[tuple[str, str], tuple[float, float, float]]:
    """Per (optimizer, head), the least-squares ``(a, b, c)`` of ``peak ≈ a × parameter bytes + b ×
    activation unit + c GiB`` through its runs (:func:`activation_bytes`)."""
    fitted = {}
    for setting in dict.fromkeys(run[:2] for run in runs):
        rows = [run for run in runs if run[:2] == setting]
        design = torch.tensor([[4.0 * p, float(activation_bytes(f, t, h, n)), GIB] for _, _, p, h, n, f, t, _ in rows],
                              dtype=torch.float64)
        peaks = torch.tensor([[float(run[7])] for run in rows], dtype=torch.float64)
        a, b, c = torch.linalg.lstsq(design, peaks).solution.flatten().tolist()
        fitted[setting] = (a, b, c)
    return fitted


def activation_bytes(fit_rows: int, seq_len: int, hidden: int, layers: int) -> int:
    """The activation unit: the fit set's hidden states at every layer in float32 (``fit_rows ×
    seq_len × hidden × layers``); the re-fitted head's curvature moves every direction through
    them (``φ′w``)."""
    return 4 * fit_rows * seq_len * hidden * layers


@functools.cache
def probe_peak() -> dict[tuple[str, str], tuple[float, float, float]]:
    """(optimizer, downstream head) → (a, b, c) of :func:`fit_peak` over :data:`PEAK_RUNS`, fitted
    on first use (the probe imports this module for its warning and needs no fit)."""
    return fit_peak()


def probe_peak_bytes(parameters: int, optimizer: str, head: str, activation: int = 0) -> float:
    """The peak resident memory of a probed ``objreg analyze`` run with 3 objectives
    (:func:`probe_peak`): ``parameters`` shared float32 parameters, ``activation`` the bytes of
    :func:`activation_bytes` (0: leave the activation term out)."""
    a, b, c = probe_peak()[(optimizer, head)]
    return a * 4 * parameters + b * activation + c * GIB


def peak_table() -> str:
    """The Markdown table of docs/performance.md's "A probed step's peak memory": per setting,
    the fitted multiples and the peak ``a × parameter bytes + c`` they give for each model of the
    table (the activation term left out)."""
    names = list(TABLE_MODELS)
    lines = ["| optimizer | downstream head | × parameter bytes (a) | × activation unit (b) | constant (c) | "
             + " | ".join(f"{name}, {TABLE_MODELS[name] / 1e6:,.1f} M" for name in names) + " |",
             "|---|---|---|---|---|" + "---|" * len(names)]
    for (optimizer, head), (a, b, c) in probe_peak().items():
        peaks = [probe_peak_bytes(TABLE_MODELS[name], optimizer, head) / GIB for name in names]
        lines.append(f"| {optimizer} | {head} | {a:.0f} | {b:.0f} | {c:.2f} GiB | "
                     + " | ".join(f"{peak:,.1f} GiB" for peak in peaks) + " |")
    return "\n".join(lines)


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
    print()
    print(peak_table())
