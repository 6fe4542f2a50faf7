"""The coalition moments kept in bfloat16 (stochastically rounded) or elsewhere, their cost, and
the warning when they outgrow the optimizer's state."""

from __future__ import annotations

import io
import warnings
from pathlib import Path

import pytest
import torch

import objreg
from objreg.analysis.math import costs
from objreg.analysis.math.optimizers import advance, decompose, make_optimizer, players
from objreg.analysis.math.shapley import CoalitionMoments, stochastic_bfloat16
from objreg.core.errors import InvalidParameterError

DOCS = Path(__file__).resolve().parents[3] / "docs"


def test_stochastic_rounding_is_unbiased_and_lands_on_a_neighbour():
    low = torch.tensor(1.0, dtype=torch.bfloat16)
    high = torch.nextafter(low, torch.tensor(2.0, dtype=torch.bfloat16))
    value = float(low) + 0.3 * (float(high) - float(low))  # 30% of the way up
    x = torch.full((200_000,), value, dtype=torch.float32)
    rounded = stochastic_bfloat16(x, torch.Generator().manual_seed(0)).float()
    assert set(rounded.unique().tolist()) == {float(low), float(high)}
    up = float((rounded == float(high)).double().mean())
    assert abs(up - 0.3) < 0.005  # binomial sd ≈ 0.001
    assert abs(float(rounded.double().mean()) - value) < 0.005 * (float(high) - float(low))
    negative = stochastic_bfloat16(-x, torch.Generator().manual_seed(0)).float()
    torch.testing.assert_close(negative, -rounded)


def run_moments(dtype, steps, gradient, beta2=0.999):
    """One objective's (and the empty) moments under a constant gradient, ``steps`` steps."""
    moments = CoalitionMoments(["a", "b"], dtype=dtype)
    g = {"w": gradient}
    for _ in range(steps):
        moments.advance({"a": g, "b": {"w": torch.zeros_like(gradient)}}, ["w"], 0.9, beta2)
    return moments.exp_avg_sq[1]["w"].float()  # coalition {a}


def test_bfloat16_moments_follow_the_exact_second_moment_where_nearest_rounding_stalls():
    gradient = torch.full((4096,), 3e-3)
    steps, beta2 = 3000, 0.999
    exact = (1 - beta2**steps) * 3e-3**2  # v_t of a constant gradient, in closed form
    kept = run_moments(torch.bfloat16, steps, gradient, beta2)
    relative = (kept.double() - exact) / exact
    # Unbiased: the mean over 4,096 independently rounded copies is the exact value; each copy
    # wanders around it by a few of bfloat16's spacings (measured rms 1.7%, 3.3% at 1,000 steps).
    assert float(relative.mean()) == pytest.approx(0.0, abs=2e-3)
    assert float(relative.pow(2).mean().sqrt()) < 0.05
    # Rounded to nearest, each 0.1% increment is below half of bfloat16's spacing: v stalls.
    nearest = torch.zeros(())
    for _ in range(steps):
        nearest = (beta2 * nearest + (1 - beta2) * 3e-3**2).to(torch.bfloat16).float()
    assert float((nearest - exact) / exact) < -0.5


def adam_split(dtype, device=None, steps=30, precision=torch.float32):
    """The Shapley parts of the last of ``steps`` AdamW steps of three objectives on random
    gradients, parameters and gradients in ``precision``, the moments kept in ``dtype``."""
    from objreg.analysis.math.optimizers import adam_settings

    generator = torch.Generator().manual_seed(0)
    params = {"w": torch.nn.Parameter(torch.randn(64, 32, generator=generator, dtype=torch.float64).to(precision)),
              "b": torch.nn.Parameter(torch.randn(32, generator=generator, dtype=torch.float64).to(precision))}
    optimizer = make_optimizer("adamw", list(params.values()), 1e-3)
    names = ["x", "y", "z"]
    moments = CoalitionMoments(players(names, adam_settings(optimizer, params)), dtype=dtype, device=device)
    weights = {"x": 1.0, "y": 0.5, "z": 0.25}
    for _ in range(steps):
        # Drawn in float64 whatever the precision, so every run sees the same gradients.
        gradients = {k: {n: (torch.randn(p.shape, generator=generator, dtype=torch.float64)
                             + (1.0 if k == "x" else -0.5)).to(precision)
                         for n, p in params.items()} for k in names}
        for n, p in params.items():
            p.grad = sum(weights[k] * gradients[k][n] for k in names)
        advance(moments, optimizer, params, weights, gradients)
        split = decompose(optimizer, params, weights, gradients, moments)
        optimizer.step()
    return split.parts


