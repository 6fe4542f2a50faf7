"""D's resolution: float64's where the model computes in float64, float32's where it rounds an
intermediate to float32 (as Hugging Face's T5 and Llama do in their norms), measured by fitting
a smooth curve through D along a tiny random segment."""

from __future__ import annotations

import torch
from torch import nn

from objreg.analysis.math.downstream import Downstream
from objreg.analysis.math.functional import CallableLoss
from objreg.analysis.math.resolution import downstream_resolution


def _downstream(in_float32):
    generator = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4)).double()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=generator, dtype=p.dtype))
    x = torch.randn(64, 8, generator=generator, dtype=torch.float64)
    y = torch.randn(64, 4, generator=generator, dtype=torch.float64)

    def loss(m, batch):
        inputs, targets = batch
        hidden = m[1](m[0](inputs))
        if in_float32:  # an intermediate rounded to float32 whatever the parameters' dtype
            hidden = hidden.float().double()
        return ((m[2](hidden) - targets) ** 2).mean(-1)

    downstream = Downstream.of_batches(CallableLoss("d", loss), [(x[:32], y[:32]), (x[32:], y[32:])])
    downstream.shared = tuple(n for n, _ in model.named_parameters())
    return downstream, model


def test_the_resolution_of_a_float64_model_is_float64s():
    downstream, model = _downstream(in_float32=False)
    value = downstream.loss(model)
    resolution = downstream_resolution(downstream, model, torch.Generator().manual_seed(7))
    assert 0 <= resolution < 1e-14 * value


def test_a_model_rounding_to_float32_inside_has_float32s_resolution():
    downstream, model = _downstream(in_float32=True)
    value = downstream.loss(model)
    resolution = downstream_resolution(downstream, model, torch.Generator().manual_seed(7))
    # float32's unit roundoff is 6e-8: one evaluation's error is a few 1e-9 to 1e-7 of D.
    assert 1e-10 * value < resolution < 1e-6 * value
    assert downstream_resolution(downstream, model, torch.Generator().manual_seed(7)) == resolution  # seeded
    # The parameters are left as they were.
    assert downstream.loss(model) == value
