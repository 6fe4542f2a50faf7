"""taylor-transfer: the slope fit, the verdict rule, and a tiny real run."""

from __future__ import annotations

import json

import numpy as np
import pytest

from objreg.experiments import taylor_transfer as tt
from objreg.experiments.base import Setting

LRS = (4e-3, 2e-3, 1e-3, 5e-4)


def synthetic_runs(lrs, second_error_power: float, steps: int = 5, seed: int = 0):
    """Records whose first-order error is exactly ``b_t η²`` and whose first+second-order error is
    exactly ``c_t η^power`` at every step ``t``."""
    rng = np.random.default_rng(seed)
    k, b, c = rng.uniform(1, 2, steps), rng.uniform(1, 2, steps), rng.uniform(1, 2, steps)
    runs = []
    for lr in lrs:
        actual = -k * lr
        first = actual + b * lr**2
        second = -b * lr**2 + c * lr**second_error_power
        runs.append({"first": first.tolist(), "second": second.tolist(), "actual": actual.tolist(),
                     "loss": [3.0] * steps})
    return runs, c


def test_log_slope_is_the_least_squares_slope():
    rng = np.random.default_rng(1)
    x, y = rng.uniform(0.1, 1, 7), rng.uniform(0.1, 1, 7)
    assert tt.log_slope(x, y) == pytest.approx(np.polyfit(np.log(x), np.log(y), 1)[0], rel=1e-12)


def test_measure_recovers_exact_powers_and_confirms():
    runs, c = synthetic_runs(LRS, 3.0)
    figures = tt.measure(LRS, runs, seed=0)
    assert figures["slope"]["first_order"]["per_step"] == pytest.approx([2.0] * 5, abs=1e-9)
    assert figures["slope"]["first_plus_second_order"]["per_step"] == pytest.approx([3.0] * 5, abs=1e-9)
    assert figures["slope"]["first_plus_second_order"]["whole_run"] == pytest.approx(3.0, abs=1e-9)
    # The error at each rate and step, computed here in a loop.
    for i, lr in enumerate(LRS):
        for t in range(5):
            assert figures["error"]["first_plus_second_order"]["per_step"][i][t] == pytest.approx(c[t] * lr**3)
    smallest = min(LRS)
    expected = abs(sum(c) * smallest**3) / abs(sum(-runs[-1]["actual"][t] for t in range(5)))
    assert figures["relative_error_at_smallest_lr"] == pytest.approx(expected)
    verdict, reason = tt.seed_verdict(figures)
    assert verdict == "confirmed" and "3.00" in reason
    json.dumps(figures, allow_nan=False)


def test_an_error_of_order_two_refutes():
    figures = tt.measure(LRS, synthetic_runs(LRS, 2.0)[0], seed=0)
    assert figures["slope"]["first_plus_second_order"]["mean"] == pytest.approx(2.0, abs=1e-9)
    assert tt.seed_verdict(figures)[0] == "refuted"


def test_errors_at_the_rounding_floor_are_inconclusive():
    runs, _ = synthetic_runs(LRS, 3.0)
    figures = tt.measure(LRS, runs, seed=0)
    figures["smallest_error_in_rounding_units"] = 10.0
    assert tt.seed_verdict(figures)[0] == "inconclusive"


def test_a_poor_fit_at_the_smallest_rate_is_not_confirmed():
    runs, _ = synthetic_runs(LRS, 3.0)
    figures = tt.measure(LRS, runs, seed=0)
    figures["relative_error_at_smallest_lr"] = 0.2
    assert tt.seed_verdict(figures)[0] == "inconclusive"


TINY = tt.Config(lrs=(1e-3, 5e-4), steps=2, batch_size=4, seq_len=48, eval_size=8, head_warmup_steps=5,
                 head_fit_size=16)


@pytest.mark.e2e
def test_a_tiny_run_scales_as_the_taylor_remainder_and_repeats(tmp_path):
    first = tt._run(TINY, Setting(quick=True, seed=0, out_dir=tmp_path, device="cpu"))
    figures = first.figures
    # Nothing here was written in: the fitted orders come out of the analyzer's records.
    assert 1.7 < figures["slope"]["first_order"]["mean"] < 2.3
    assert 2.5 < figures["slope"]["first_plus_second_order"]["mean"] < 3.5
    errors = np.array(figures["error"]["first_plus_second_order"]["per_step"])
    assert (errors[1:] < errors[:-1]).all()  # smaller rate, smaller error, at every step
    assert first.plots and (tmp_path / "taylor-transfer.png").is_file()
    json.dumps(first.to_dict(), allow_nan=False)
    again = tt._run(TINY, Setting(quick=True, seed=0, device="cpu"))
    assert again.figures == figures


def test_the_committed_head_is_named_to_the_analyzer(stopping_analyze):
    calls = stopping_analyze(tt)
    with pytest.raises(RuntimeError, match="analyze called"):
        tt._run(tt.QUICK, Setting(quick=True, seed=0, device="cpu"))
    assert [c["downstream_head"] for c in calls] == ["frozen"] and tt.FULL.downstream_head == "frozen"