def relative_errors(parts, reference):
    """Per player, ‖part − reference‖ / ‖reference‖ in float64."""
    def flat(p):
        return torch.cat([t.double().flatten() for t in p.values()])
    return {k: float((flat(parts[k]) - flat(reference[k])).norm() / flat(reference[k]).norm()) for k in reference}


def test_bfloat16_moments_against_a_float64_run_of_the_same_steps():
    exact = adam_split(None, precision=torch.float64)
    single = relative_errors(adam_split(None), exact)
    half = relative_errors(adam_split(torch.bfloat16), exact)
    # The decoupled decay part needs no moments: bfloat16 leaves it as float32 has it.
    assert half.pop("weight_decay") == single.pop("weight_decay") < 1e-6
    for player in single:
        # Measured: float32 moments 3e-7 to 5e-7, bfloat16 moments 2.5e-3 to 9.2e-3
        # (docs/performance.md, "Attribution memory and checkpoints").
        assert single[player] < 1e-5, (player, single[player])
        assert 1e-4 < half[player] < 0.03, (player, half[player])


def test_moments_kept_on_another_device_are_the_same_numbers():
    torch.testing.assert_close(adam_split(torch.float64, "cpu"), adam_split(torch.float64), rtol=0, atol=0)


def test_bfloat16_moments_resume_to_the_uninterrupted_run():
    def advance_steps(moments, start, count):
        generator = torch.Generator().manual_seed(start)
        for _ in range(count):
            g = {"w": torch.randn(100, generator=generator)}
            moments.advance({"a": g, "b": {"w": -g["w"]}}, ["w"], 0.9, 0.999)

    whole = CoalitionMoments(["a", "b"], dtype=torch.bfloat16)
    advance_steps(whole, 0, 3)
    buffer = io.BytesIO()
    torch.save(whole.state_dict(), buffer)
    resumed = CoalitionMoments(["a", "b"], dtype=torch.bfloat16)
    resumed.load_state_dict(torch.load(io.BytesIO(buffer.getvalue()), weights_only=True))
    advance_steps(whole, 3, 2)
    advance_steps(resumed, 3, 2)
    for mask in whole.tracked:
        assert torch.equal(whole.exp_avg[mask]["w"], resumed.exp_avg[mask]["w"])
        assert torch.equal(whole.exp_avg_sq[mask]["w"], resumed.exp_avg_sq[mask]["w"])


@pytest.mark.parametrize("options, message", [
    ({"dtype": torch.float16}, "smallest normal number; use torch.bfloat16"),
    ({"dtype": torch.int8}, "dtype must be None, torch.float32"),
    ({"device": "nowhere"}, "device must be a torch.device"),
])
def test_bad_storage_is_refused(options, message):
    with pytest.raises(InvalidParameterError, match=message):
        CoalitionMoments(["a", "b"], **options)


def test_costs_are_two_tensors_per_tracked_coalition():
    assert [costs.moment_tensors(n) for n in (2, 3, 4, 5)] == [4, 12, 28, 60]
    sizes = costs.attribution_bytes(1_000_000_000, 4)
    assert sizes["moments"] == 28 * 4 * 10**9 and sizes["optimizer"] == 2 * 4 * 10**9
    assert sizes["checkpoint"] == (1 + 2 + 28) * 4 * 10**9
    assert costs.attribution_bytes(10**9, 4, moments_dtype=torch.bfloat16)["moments"] == 28 * 2 * 10**9


def test_the_documented_table_is_the_computed_one():
    assert costs.cost_table() in (DOCS / "performance.md").read_text(encoding="utf-8")


def test_the_warning_says_when_the_moments_outgrow_the_optimizers_state():
    big = 10**9
    message = costs.moments_warning(big, 3, torch.float32)
    assert "12 parameter-sized tensors" in message and "6× the optimizer's own state" in message
    assert "moments_dtype=torch.bfloat16" in message and 'moments_device="cpu"' in message
    assert costs.moments_warning(big, 2, torch.float32) is None  # 2× Adam's state
    assert costs.moments_warning(big, 3, torch.float32, torch.bfloat16) is None  # 3×
    assert costs.moments_warning(big, 3, torch.float32, elsewhere=True) is None
    assert costs.moments_warning(10**6, 4, torch.float32) is None  # under the floor


def test_a_probe_under_adam_warns_once_made(monkeypatch):
    monkeypatch.setattr(costs, "WARNING_FLOOR", 0)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    loss = lambda m, b: m(b).pow(2).sum(1)  # noqa: E731
    objectives = {"a": loss, "b": loss, "c": loss}
    with pytest.warns(UserWarning, match="12 parameter-sized tensors"):
        objreg.TransferProbe(model, objectives, loss, optimizer, eval_batches=torch.ones(2, 4))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        objreg.TransferProbe(model, objectives, loss, optimizer, eval_batches=torch.ones(2, 4),
                             moments_dtype=torch.bfloat16)
