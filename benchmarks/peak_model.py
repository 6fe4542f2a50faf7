"""The probed step's peak memory as a linear model of its size, fitted to measured runs.

    python -m benchmarks.peak_model     # the table of docs/performance.md, "A probed step's peak memory"

The runs (``probe_memory_peaks.json``, beside this file) are ``benchmarks/probe_memory.py``'s
measurements of ``objreg analyze`` with 3 objectives on the CPU: (optimizer, downstream head,
shared parameters, hidden size, layers, fit rows, seq_len, peak resident bytes). Per optimizer
and head, :func:`fit_peak` takes the least-squares ``(a, b, c)`` of ``peak ≈ a × parameter bytes
+ b × activation unit + c GiB``; :func:`peak_table` prints the peak it gives for the models of
:data:`objreg.analysis.math.costs.TABLE_MODELS`.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import torch

from objreg.analysis.math.costs import GIB, TABLE_MODELS

#: The measured runs (docstring), read from the JSON beside this module.
PEAK_RUNS: list[tuple[str, str, int, int, int, int, int, int]] = [
    tuple(run) for run in json.loads((Path(__file__).parent / "probe_memory_peaks.json").read_text())["runs"]]


def fit_peak(runs: list[tuple[str, str, int, int, int, int, int, int]]
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
    on first use."""
    return fit_peak(PEAK_RUNS)


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


if __name__ == "__main__":
    print(peak_table())
