"""The screen's signals from a hand-made trajectory, each against its definition worked by hand."""

from __future__ import annotations

import math

import pytest

from objreg.analysis.records import FirstOrderRecord
from objreg.analysis.run.screen_signals import SIGNALS, Trajectory, gaps, lookahead_drops, signals


def probe(step, dstar, drop, curvature=None, alignment=1.0, g=1.0, grad=1.0, norm=1.0):
    return FirstOrderRecord(step=step, downstream_loss=dstar, predicted_drop=drop, second_order=curvature,
                            alignment=alignment, downstream_grad_norm=g, gradient_norm=grad, step_norm=norm)


#: Probes at steps 0, 2 and 4 of a 5-step run ending at D* = 1.0.
TRAJECTORY = Trajectory(probes=[probe(0, 2.0, 0.3, 0.1, alignment=6.0, g=2.0, grad=3.0, norm=0.5),
                                probe(2, 1.6, 0.2, -0.1, alignment=-2.0, g=1.0, grad=4.0, norm=0.4),
                                probe(4, 1.3, 0.1, 0.0, alignment=0.0, g=1.0, grad=2.0, norm=0.2)],
                        losses=[5.0, 4.0, 3.5, 3.0, 2.0])


def test_each_signal_is_its_definition():
    found = signals(TRAJECTORY, steps=5, final=1.0)
    assert gaps(TRAJECTORY, 5) == [2, 2, 1]
    assert lookahead_drops(TRAJECTORY, 5, 1.0) == pytest.approx([0.2, 0.15, 0.3])
    expected = {
        "score": (0.3 + 0.2 + 0.1) / 3,
        "lookahead": (0.2 + 0.15 + 0.3) / 3,
        "first_order_sum": 0.3 * 2 + 0.2 * 2 + 0.1 * 1,
        "second_order_sum": (0.3 - 0.1) * 2 + (0.2 + 0.1) * 2 + 0.1 * 1,
        "alignment": (6.0 - 2.0 + 0.0) / 3,
        "cosine": (6.0 / 6.0 - 2.0 / 4.0 + 0.0) / 3,
        "step_cosine": (0.3 / 1.0 + 0.2 / 0.4 + 0.1 / 0.2) / 3,
        "speed": ((2.0 - 1.6) + (2.0 - 1.3) + (2.0 - 1.0)) / 3,
        "loss_decrease": (5.0 + 4.0) / 2 - (3.5 + 3.0 + 2.0) / 3,
        "grad_norm": (3.0 + 4.0 + 2.0) / 3,
    }
    assert found == pytest.approx(expected)
    assert set(found) == set(SIGNALS) - {"random"}


def test_without_the_curvature_the_second_order_sum_is_not_a_number():
    plain = Trajectory(probes=[probe(0, 2.0, 0.3), probe(1, 1.8, 0.2)], losses=[1.0, 0.5])
    found = signals(plain, steps=2, final=1.7)
    assert math.isnan(found["second_order_sum"]) and found["first_order_sum"] == pytest.approx(0.5)
    # Every probe at one step: the lookahead's mean is the actual drop per step.
    assert found["lookahead"] == pytest.approx((2.0 - 1.7) / 2)


def test_a_zero_gradient_gives_a_zero_cosine_not_a_division_by_zero():
    still = Trajectory(probes=[probe(0, 1.0, 0.0, alignment=0.0, g=0.0, norm=0.0)], losses=[1.0, 1.0])
    found = signals(still, steps=2, final=1.0)
    assert found["cosine"] == 0.0 and found["step_cosine"] == 0.0


def test_too_short_a_run_is_one_clear_error():
    with pytest.raises(ValueError, match="at least one probe and two steps"):
        signals(Trajectory(probes=[], losses=[1.0, 2.0]), steps=2, final=1.0)
